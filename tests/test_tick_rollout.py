"""A canary rollout through the whole tick (`tick.step`), window after window: the fleet
stays on the control while the new revision serves on the rollout's pods, then the whole fleet
(promoted) or none of it (aborted)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from argocd_lua import health
from conftest import specmodel_doc
from specfleet.alerts.model import firing
from specfleet.api import ROLLOUT_ANNOTATION, SpecModel, parse_specmodel
from specfleet.api.status import ReplicaStatus
from specfleet.controller.metrics import REGISTRY, record_rollout
from specfleet.render import RenderSettings
from specfleet.telemetry.model import ClassWindow, Observation
from specfleet.tick.events import action_type, transitions
from specfleet.tick.next_tick import DUE_SLACK_SECONDS, Arm, NextTick
from specfleet.tick.observed import Rollout
from test_guard import observe
from test_guard import window as class_window
from test_guard_loop import CLASSES, Loop

GOOD = {"tool_calls_valid": 98.0, "tool_calls_invalid": 2.0, "p95_tpot_seconds": 0.02}


def specmodel(
    k: int = 4,
    replicas: int = 4,
    strategy: str = "canary",
    rollout: dict[str, Any] | None = None,
    **annotations: str,
) -> SpecModel:
    doc = specmodel_doc(
        speculative={"method": "eagle3", "draftModel": "d", "numSpeculativeTokens": k},
        classes=CLASSES,
        defaultClass="chat",
        pod={"replicas": replicas},
        rollout={"strategy": strategy, **(rollout or {})},
    )
    doc["metadata"]["annotations"] = annotations
    return parse_specmodel(doc)


def window(canary: dict[str, float] | None = None, tpot: float = 0.02) -> Observation:
    """The control's window (revision 1, good), the canary's (revision 2) beside it."""
    control = observe(0.8, 0.8, **GOOD)
    beside = replace(observe(0.8, 0.8, tpot=tpot, **(GOOD | (canary or {}))), revision=2)
    return replace(control, canary=beside)


WARM_UP_TICKS = 7
"""A step's first two guard windows (60 s each, a tick every 15 s) less a tick: the canary's
latency is judged from the next one on."""


def started(replicas: int = 4, warm: bool = True) -> Loop:
    """A rollout in its first step; `warm`: past its pods' warm-up, but for the last tick."""
    loop = Loop(specmodel(replicas=replicas))
    loop.tick(*[observe(0.8, 0.8, **GOOD)] * 3)
    loop.change(specmodel(k=3, replicas=replicas))
    if warm:
        loop.tick(*[window()] * WARM_UP_TICKS)
    return loop


def deployments(loop: Loop) -> dict[str, int]:
    assert loop.last is not None
    children = loop.last.children(RenderSettings())
    return {
        m["metadata"]["name"]: m["spec"]["replicas"] for m in children if m["kind"] == "Deployment"
    }


def test_a_new_revision_starts_on_one_pod_beside_the_fleet_on_the_control() -> None:
    loop = started()
    assert loop.last and loop.last.plan.active.number == 1
    assert loop.last.plan.desired.number == 2
    assert deployments(loop) == {"m": 3, "m-rollout": 1}
    assert loop.condition("Progressing") == ("True", "CanaryStep")
    assert loop.condition("RolledBack") == ("False", "ServingDesiredRevision")
    assert loop.status.rollout and loop.status.rollout.step_since is not None


def test_the_tick_says_the_next_one_reads_the_canary_beside_the_control() -> None:
    """What the guard loop reads next (`Step.next_tick`): the control's pods and, while a step
    runs, the canary's (the new revision with the fleet's speculation); once it ended, none."""
    loop = started(warm=False)
    assert loop.last is not None
    guard = loop.specmodel.spec.guard
    due_at = loop.now + timedelta(seconds=guard.interval_seconds - DUE_SLACK_SECONDS)
    expected = NextTick(due_at, guard.window_seconds, Arm(1, True), canary=Arm(2, True))
    assert loop.last.next_tick == expected
    loop.tick(*[window({"p95_tpot_seconds": 0.05}, tpot=0.05)] * 2)
    assert loop.actions == ["rollout_aborted"]
    assert loop.last.next_tick.fleet == Arm(1, True) and loop.last.next_tick.canary is None


def test_a_slow_revision_is_aborted_on_the_canary_and_the_fleet_is_untouched() -> None:
    loop = started(warm=False)
    loop.tick(*[window({"p95_tpot_seconds": 0.05}, tpot=0.05)] * 2)
    assert loop.actions == ["rollout_aborted"]
    assert loop.last and loop.last.plan.active.number == 1 and loop.last.plan.speculation
    assert deployments(loop) == {"m": 4}
    assert [(r.number, r.verdict) for r in loop.status.revisions] == [(1, "probation"), (2, "bad")]
    status, reason = loop.condition("RolledBack")
    assert (status, reason) == ("True", "CanaryAborted")
    [rolled_back] = [c for c in loop.status.conditions if c.type == "RolledBack"]
    assert rolled_back.message.startswith("chat p95TpotSeconds")
    assert loop.status.kill_switch is None or loop.status.kill_switch.state == "released"
    loop.tick(*[observe(0.8, 0.8, **GOOD)] * 3)  # held until Git or the retry annotation
    assert deployments(loop) == {"m": 4}


def test_a_revision_broken_while_the_last_is_on_probation_is_aborted() -> None:
    loop = started(warm=False)
    broken = window({"tool_calls_valid": 80.0, "tool_calls_invalid": 20.0})
    loop.tick(*[broken] * 4)
    assert loop.actions == ["rollout_aborted"]
    [decision] = [d for d in loop.status.decisions if d.action == "rollout_aborted"]
    assert decision.evidence and decision.evidence["breaches"][0]["signal"] == "toolCallValidity"


def test_every_step_passed_promotes_and_the_whole_fleet_rolls() -> None:
    loop = started()
    alike = window({"p95_tpot_seconds": 0.022})  # within the tolerance of the control's 0.02
    loop.tick(*[alike] * 4)
    assert loop.actions == ["rollout_step_passed"]
    assert deployments(loop) == {"m": 2, "m-rollout": 2}
    loop.tick(*[alike] * (WARM_UP_TICKS + 4))  # the second step's pods warm up too
    assert loop.actions == ["rollout_step_passed", "rollout_promoted"]
    assert loop.last and loop.last.plan.active.number == 2
    assert deployments(loop) == {"m": 4}
    assert loop.status.revisions[-1].verdict == "good"
    # later revisions are held to the promoted revision's windows, not the control's
    baseline = loop.status.guard and loop.status.guard.baseline
    assert baseline and baseline.latency["chat"].p95_tpot_seconds == 0.022
    assert loop.condition("Progressing")[1] != "CanaryStep"


def test_a_class_too_thin_on_the_canary_holds_the_step_until_its_evidence_accumulates() -> None:
    """Five requests of chat a window are too few to judge, and the step says so; the step's
    evidence adds up what each tick's window shows that was not counted (a quarter of a window a
    tick), so chat is judged once twenty have served, and the step passes once its sums show
    every share within its limit, well before its deadline."""
    loop = started(warm=False)
    thin = window()
    assert thin.canary is not None
    thin_chat = {**thin.canary.classes, "chat": replace(thin.canary.classes["chat"], requests=5)}
    thin = replace(thin, canary=replace(thin.canary, classes=thin_chat))
    loop.tick(*[thin] * 6)
    rollout = loop.status.rollout
    assert loop.actions == [] and rollout and rollout.step == 1 and rollout.good_windows == 0
    assert rollout.last_analysis and rollout.last_analysis.unjudged == ["chat"]
    assert rollout.evidence and "chat: too few requests on the canary" in rollout.evidence.pending
    assert rollout.evidence.judged["chat"]["requests"] < 20
    ticks = 0
    while "rollout_step_passed" not in loop.actions and ticks < 60:
        loop.tick(thin)
        ticks += 1
    assert "rollout_step_passed" in loop.actions and "rollout_aborted" not in loop.actions
    [decision] = [d for d in loop.status.decisions if d.action == "rollout_step_passed"]
    assert decision.evidence and decision.evidence["goodWindows"] == 3


def test_a_canary_whose_pods_never_become_available_is_aborted_on_its_deadline() -> None:
    loop = started()
    counts = ReplicaStatus(desired=1, updated=1)
    stuck = Rollout(
        counts, deadline_exceeded='ReplicaSet "m-rollout-5d8f" has timed out progressing.'
    )
    watched = loop._observed
    loop._observed = lambda: replace(watched(), rollout=stuck)  # type: ignore[method-assign]
    loop.tick(observe(0.8, 0.8, **GOOD))  # the canary never served: no window of its own
    assert loop.actions == ["rollout_aborted"]
    assert deployments(loop) == {"m": 4}
    assert loop.status.revisions[-1].verdict == "bad"
    [rolled_back] = [c for c in loop.status.conditions if c.type == "RolledBack"]
    assert rolled_back.reason == "CanaryAborted" and "timed out progressing" in rolled_back.message


def test_a_kill_switch_flip_mid_step_starts_the_step_over_on_the_restarted_pods() -> None:
    loop = started()
    loop.tick(window())
    assert loop.status.rollout and loop.status.rollout.good_windows == 1
    collapsed = observe(0.05, 0.05, **GOOD)  # decisive: the switch engages on one window
    loop.tick(replace(collapsed, canary=replace(collapsed, revision=2)))
    assert loop.actions == ["kill_switch_engaged"]
    rollout = loop.status.rollout
    assert rollout and rollout.phase == "Progressing" and rollout.step == 1
    assert (rollout.good_windows, rollout.bad_windows) == (0, 0)
    assert rollout.step_since == loop.now.isoformat()  # the pods without speculation serving
    assert deployments(loop) == {"m": 3, "m-rollout": 1}


def test_the_gauges_show_the_running_step_and_its_canary_pods_and_0_after() -> None:
    def value(gauge: str) -> float | None:
        return REGISTRY.get_sample_value(gauge, {"namespace": "ns", "specmodel": "m"})

    loop = started()
    loop.tick(*[window()] * 4)
    record_rollout("ns", "m", loop.status.rollout)
    assert (value("specfleet_rollout_step"), value("specfleet_rollout_canary_pods")) == (2, 2)
    loop.tick(*[window()] * (WARM_UP_TICKS + 4))
    record_rollout("ns", "m", loop.status.rollout)
    assert (value("specfleet_rollout_step"), value("specfleet_rollout_canary_pods")) == (0, 0)


def test_the_rollout_annotation_promotes_or_aborts_once_and_is_recorded() -> None:
    loop = started()
    loop.change(specmodel(k=3, **{ROLLOUT_ANNOTATION: "abort"}))
    assert loop.last and loop.last.plan.active.number == 1
    assert [d.action for d in loop.status.decisions][-1] == "rollout_aborted"
    assert "aborted by the specfleet.dev/rollout annotation" in loop.status.decisions[-1].message
    assert loop.status.revisions[-1].verdict == "bad"
    loop.change(specmodel(k=2, **{ROLLOUT_ANNOTATION: "abort"}))  # unchanged: not again
    assert loop.status.rollout and loop.status.rollout.phase == "Progressing"
    loop.change(specmodel(k=2, **{ROLLOUT_ANNOTATION: "promote"}))
    assert loop.last.plan.active.number == 3 and loop.status.revisions[-1].verdict == "good"
    assert [d.action for d in loop.status.decisions][-1] == "rollout_promoted"


def test_a_retry_after_an_abort_serves_the_revision_directly_once_the_strategy_says_so() -> None:
    loop = started(warm=False)
    loop.tick(*[window({"p95_tpot_seconds": 0.05}, tpot=0.05)] * 2)
    assert loop.status.revisions[-1].verdict == "bad"
    loop.change(specmodel(k=3, strategy="direct", **{"specfleet.dev/retry": "1"}))
    loop.tick(*[observe(0.8, 0.8, **GOOD)] * 2)
    assert loop.last and loop.last.plan.active.number == 2
    assert loop.status.revisions[-1].verdict == "probation" and loop.status.rollout is None


def test_strategy_direct_and_one_replica_keep_probation() -> None:
    loop = Loop(specmodel(replicas=1, strategy="direct"))
    loop.change(specmodel(k=3, replicas=1, strategy="direct"))
    assert loop.last and loop.last.plan.active.number == 2 and loop.status.rollout is None


def test_argo_cd_health_is_progressing_during_a_rollout_and_degraded_after_an_abort() -> None:
    loop = started(warm=False)
    doc = {**specmodel_doc(), "status": loop.status.to_wire()}
    assert health(doc)["status"] == "Progressing"
    assert health(doc)["message"].startswith("CanaryStep: canary step 1 of 2")
    loop.tick(*[window({"p95_tpot_seconds": 0.05}, tpot=0.05)] * 2)
    doc = {**specmodel_doc(), "status": loop.status.to_wire()}
    assert health(doc)["status"] == "Degraded"
    assert health(doc)["message"].startswith("CanaryAborted: chat p95TpotSeconds")


def test_an_abort_alerts_naming_the_class_and_signal_and_a_promotion_is_good_news() -> None:
    loop = started(warm=False)
    loop.tick(*[window({"p95_tpot_seconds": 0.05}, tpot=0.05)] * 2)
    alerts = {a.name: a for a in firing("ns", "m", loop.status, datetime.now(UTC))}
    alert = alerts["SpecfleetRolledBack"]
    assert "chat p95TpotSeconds" in alert.summary
    assert alert.evidence["breaches"][0]["signal"] == "p95TpotSeconds"
    assert action_type("rollout_aborted") == "Warning"
    assert action_type("rollout_promoted") == action_type("rollout_step_passed") == "Normal"


def test_each_step_says_when_it_serves_once() -> None:
    loop = Loop(specmodel())
    loop.tick(*[observe(0.8, 0.8, **GOOD)] * 3)
    before = loop.status
    loop.change(specmodel(k=3))
    [event] = [e for e in transitions(before, loop.status) if e.reason == "CanaryStepServing"]
    assert event.message == "revision 2 serves on 1 pod beside revision 1 (step 1 of 2)"
    before = loop.status
    loop.tick(window())
    assert "CanaryStepServing" not in {e.reason for e in transitions(before, loop.status)}


def quiet(canary: dict[str, float] | None = None) -> Observation:
    """A quiet fleet: three requests of each class a window on the control, one on the canary's
    pod, every tool call valid unless `canary` says otherwise."""

    def classes(requests: float, extra: dict[str, float]) -> dict[str, ClassWindow]:
        valid = {"tool_calls_valid": requests, "tool_calls_invalid": 0.0}
        return {name: class_window(0.8, requests, **(valid | extra)) for name in ("code", "chat")}

    control = replace(observe(0.8, 0.8), classes=classes(3.0, {}))
    beside = replace(control, revision=2, classes=classes(1.0, canary or {}))
    return replace(control, canary=beside)


def quiet_rollout(**rollout: Any) -> Loop:
    loop = Loop(specmodel(rollout=rollout))
    loop.tick(*[observe(0.8, 0.8, **GOOD)] * 3)
    loop.change(specmodel(k=3, rollout=rollout))
    return loop


def test_a_quiet_canary_step_undecided_at_its_deadline_is_aborted_and_says_why() -> None:
    """At one request a window of each class the canary is never judged on one window; its
    evidence grows but not to proof by the deadline: the step is aborted (the safe default),
    named StepDeadline in its Event and alert, with what was still unknown."""
    loop = quiet_rollout(stepDeadlineSeconds=300)
    loop.tick(*[quiet()] * 19)
    rollout = loop.status.rollout
    assert loop.actions == [] and rollout and rollout.evidence
    assert (
        rollout.evidence.deadline
        == (datetime.fromisoformat(rollout.evidence.since) + timedelta(seconds=300)).isoformat()
    )
    assert rollout.evidence.pending  # what it still needs, per class
    loop.tick(quiet())
    assert loop.actions == ["rollout_aborted"]
    [decision] = [d for d in loop.status.decisions if d.action == "rollout_aborted"]
    assert decision.reason == "StepDeadline" and decision.evidence
    assert decision.evidence["deadline"] is True and decision.evidence["pending"]
    assert "reached its deadline undecided" in decision.message
    assert loop.status.revisions[-1].verdict == "bad" and deployments(loop) == {"m": 4}
    alerts = {a.name for a in firing("ns", "m", loop.status, loop.now)}
    assert {"SpecfleetStepDeadline", "SpecfleetRolledBack"} <= alerts


def test_a_quiet_step_may_pass_at_its_deadline_when_the_spec_says_so() -> None:
    loop = quiet_rollout(stepDeadlineSeconds=300, onInconclusive="pass")
    loop.tick(*[quiet()] * 20)
    assert loop.actions == ["rollout_step_passed"]
    [decision] = loop.status.decisions[-1:]
    assert decision.reason == "RolloutStepPassed" and "passed unproven" in decision.message
    assert loop.status.rollout and loop.status.rollout.step == 2


def test_a_quiet_canary_that_breaks_tool_calls_is_aborted_on_its_evidence_before_the_deadline() -> (
    None
):
    """Half the canary's tool calls invalid, one request a window: no window holds enough to
    judge, the step's sum does before its deadline."""
    loop = quiet_rollout()
    broken = quiet({"tool_calls_valid": 0.5, "tool_calls_invalid": 0.5})
    ticks = 0
    while "rollout_aborted" not in loop.actions and ticks < 120:
        loop.tick(broken)
        ticks += 1
    assert "rollout_step_passed" not in loop.actions
    [decision] = [d for d in loop.status.decisions if d.action == "rollout_aborted"]
    assert decision.reason == "RolloutAborted"
    assert decision.evidence and decision.evidence["breaches"][0]["signal"] == "toolCallValidity"
    assert ticks * 15 < 1800  # before the default deadline
