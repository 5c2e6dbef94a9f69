"""Status from plan and observed children: conditions, phase, stable transition times."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from conftest import specmodel_doc
from specfleet.api import SpecModelStatus, parse_specmodel
from specfleet.api.status import KillSwitchStatus
from specfleet.render import render
from specfleet.tick.children import APPLIED_HASH, changes, summary, with_applied_hash
from specfleet.tick.events import transitions
from specfleet.tick.observed import Observed, Rollout, observe, rollout, unschedulable
from specfleet.tick.plan import plan
from specfleet.tick.status import invalid_status, next_status

NOW = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)
LATER = NOW + timedelta(minutes=5)


def deployment(
    replicas: int = 2,
    updated: int = 2,
    available: int = 2,
    speculation: str = "on",
    conditions: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    return {
        "kind": "Deployment",
        "metadata": {"name": "m", "generation": 3},
        "spec": {
            "replicas": replicas,
            "template": {"metadata": {"labels": {"specfleet.dev/speculation": speculation}}},
        },
        "status": {
            "observedGeneration": 3,
            "replicas": replicas,
            "updatedReplicas": updated,
            "readyReplicas": available,
            "availableReplicas": available,
            "conditions": conditions or [],
        },
    }


def status_for(observed: Observed, previous: SpecModelStatus | None = None, **spec: Any) -> Any:
    sm = parse_specmodel(specmodel_doc(**spec))
    previous = previous or SpecModelStatus()
    return next_status(sm, plan(sm, previous, NOW), observed, previous, NOW)


def conditions(status: Any) -> dict[str, tuple[str, str]]:
    return {c.type: (c.status, c.reason) for c in status.conditions}


def test_complete_rollout_is_ready() -> None:
    status = status_for(Observed(fleet=rollout(deployment())), speculative={"method": "ngram"})
    assert status.phase == "Ready"
    assert conditions(status)["Ready"] == ("True", "Available")
    assert conditions(status)["SpeculationActive"] == ("True", "Enabled")
    assert status.speculation == "ngram/4" and status.speculation_active is True
    assert status.replicas.available == 2 and status.observed_generation == 1


def test_partial_rollout_is_progressing() -> None:
    status = status_for(Observed(fleet=rollout(deployment(updated=1, available=2))))
    assert status.phase == "Progressing"
    assert conditions(status)["Progressing"] == ("True", "RollingOut")


def test_no_deployment_yet_is_progressing() -> None:
    assert status_for(Observed()).phase == "Progressing"


def test_progress_deadline_is_degraded_with_the_deployments_message() -> None:
    stuck = deployment(
        updated=1,
        available=1,
        conditions=[
            {
                "type": "Progressing",
                "status": "False",
                "reason": "ProgressDeadlineExceeded",
                "message": 'ReplicaSet "m-abc" has timed out progressing.',
            }
        ],
    )
    status = status_for(Observed(fleet=rollout(stuck)))
    assert status.phase == "Degraded"
    degraded = next(c for c in status.conditions if c.type == "Degraded")
    assert degraded.reason == "ProgressDeadlineExceeded" and "timed out" in degraded.message


def test_unschedulable_pod_says_why() -> None:
    pod = {
        "metadata": {"name": "m-1"},
        "status": {
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "0/4 nodes are available: 4 Insufficient nvidia.com/gpu.",
                }
            ]
        },
    }
    watched = {("Deployment", "m"): deployment(available=0, updated=2)}
    status = status_for(observe("m", watched, [pod]))
    degraded = next(c for c in status.conditions if c.type == "Degraded")
    assert degraded.reason == "Unschedulable" and "Insufficient nvidia.com/gpu" in degraded.message
    assert degraded.message == unschedulable([pod]) and degraded.message.startswith("pod m-1 ")


def test_the_watched_deployments_are_observed_by_name() -> None:
    """`observe`, the operator's one reader of the watched JSON: the engine Deployment, a
    trial's canary and a canary rollout's, each typed; what is not there is not seen."""
    canary = deployment(replicas=1, updated=1, available=1)
    stuck = deployment(replicas=1, updated=1, available=0, speculation="off")
    service = {"kind": "Service", "metadata": {"name": "m"}}
    watched = {
        ("Deployment", "m"): deployment(),
        ("Deployment", "m-canary"): canary,
        ("Deployment", "m-rollout"): stuck,
        ("Service", "m"): service,
    }
    seen = observe("m", watched, [])
    assert seen == Observed(
        fleet=rollout(deployment()), canary=rollout(canary), rollout=rollout(stuck)
    )
    assert seen.fleet.complete and seen.canary.complete and seen.canary.speculation_running
    assert not seen.rollout.complete and seen.rollout.speculation_running is False
    assert seen.rollout.replicas.model_dump() == {
        "desired": 1,
        "updated": 1,
        "ready": 0,
        "available": 0,
    }
    assert observe("m", {("Service", "m"): service}, []) == Observed()
    assert Observed().fleet == Rollout() and Rollout().speculation_running is None


def test_apply_error_is_degraded() -> None:
    status = status_for(Observed(apply_error="API server answered 403 Forbidden"))
    assert conditions(status)["Degraded"] == ("True", "ApplyFailed")


def test_annotation_kill_switch_shows_in_status() -> None:
    doc = specmodel_doc(speculative={"method": "ngram"})
    doc["metadata"]["annotations"] = {"specfleet.dev/kill-switch": "engage"}
    sm = parse_specmodel(doc)
    status = next_status(sm, plan(sm, SpecModelStatus(), NOW), Observed(), SpecModelStatus(), NOW)
    assert status.kill_switch.state == "engaged" and status.kill_switch.source == "annotation"
    assert conditions(status)["SpeculationActive"] == ("False", "DisabledByAnnotation")
    assert status.serving_plan.speculation is False


def test_unchanged_world_gives_an_identical_status() -> None:
    observed = Observed(fleet=rollout(deployment()))
    first = status_for(observed)
    sm = parse_specmodel(specmodel_doc())
    again = next_status(sm, plan(sm, first, LATER), observed, first, LATER)
    assert again.to_wire() == first.to_wire()


def test_transition_time_moves_only_when_status_changes() -> None:
    first = status_for(Observed(fleet=rollout(deployment(updated=1))))
    sm = parse_specmodel(specmodel_doc())
    seen = Observed(fleet=rollout(deployment()))
    later = next_status(sm, plan(sm, first, LATER), seen, first, LATER)
    times = {c.type: c.last_transition_time for c in later.conditions}
    assert times["Ready"] == LATER.isoformat()
    assert times["Degraded"] == NOW.isoformat()


def test_invalid_status_names_fields_and_keeps_other_conditions() -> None:
    good = status_for(Observed(fleet=rollout(deployment())))
    invalid = invalid_status(2, ["spec.x: bad"], good, LATER)
    assert invalid.phase == "Invalid"
    assert conditions(invalid)["Degraded"] == ("True", "InvalidSpec")
    assert "SpeculationActive" in conditions(invalid)
    assert invalid.revisions == good.revisions


def test_events_for_new_revision_plan_flip_and_degradation() -> None:
    before = status_for(Observed(fleet=rollout(deployment())), speculative={"method": "ngram"})
    doc = specmodel_doc(speculative={"method": "ngram"})
    doc["metadata"]["annotations"] = {"specfleet.dev/kill-switch": "engage"}
    sm = parse_specmodel(doc)
    after = next_status(sm, plan(sm, before, LATER), Observed(apply_error="boom"), before, LATER)
    reasons = {e.reason for e in transitions(before, after)}
    assert {"SpeculationDisabled", "ApplyFailed"} <= reasons
    assert "RevisionCreated" in {e.reason for e in transitions(SpecModelStatus(), before)}


def test_children_changes_apply_only_what_differs_and_prune_the_rest() -> None:
    desired = [
        with_applied_hash({"kind": "ConfigMap", "metadata": {"name": "a"}, "data": {"k": "1"}}),
        with_applied_hash({"kind": "Service", "metadata": {"name": "b"}, "spec": {}}),
    ]
    live = {
        ("ConfigMap", "a"): desired[0],
        ("Service", "b"): {
            "kind": "Service",
            "metadata": {"name": "b", "annotations": {APPLIED_HASH: "old"}},
        },
        ("PodDisruptionBudget", "c"): {"kind": "PodDisruptionBudget", "metadata": {"name": "c"}},
    }
    todo = changes(desired, live)
    assert [m["kind"] for m in todo.apply] == ["Service"]
    assert [b["kind"] for b in todo.prune] == ["PodDisruptionBudget"]
    assert (
        changes(desired, {("ConfigMap", "a"): desired[0], ("Service", "b"): desired[1]}).apply == []
    )


def test_child_summaries_decide_like_the_whole_objects() -> None:
    """The operator indexes summaries of its children; rollout, apply and prune must not notice."""
    sm = parse_specmodel(specmodel_doc(speculative={"method": "ngram"}))
    desired = [with_applied_hash(m) for m in render(sm)]
    live = {}
    for manifest in desired:
        metadata = {**manifest["metadata"], "generation": 3, "managedFields": [{"m": 1}]}
        whole = {**manifest, "metadata": metadata}
        live[(manifest["kind"], manifest["metadata"]["name"])] = whole
    deployment_key = next(k for k in live if k[0] == "Deployment")
    live[deployment_key] = {**live[deployment_key], "status": deployment(1, 1, 1)["status"]}
    live[("ConfigMap", "stale")] = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "stale", "namespace": "ns"},
        "data": {},
    }
    summaries = {k: summary(v) for k, v in live.items()}

    assert rollout(summaries[deployment_key]) == rollout(live[deployment_key])
    assert rollout(summaries[deployment_key]).complete
    assert changes(desired, summaries).apply == changes(desired, live).apply == []
    assert [b["metadata"]["name"] for b in changes(desired, summaries).prune] == ["stale"]
    assert all("managedFields" not in b["metadata"] for b in summaries.values())
    assert "containers" not in str(summaries[deployment_key])


def test_a_trial_shows_its_canary_in_status_conditions_and_events() -> None:
    sm = parse_specmodel(specmodel_doc(speculative={"method": "ngram"}, pod={"replicas": 2}))
    engaged = status_for(
        Observed(fleet=rollout(deployment(speculation="off"))),
        SpecModelStatus(kill_switch=KillSwitchStatus(state="engaged", source="guard")),
        speculative={"method": "ngram"},
        pod={"replicas": 2},
    )
    trial = engaged.model_copy(
        update={"kill_switch": KillSwitchStatus(state="trial", source="guard")}
    )
    fleet = deployment(speculation="off")
    starting = next_status(sm, plan(sm, trial, NOW), Observed(fleet=rollout(fleet)), trial, NOW)
    assert starting.canary is not None and starting.canary.state == "Starting"
    assert (starting.canary.deployment, starting.canary.ready_since) == ("m-canary", None)
    assert conditions(starting)["SpeculationActive"] == ("False", "CanaryTrial")
    assert starting.speculation_active is False and starting.serving_plan.speculation is False
    assert starting.phase == "Ready"  # the fleet serves; the canary is extra
    assert [e.reason for e in transitions(engaged, starting)] == ["CanaryCreated"]
    canary = deployment(replicas=1, updated=1, available=1)
    seen = Observed(fleet=rollout(fleet), canary=rollout(canary))
    serving = next_status(sm, plan(sm, starting, LATER), seen, starting, LATER)
    assert serving.canary is not None and serving.canary.state == "Serving"
    assert serving.canary.ready_since == LATER.isoformat()
    assert [e.reason for e in transitions(starting, serving)] == ["CanaryServing"]
    later = LATER + timedelta(minutes=1)
    again = next_status(sm, plan(sm, serving, later), seen, serving, later)
    assert again.canary == serving.canary  # ready since it first was
    released = again.model_copy(
        update={"kill_switch": KillSwitchStatus(state="released", source="guard")}
    )
    done = next_status(sm, plan(sm, released, later), seen, released, later)
    assert done.canary is None and done.serving_plan.speculation is True
    assert "CanaryRemoved" in {e.reason for e in transitions(again, done)}
