"""The replay's plain pool: a class set off speculation (`guard.classesOff`, or by the guard
with `guard.routeClasses`) waits on the speculative fleet until the pool the operator sizes has
a pod ready, then the gateways send it there (but a class trial's share); the pool decodes
without speculation at its own load, its readings carry pool="plain" (`Observation.plain`,
apart from the fleet's windows), its pods cost GPUs and its requests count in goodput."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from specfleet.api.status import ClassSpeculationState
from specfleet.render import PlainPool as RenderedPool
from specfleet.scenario import parse_scenario
from specfleet.simulate.control import Operator
from specfleet.simulate.draws import ClassDraw
from specfleet.simulate.fleet import Fleet, PlainPool
from specfleet.simulate.inputs import build_world, load_specmodel_document
from specfleet.simulate.replay import serve
from specfleet.simulate.simulation import Result, simulate
from specfleet.simulate.world import Load, Setting, World
from specfleet.yamlio import InputError

SCENARIOS = Path(__file__).resolve().parent.parent / "examples/scenarios"
SPECMODEL = SCENARIOS / "plain-pool.specmodel.yaml"
OFF_AT, POD_START = 600.0, 15.0  # rollout_seconds 60 over four replicas
"""The example sets creative off at t=600; one pod starts in a replica's part of a rollout."""


def example(**changes: Any) -> World:
    document = yaml.safe_load((SCENARIOS / "plain-pool.yaml").read_text())
    return build_world(load_specmodel_document(SPECMODEL), parse_scenario(document | changes))


@pytest.fixture(scope="module")
def routed() -> Result:
    return simulate(example())


def requests(part: dict[str, Any] | None, name: str) -> int:
    return part[name].requests if part else 0


def test_the_class_waits_on_the_fleet_speculating_while_the_pool_starts(routed: Result) -> None:
    run, base = routed.run, routed.base
    ready = next(i for i, pool in enumerate(run.pools) if pool and pool.ready)
    assert base.time(ready) == OFF_AT + POD_START  # a pod start, as the fleet's pods take
    assert all(pool is None for pool in run.pools[: base.index(OFF_AT)])
    for i in range(base.index(OFF_AT), ready):
        pool = run.pools[i]
        assert pool is not None and pool.pods == 2 and pool.ready == 0 and pool.routed == ()
        assert run.plain[i] is None
        assert run.slices[i]["creative"].requests > 0
        assert run.slices[i]["creative"].draft_tokens > 0  # served with speculation meanwhile


def test_once_ready_the_pool_serves_the_class_without_drafts(routed: Result) -> None:
    run, base = routed.run, routed.base
    ready = base.index(OFF_AT + POD_START)
    for i in range(ready, base.count):
        plain, fleet, pool = run.plain[i], run.slices[i], run.pools[i]
        assert pool is not None and pool.routed == ("creative",) and pool.ready >= 1
        assert plain is not None
        assert fleet["creative"].requests == 0 and plain["code"].requests == 0
        assert plain["creative"].draft_tokens == 0 and plain["creative"].steps == 0
        assert fleet["code"].draft_tokens > 0  # the other class keeps speculating
    served = [s for s in run.plain if s]
    assert sum(s["creative"].requests for s in served) == routed_requests(routed, ready)
    pool = run.pools[-1]  # sized from creative's share of the requests, at most maxReplicas
    assert pool is not None and (pool.pods, pool.ready) == (2, 2)


def routed_requests(result: Result, first: int) -> int:
    """Creative's requests from slice `first` on: what the gateways sent the pool."""
    return sum(
        requests(part, "creative")
        for i in range(first, result.base.count)
        for part in (result.run.slices[i], result.run.plain[i], result.run.canary[i])
    )


def test_the_pools_readings_are_apart_from_the_fleets_the_guard_judges(routed: Result) -> None:
    settled = [t for t in routed.run.ticks if t.t >= OFF_AT + POD_START + 60]
    before = [t for t in routed.run.ticks if t.t <= OFF_AT]
    assert settled and before
    for tick in settled:
        assert tick.plain is not None and not tick.plain.speculation
        assert tick.plain.tpot["creative"] is not None and tick.plain.rates["creative"] is None
        assert set(tick.plain.tpot) == {"creative"}  # the gateways route nothing else there
        assert tick.fleet is not None and tick.fleet.tpot["creative"] is None
        assert tick.observed_rates["creative"] is None  # the guard judged no creative request
        assert tick.observed_rates["code"] is not None
    assert all(tick.plain is None for tick in before)
    # plain decoding beats speculation at α 0.15; the fleet without creative runs lighter
    creative_before = max(t.fleet.tpot["creative"] or 0 for t in before if t.fleet)
    assert max(t.plain.tpot["creative"] or 0 for t in settled if t.plain) < creative_before
    code_before = min(t.fleet.tpot["code"] or 1 for t in before if t.fleet)
    assert max(t.fleet.tpot["code"] or 1 for t in settled if t.fleet) < code_before


def test_the_pools_pods_cost_gpus_and_its_requests_count_in_goodput(routed: Result) -> None:
    run, base = routed.run, routed.base
    assert not routed.acting  # no trial canary, no rollout: the fleet is four pods throughout
    pods = [4 + (pool.pods if pool else 0) for pool in run.pools]
    assert run.goodput.gpu_seconds == base.slice_seconds * sum(pods)
    assert max(pods) == 6 and pods[base.index(OFF_AT) - 1] == 4
    on_fleet = sum(s[n].valid_tokens for s in run.slices for n in s)
    on_pool = sum(s[n].valid_tokens for s in run.plain if s for n in s)
    assert on_pool > 0 and run.goodput.valid_tokens == on_fleet + on_pool
    # the baselines serve beside the same pool: judged on the same pods and routing
    for name in ("always_on", "always_off", "oracle"):
        assert routed.goodput[name].gpu_seconds == run.goodput.gpu_seconds
    assert routed.missed == [] and routed.false_actions == []


def test_the_pool_decodes_plain_at_the_load_of_its_own_pods() -> None:
    """Physics reused: the pool is a plain fleet of its pods serving the routed class alone, and
    the fleet's pods run at the load of what is left."""
    w = example()
    config = w.changes[0].config
    fleet = Fleet(serving=Setting(config, True), plain=PlainPool(2, 0.0, 2, ("creative",)))
    draws = {
        "code": ClassDraw(60, 0.0, 0.0, 0.5, 0.5, 0.5, 0.5, 0.5),
        "creative": ClassDraw(40, 0.0, 0.0, 0.5, 0.5, 0.5, 0.5, 0.5),
    }
    served = serve(w, fleet, 0.0, draws, {"code": 0, "creative": 0}, 0.15)
    assert served.plain is not None
    assert (served.fleet["creative"].requests, served.plain["creative"].requests) == (0, 40)
    assert (served.fleet["code"].requests, served.plain["code"].requests) == (60, 0)
    assert served.gpus == 4 + 2
    lighter = w.conditions(0.0, Setting(config, True), Load.of({"creative": 0.0}))
    assert served.conditions == lighter
    assert lighter.step_seconds < w.conditions(0.0, Setting(config, True)).step_seconds
    alone = yaml.safe_load(SPECMODEL.read_text())
    alone["spec"]["pod"]["replicas"] = 2
    rps = w.scenario.rps(0.0) * w.scenario.classes["creative"].share
    scenario = {
        "duration_s": 600,
        "traffic_rps": rps,
        "classes": {"creative": w.scenario.classes["creative"].model_dump()},
    }
    scenario["classes"]["creative"]["share"] = 1.0
    plain_fleet = build_world(alone, parse_scenario(scenario))
    expected = plain_fleet.conditions(0.0, Setting(plain_fleet.changes[0].config, False))
    tokens = served.plain["creative"].output_tokens
    tpot = served.plain["creative"].tpot_seconds_total / tokens
    assert tpot == pytest.approx(expected.step_seconds)


def test_the_operator_routes_the_class_once_the_pool_has_a_pod() -> None:
    document = load_specmodel_document(SPECMODEL)
    document["spec"]["guard"] = {"classesOff": ["creative"]}
    w = build_world(document, example().scenario)
    specmodel, config = w.changes[0].specmodel, w.changes[0].config
    start = datetime(2026, 1, 1, tzinfo=UTC)
    fleet = Fleet(serving=Setting(config, True))
    operator = Operator.start(specmodel, fleet, start)
    states = {c.name: c.state for c in operator.pools.classes}
    assert states == {"code": ClassSpeculationState.SPECULATING, "creative": "waiting"}
    sized = RenderedPool(replicas=2)  # not routed: no pod is available yet
    assert operator.pools.plain == sized
    starting = fleet.request_plain(operator.pools.plain, 0.0, 60.0, 4)
    operator = operator.reconciled(starting, start)
    assert operator.pools.plain == sized
    assert starting.plain and starting.plain.share("creative") == 0
    ready = starting.advance(POD_START)
    operator = operator.reconciled(ready, start + timedelta(seconds=POD_START))
    assert {c.name: c.state for c in operator.pools.classes}["creative"] == "plain"
    assert operator.pools.plain == RenderedPool(replicas=2, routed=["creative"])
    routed = ready.request_plain(operator.pools.plain, POD_START, 60.0, 4)
    assert routed.plain == PlainPool(2, POD_START, 2, ("creative",))
    assert routed.plain.share("creative") == 1.0 and routed.plain.share("code") == 0.0
    trial = RenderedPool(replicas=2, routed=["creative"], trial={"creative": 0.25})
    on_trial = routed.request_plain(trial, 100.0, 60.0, 4).plain
    assert on_trial and on_trial.share("creative") == 0.75  # the trial's share on the fleet
    assert routed.request_plain(None, 100.0, 60.0, 4).plain is None  # removed at once


def test_a_spec_with_the_class_off_from_the_start_routes_it_from_the_first_slice() -> None:
    document = load_specmodel_document(SPECMODEL)
    document["spec"]["guard"] = {"classesOff": ["creative"]}
    scenario = yaml.safe_load((SCENARIOS / "plain-pool.yaml").read_text())
    scenario |= {"rollouts": [], "duration_s": 300}
    run = simulate(build_world(document, parse_scenario(scenario))).run
    assert all(p is not None and p.share("creative") == 1.0 for p in run.pools)
    assert all(s["creative"].requests == 0 for s in run.slices)


def test_back_on_the_fleet_when_the_class_is_on_again() -> None:
    back = [
        {"t": OFF_AT, "spec": {"guard": {"classesOff": ["creative"]}}},
        {"t": 1200, "spec": {"guard": {"classesOff": []}}},
    ]
    result = simulate(example(rollouts=back))
    run, base = result.run, result.base
    again = base.index(1200)
    assert run.pools[again - 1] is not None and run.pools[again:] == [None] * (base.count - again)
    assert all(p is None for p in run.plain[again:])
    assert all(s["creative"].draft_tokens > 0 for s in run.slices[again:])
    pods = [4 + (pool.pods if pool else 0) for pool in run.pools]
    assert run.goodput.gpu_seconds == base.slice_seconds * sum(pods)
    assert pods[again:] == [4] * (base.count - again)


def test_a_rollout_setting_off_an_unknown_class_is_refused_naming_the_field() -> None:
    patch = [{"t": OFF_AT, "spec": {"guard": {"classesOff": ["poetry"]}}}]
    with pytest.raises(InputError) as raised:
        example(rollouts=patch)
    [problem] = raised.value.problems
    assert problem.startswith("rollouts[0].spec → spec.guard.classesOff: ")
    assert "there is no class poetry" in problem


def test_the_picture_draws_the_pools_tpot_and_its_lane(routed: Result) -> None:
    from specfleet.simulate import plot

    view = plot.Points(routed.run.ticks, routed.truths, 60.0)
    on_pool = [v for v in view.seen("plain", "p95_tpot", "creative") if v == v]
    assert len(on_pool) == sum(1 for t in routed.run.ticks if t.plain)
    assert on_pool and all(v < 0.06 for v in on_pool)  # under creative's p95 TPOT SLO
    lanes = [(pool.pods, pool.ready) for _, _, pool in plot._segments(routed.run.pools) if pool]
    assert lanes[0] == (2, 0) and lanes[-1] == (2, 2)


def test_the_guard_routes_a_class_and_its_trials_serve_a_share_on_the_fleet() -> None:
    """guard.routeClasses: creative, named not paying, goes to the plain pool; each trial sends
    classTrialShare (half) of it back to the speculative fleet, judged there, and fails."""
    document = load_specmodel_document(SPECMODEL)
    document["spec"]["guard"] = {"routeClasses": True}
    scenario = yaml.safe_load((SCENARIOS / "plain-pool.yaml").read_text())
    scenario |= {"rollouts": [], "duration_s": 900}
    result = simulate(build_world(document, parse_scenario(scenario)))
    run = result.run
    kinds = [d["action"] for d in run.decisions]
    assert kinds[:3] == ["class_breach", "class_speculation_off", "class_trial_started"]
    assert "class_trial_failed" in kinds and "kill_switch_engaged" not in kinds
    on_trial = [i for i, pool in enumerate(run.pools) if pool and pool.trial and pool.ready]
    assert on_trial
    fleet = sum(run.slices[i]["creative"].requests for i in on_trial)
    plain = [run.plain[i] for i in on_trial]
    pool = sum(s["creative"].requests for s in plain if s)
    assert fleet == pytest.approx(pool, abs=1)  # evenly spread, no random number drawn
    assert all(run.slices[i]["creative"].draft_tokens > 0 for i in on_trial)
    assert all(s and s["creative"].draft_tokens == 0 for s in plain)
    outside = [i for i, p in enumerate(run.pools) if p and p.ready and not p.trial]
    assert outside and all(run.slices[i]["creative"].requests == 0 for i in outside)
