"""One reconcile with a trial: the canary's children are applied beside the fleet's, judged on
the canary's telemetry, and pruned when the trial ends; the fleet's Deployment is untouched. A
decision is in status before it is acted on."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest
from kubernetes.client.exceptions import ApiException

from conftest import specmodel_doc
from specfleet.api import SpecModelStatus, parse_specmodel
from specfleet.api.status import CanaryState, CanaryStatus, KillSwitchStatus
from specfleet.controller.kube import Kube
from specfleet.controller.reconcile import Live, Outcome, reconcile
from specfleet.render import RenderSettings, ServingPlan, render
from specfleet.telemetry.model import ClassWindow, Observation
from specfleet.tick.children import with_applied_hash
from specfleet.tick.observed import observe
from specfleet.tick.plan import plan
from specfleet.tick.status import next_status
from specfleet.tick.step import GuardTick

NOW = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)
SPEC = {
    "speculative": {"method": "eagle3", "draftModel": "d", "numSpeculativeTokens": 4},
    "classes": [{"name": "code", "critical": True, "slo": {"minAcceptanceRate": 0.5}}],
    "defaultClass": "code",
    "pod": {"replicas": 2},
}


@dataclass
class FakeKube:
    applied: list[dict[str, Any]] = field(default_factory=list)
    deleted: list[tuple[str, str]] = field(default_factory=list)
    events: list[str] = field(default_factory=list)
    named: dict[str, str] = field(default_factory=dict)
    """Events posted by name (a decision's idempotency key): name -> reason."""
    writes: list[str] = field(default_factory=list)
    """Every write in order: "status: <its decisions' actions>", "apply ..." or "delete ..."."""
    refuse_status: bool = False

    def apply(self, manifest: dict[str, Any]) -> None:
        self.applied.append(manifest)
        self.writes.append(f"apply {manifest['kind']}/{manifest['metadata']['name']}")

    def delete(self, api_version: str, kind: str, namespace: str, name: str) -> None:
        self.deleted.append((kind, name))
        self.writes.append(f"delete {kind}/{name}")

    def apply_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        if self.refuse_status:
            raise ApiException(status=403, reason="Forbidden")
        actions = ", ".join(d["action"] for d in status.get("decisions", []))
        self.writes.append(f"status: {actions}")

    def event(
        self,
        involved: dict[str, Any],
        kind: str,
        reason: str,
        message: str,
        name: str | None = None,
    ) -> None:
        if name in self.named:  # the API server's 409: told already
            return
        self.events.append(reason)
        if name is not None:
            self.named[name] = reason

    def event_exists(self, namespace: str, name: str) -> bool:
        return name in self.named


def complete(manifest: dict[str, Any]) -> dict[str, Any]:
    """A child as the watch sees it once the API server and its controller caught up."""
    replicas = manifest.get("spec", {}).get("replicas", 0)
    counts = ("replicas", "updatedReplicas", "readyReplicas", "availableReplicas")
    status = {"observedGeneration": 1, **dict.fromkeys(counts, replicas)}
    metadata = {**manifest["metadata"], "generation": 1}
    return {**manifest, "metadata": metadata, "status": status}


def live(specmodel: Any, serving: ServingPlan) -> Live:
    children = [complete(with_applied_hash(m)) for m in render(specmodel, serving)]
    return Live(children={(c["kind"], c["metadata"]["name"]): c for c in children})


def state(specmodel: Any, kill_switch: str, children: Live, **extra: Any) -> SpecModelStatus:
    """The status a reconcile of the same world wrote a while ago."""
    before = SpecModelStatus(kill_switch=KillSwitchStatus(state=kill_switch, source="guard"))
    earlier = NOW - timedelta(minutes=10)
    status = next_status(
        specmodel,
        plan(specmodel, before, earlier),
        observe("m", children.children, []),
        before,
        earlier,
    )
    return status.model_copy(update=extra)


def body(status: SpecModelStatus) -> dict[str, Any]:
    return {**specmodel_doc(**SPEC), "status": status.to_wire()}


def fleet_without(canary: Observation | None = None) -> Observation:
    """The fleet's window, without speculation, and the canary's beside it."""
    classes = {"code": ClassWindow(requests=200)}
    return Observation(NOW, 60, 1, False, classes, canary=canary)


def trial_due(kube: FakeKube, uid: str | None = None, first: bool = False) -> Outcome:
    """One reconcile of an engaged SpecModel whose trial is due (`uid`: its object's)."""
    specmodel = parse_specmodel(specmodel_doc(**SPEC))
    children = live(specmodel, ServingPlan(speculation=False))
    engaged = state(specmodel, "engaged", children)
    due = KillSwitchStatus(state="engaged", source="guard", next_trial_after=NOW.isoformat())
    the_body = body(engaged.model_copy(update={"kill_switch": due}))
    the_body["metadata"]["uid"] = uid
    return reconcile(
        the_body,
        specmodel,
        children,
        cast(Kube, kube),
        RenderSettings(),
        NOW,
        GuardTick(fleet_without()),
        first=first,
    )


def test_a_trial_applies_the_canary_and_leaves_the_fleet_alone() -> None:
    kube = FakeKube()
    outcome = trial_due(kube)
    assert [a.action for a in outcome.actions] == ["trial_started"]
    assert {m["metadata"]["name"] for m in kube.applied} == {"m-canary", "m-canary-gateway"}
    assert kube.deleted == []
    assert outcome.status.canary and outcome.status.canary.state == CanaryState.STARTING
    assert kube.events == ["CanaryCreated", "TrialStarted", "ChildrenApplied"]


def failing_trial_judged(kube: FakeKube) -> Outcome:
    """One reconcile of a trial whose canary's acceptance collapsed."""
    specmodel = parse_specmodel(specmodel_doc(**SPEC))
    children = live(specmodel, ServingPlan(speculation=False, canary=True))
    since = (NOW - timedelta(minutes=1)).isoformat()
    canary = CanaryStatus(deployment="m-canary", revision=1, state="Serving", ready_since=since)
    trial = state(specmodel, "trial", children, canary=canary)
    drafted = 100 * 200.0
    collapsed = ClassWindow(
        requests=100, draft_tokens=drafted, accepted_tokens=drafted * 0.1, steps=drafted / 4
    )
    window = Observation(NOW, 60, 1, True, {"code": collapsed})
    return reconcile(
        body(trial),
        specmodel,
        children,
        cast(Kube, kube),
        RenderSettings(),
        NOW,
        GuardTick(fleet_without(window)),
    )


def test_a_failing_canary_is_judged_on_its_own_window_and_removed() -> None:
    kube = FakeKube()
    outcome = failing_trial_judged(kube)
    assert [a.action for a in outcome.actions] == ["trial_failed"]
    assert sorted(kube.deleted) == [("ConfigMap", "m-canary-gateway"), ("Deployment", "m-canary")]
    assert kube.applied == []  # the fleet keeps running without speculation, as it did
    assert outcome.status.canary is None and outcome.status.kill_switch
    assert outcome.status.kill_switch.state == "engaged"
    assert kube.events == ["CanaryRemoved", "TrialFailed", "ChildrenApplied"]


def test_a_decision_is_written_to_status_before_it_is_acted_on() -> None:
    kube = FakeKube()
    failing_trial_judged(kube)
    assert kube.writes[0] == "status: trial_failed"
    assert sorted(kube.writes[1:]) == [
        "delete ConfigMap/m-canary-gateway",
        "delete Deployment/m-canary",
    ]


def test_a_decision_whose_status_write_is_refused_is_not_acted_on() -> None:
    """The next reconcile (this leader's or the next's) decides again; acted on unrecorded, the
    canary would be gone while status still runs the trial, and the next leader re-create it."""
    kube = FakeKube(refuse_status=True)
    with pytest.raises(ApiException):
        failing_trial_judged(kube)
    assert kube.writes == [] and kube.events == []
