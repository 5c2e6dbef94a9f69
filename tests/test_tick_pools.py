"""Which classes speculate, and the plain pool that serves the others (`tick.pools`), through
the tick: a class set off moves only once the pool is Ready, and status says so."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import yaml

from conftest import specmodel_doc
from specfleet.api import SpecModel, SpecModelStatus, parse_specmodel
from specfleet.api.status import (
    ClassObservation,
    ClassSwitch,
    GuardStatus,
    KillSwitchStatus,
    ReplicaStatus,
)
from specfleet.render import RenderSettings, revision_hash
from specfleet.tick.observed import Observed, Rollout
from specfleet.tick.step import Step, step

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
READY = Observed(plain=Rollout(replicas=ReplicaStatus(desired=1, updated=1, ready=1, available=1)))


def specmodel(annotations: dict[str, str] | None = None, **spec: Any) -> SpecModel:
    doc = specmodel_doc(
        speculative={"method": "ngram"},
        classes=[{"name": "code"}, {"name": "tools"}, {"name": "chat"}],
        defaultClass="chat",
        pod={"replicas": 4},
        **spec,
    )
    doc["metadata"]["annotations"] = annotations or {}
    return parse_specmodel(doc)


def tick(
    model: SpecModel, observed: Observed | None = None, status: SpecModelStatus | None = None
) -> Step:
    configs = {revision_hash(model.engine_config()): model.engine_config()}
    return step(model, status or SpecModelStatus(), observed or Observed(), None, configs, NOW)


def children(the_step: Step) -> dict[tuple[str, str], dict[str, Any]]:
    return {(m["kind"], m["metadata"]["name"]): m for m in the_step.children(RenderSettings())}


def routed(the_step: Step) -> list[str] | None:
    data = children(the_step)[("ConfigMap", "m-gateway")]["data"]["gateway.yaml"]
    route = yaml.safe_load(data).get("plainPool")
    return route["classes"] if route else None


def states(the_step: Step) -> dict[str, str]:
    return {c.name: c.state for c in the_step.status.class_speculation}


def plain_replicas(the_step: Step) -> int | None:
    deployment = children(the_step).get(("Deployment", "m-plain"))
    return deployment["spec"]["replicas"] if deployment else None


def test_every_class_speculates_and_no_pool_runs_without_an_override() -> None:
    the_step = tick(specmodel())
    assert set(states(the_step).values()) == {"speculating"}
    assert the_step.status.classes_speculating == "3/3"
    assert plain_replicas(the_step) is None and routed(the_step) is None
    assert the_step.status.plain_pool is None


def test_a_class_set_off_waits_on_the_speculative_fleet_until_the_plain_pool_is_ready() -> None:
    the_step = tick(specmodel(guard={"classesOff": ["code"]}))
    assert plain_replicas(the_step) == 2  # 1 class of 3, no traffic seen: a third of 4 pods
    assert routed(the_step) is None
    [code] = [c for c in the_step.status.class_speculation if c.name == "code"]
    assert code.state == "waiting"
    assert "set off by the spec" in code.reason and "m-plain is Ready (0/0" in code.reason
    assert the_step.status.classes_speculating == "3/3"  # still served with speculation


def test_once_the_pool_is_ready_the_class_is_routed_to_it() -> None:
    the_step = tick(specmodel(guard={"classesOff": ["code"]}), READY)
    assert routed(the_step) == ["code"]
    assert states(the_step) == {"code": "plain", "tools": "speculating", "chat": "speculating"}
    assert the_step.status.classes_speculating == "2/3"
    assert the_step.status.plain_pool == READY.plain.replicas
    assert the_step.plan.speculation  # the fleet keeps speculating for the rest


def test_the_pool_is_sized_from_the_routed_classes_share_of_the_traffic_within_bounds() -> None:
    traffic = [
        ClassObservation(name="code", requests=60),
        ClassObservation(name="tools", requests=30),
        ClassObservation(name="chat", requests=10),
    ]
    seen = SpecModelStatus(classes=traffic)
    assert plain_replicas(tick(specmodel(guard={"classesOff": ["code"]}), READY, seen)) == 3
    assert plain_replicas(tick(specmodel(guard={"classesOff": ["chat"]}), READY, seen)) == 1
    bounded = specmodel(guard={"classesOff": ["code"]}, plainPool={"maxReplicas": 2})
    assert plain_replicas(tick(bounded, READY, seen)) == 2
    warm = specmodel(guard={"classesOff": ["chat"]}, plainPool={"minReplicas": 2})
    assert plain_replicas(tick(warm, READY, seen)) == 2


def test_a_warm_pool_runs_while_every_class_speculates_and_serves_none() -> None:
    the_step = tick(specmodel(plainPool={"minReplicas": 1}), READY)
    assert plain_replicas(the_step) == 1 and routed(the_step) is None
    assert the_step.status.classes_speculating == "3/3"


def test_the_annotation_wins_over_the_spec_and_an_empty_one_sets_none_off() -> None:
    spec = {"guard": {"classesOff": ["code"]}}
    annotated = tick(specmodel({"specfleet.dev/classes-off": "tools, chat"}, **spec), READY)
    assert routed(annotated) == ["tools", "chat"]
    [tools] = [c for c in annotated.status.class_speculation if c.name == "tools"]
    assert tools.reason.startswith("set off by the annotation")
    cleared = tick(specmodel({"specfleet.dev/classes-off": ""}, **spec), READY)
    assert routed(cleared) is None and plain_replicas(cleared) is None


def test_every_class_off_is_the_fleet_wide_switch_without_a_pool() -> None:
    the_step = tick(specmodel(guard={"classesOff": ["code", "tools", "chat"]}), READY)
    assert not the_step.plan.speculation and the_step.plan.speculation_source == "spec"
    assert plain_replicas(the_step) is None and routed(the_step) is None
    assert set(states(the_step).values()) == {"plain"}
    assert the_step.status.classes_speculating == "0/3"


def test_with_the_fleets_kill_switch_engaged_nothing_is_routed() -> None:
    engaged = SpecModelStatus(kill_switch=KillSwitchStatus(state="engaged", source="guard"))
    the_step = tick(specmodel(guard={"classesOff": ["code"]}), READY, engaged)
    assert routed(the_step) is None and plain_replicas(the_step) is None
    assert set(states(the_step).values()) == {"plain"}
    [chat] = [c for c in the_step.status.class_speculation if c.name == "chat"]
    assert chat.reason == "the fleet runs without speculation (set by the guard)"


def test_without_speculative_decoding_every_class_is_plain() -> None:
    model = parse_specmodel(specmodel_doc())
    the_step = tick(model)
    assert the_step.status.classes_speculating == "0/1"
    [default] = the_step.status.class_speculation
    assert default.reason == "the spec declares no speculative decoding"


def test_a_routed_pool_keeps_its_pods_when_its_classes_leave_the_fleets_window() -> None:
    serving = Rollout(replicas=ReplicaStatus(desired=3, updated=3, ready=3, available=3))
    gone = SpecModelStatus(classes=[ClassObservation(name="chat", requests=100)])
    model = specmodel(guard={"classesOff": ["code"]})
    assert plain_replicas(tick(model, Observed(plain=serving), gone)) == 3
    bounded = specmodel(guard={"classesOff": ["code"]}, plainPool={"maxReplicas": 2})
    assert plain_replicas(tick(bounded, Observed(plain=serving), gone)) == 2
    assert plain_replicas(tick(specmodel(), Observed(plain=serving), gone)) is None


def switched(*switches: ClassSwitch) -> SpecModelStatus:
    return SpecModelStatus(guard=GuardStatus(class_switches=list(switches)))


OFF = ClassSwitch(
    name="code", since=NOW.isoformat(), reason="not paying", next_trial_after=NOW.isoformat()
)


def test_a_class_the_guard_switched_off_is_routed_like_an_override() -> None:
    the_step = tick(specmodel(guard={"routeClasses": True}), READY, switched(OFF))
    assert routed(the_step) == ["code"]
    [code] = [c for c in the_step.status.class_speculation if c.name == "code"]
    assert code.state == "plain" and code.reason.startswith("set off by the guard: not paying")
    assert the_step.status.classes_speculating == "2/3"
    assert the_step.pools.plain is not None and the_step.pools.plain.trial == {}


def test_a_class_on_the_guards_trial_sends_its_share_back_to_the_fleet() -> None:
    trial = OFF.model_copy(update={"state": "trial"})
    model = specmodel(guard={"routeClasses": True, "classTrialShare": 0.25})
    the_step = tick(model, READY, switched(trial))
    assert routed(the_step) == ["code"]
    assert the_step.pools.plain is not None and the_step.pools.plain.trial == {"code": 0.25}
    data = children(the_step)[("ConfigMap", "m-gateway")]["data"]["gateway.yaml"]
    assert yaml.safe_load(data)["plainPool"]["trial"] == {"code": 0.25}  # the gateways' sample
    assert states(the_step)["code"] == "trial"
    assert the_step.status.classes_speculating == "2/3"  # a trial's class is mostly plain


def test_without_route_classes_the_guards_switches_route_nothing() -> None:
    the_step = tick(specmodel(), READY, switched(OFF))
    assert routed(the_step) is None and set(states(the_step).values()) == {"speculating"}


def test_an_override_decides_and_the_guards_switches_wait() -> None:
    model = specmodel(guard={"routeClasses": True, "mode": "on"})
    the_step = tick(model, READY, switched(OFF))
    assert routed(the_step) is None and set(states(the_step).values()) == {"speculating"}


def test_a_routed_class_seen_on_the_plain_pool_sizes_it_down_as_well_as_up() -> None:
    serving = Rollout(replicas=ReplicaStatus(desired=3, updated=3, ready=3, available=3))
    routed_traffic = SpecModelStatus(
        classes=[
            ClassObservation(
                name="code", requests=10, plain_pool_requests=10, judged_on="plainPool"
            ),
            ClassObservation(name="chat", requests=90),
        ]
    )
    model = specmodel(guard={"classesOff": ["code"]})
    assert plain_replicas(tick(model, Observed(plain=serving), routed_traffic)) == 1


def test_a_class_on_both_pools_in_a_window_is_sized_on_both_its_shares() -> None:
    """The window a class moves in, or a trial's, holds some of it on the fleet's engines and
    the rest on the pool: the pool is sized on the two together, and does not shrink."""
    serving = Rollout(replicas=ReplicaStatus(desired=3, updated=3, ready=3, available=3))
    moving = SpecModelStatus(
        classes=[
            ClassObservation(name="code", requests=5, plain_pool_requests=55),
            ClassObservation(name="chat", requests=40),
        ]
    )
    model = specmodel(guard={"classesOff": ["code"]})
    assert plain_replicas(tick(model, Observed(plain=serving), moving)) == 3
