"""Canary rollouts, as the plan sees them: whether a new revision starts as a canary beside the
fleet, at which step, against which control, and the `specfleet.dev/rollout` override; and the
one editor of a rollout's status (`RolloutStatus`): what the plan starts and steps, what the
canary's Deployment shows (`seen`), what the guard judged (`judged`). Pure.

A rollout runs while the desired revision is on probation, the strategy is canary, a guard
judges (the operator reads Prometheus) and a control exists: the revision the fleet served
before (the active one), not judged bad. The guard judges its steps (`guard.rollout`, which
reads the status and returns its judgement); the plan only starts, continues and ends it. A
kill-switch trial and a rollout never run at once: a rollout waits (no canary pods) while a
trial runs, trials are short (one window to fail, a few to pass); a trial waits for a rollout
(`guard.killswitch`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from specfleet.api import ROLLOUT_ANNOTATION, SpecModel
from specfleet.api.spec import RolloutStrategy
from specfleet.api.status import (
    DecisionReason,
    KillSwitchStatus,
    RevisionRecord,
    RevisionVerdict,
    RolloutPhase,
    RolloutStatus,
    SpecModelStatus,
)
from specfleet.guard.actions import Action, ActionKind
from specfleet.guard.rollout import StepJudgement
from specfleet.tick.observed import Rollout

RUNNING = (RolloutPhase.PROGRESSING, RolloutPhase.WAITING)
OVERRIDES = {"promote": RolloutPhase.PROMOTED, "abort": RolloutPhase.ABORTED}
"""The annotation's values and the phase each ends a rollout in."""
ENDED_VERDICT = {
    RolloutPhase.PROMOTED: RevisionVerdict.GOOD,
    RolloutPhase.ABORTED: RevisionVerdict.BAD,
}


@dataclass(frozen=True)
class Progress:
    """The rollout after the plan, and the override it acted on now (None: none)."""

    rollout: RolloutStatus | None
    overridden: str | None = None


def running(rollout: RolloutStatus | None) -> bool:
    return rollout is not None and rollout.phase in RUNNING


def canary_pods(rollout: RolloutStatus | None) -> int:
    """The rollout canary's pods now (0 while it waits or once it ended)."""
    return rollout.pods if rollout and rollout.phase == RolloutPhase.PROGRESSING else 0


def progress(
    specmodel: SpecModel,
    status: SpecModelStatus,
    desired: RevisionRecord,
    revisions: list[RevisionRecord],
    now: datetime,
    guard_on: bool = True,
) -> Progress:
    previous = status.rollout
    current = previous if previous and previous.revision == desired.number else None
    if not guard_on or not _wanted(specmodel, desired):
        # An ended rollout stays on show while its verdict holds (not after a retry).
        shown = not running(current) and desired.verdict != RevisionVerdict.PROBATION
        return Progress(current if shown else None)
    if not running(current):
        control = _control(status, desired, revisions)
        if control is None:
            return Progress(None)
        current = _started(desired, control, now)
    assert current is not None
    current = _stepped(specmodel, current, status.kill_switch)
    value = specmodel.metadata.annotations.get(ROLLOUT_ANNOTATION)
    if value in OVERRIDES and value != status.rollout_override:
        done = "promoted" if value == "promote" else "aborted"
        message = (
            f"{done} by the {ROLLOUT_ANNOTATION} annotation at step {current.step} of "
            f"{current.steps}"
        )
        return Progress(
            current.model_copy(update={"phase": OVERRIDES[value], "message": message}), value
        )
    return Progress(current)


def override_actions(rollout: RolloutStatus | None, overridden: str | None) -> list[Action]:
    """The override acted on now, as a decision."""
    if rollout is None or overridden is None:
        return []
    promoted = overridden == "promote"
    return [
        Action(
            action=ActionKind.ROLLOUT_PROMOTED if promoted else ActionKind.ROLLOUT_ABORTED,
            reason=DecisionReason.ROLLOUT_PROMOTED if promoted else DecisionReason.ROLLOUT_ABORTED,
            message=f"Revision {rollout.revision} {rollout.message}.",
            evidence={
                "annotation": ROLLOUT_ANNOTATION,
                "value": overridden,
                "revision": rollout.revision,
                "control": rollout.control,
                "step": rollout.step,
            },
        )
    ]


def seen(
    rollout: RolloutStatus | None, speculation: bool, canary: Rollout, now: datetime
) -> RolloutStatus | None:
    """The rollout as its canary's Deployment shows it: the step's windows count from when every
    canary pod of the step is available, and start over when the kill switch flips the canary's
    speculation (its pods restart, and what was judged before was another engine).
    `speculation`: the plan's, which the canary runs."""
    pods = canary_pods(rollout)
    if rollout is None or not pods:
        return rollout
    if rollout.step_since:
        if canary.speculation_running in (None, speculation):
            return rollout
        restart = {"step_since": None, "good_windows": 0, "bad_windows": 0, "evidence": None}
        return rollout.model_copy(update=restart)
    if not canary.complete or canary.replicas.desired != pods:
        return rollout
    if canary.revision_running not in (None, rollout.revision):
        return rollout  # the Deployment still shows the revision this canary replaces
    return rollout.model_copy(update={"step_since": now.isoformat()})


def judged(rollout: RolloutStatus | None, judgement: StepJudgement | None) -> RolloutStatus | None:
    """The rollout as the guard's judgement of its step leaves it (`guard.rollout`)."""
    if rollout is None or judgement is None:
        return rollout
    update: dict[str, object] = {
        "good_windows": judgement.good_windows,
        "bad_windows": judgement.bad_windows,
    }
    if judgement.analysis is not None:
        update["last_analysis"] = judgement.analysis
    if judgement.evidence is not None:
        update["evidence"] = judgement.evidence
    if judgement.passed:
        update |= {
            "step": rollout.step + 1,
            "step_since": None,
            "good_windows": 0,
            "bad_windows": 0,
            "evidence": None,
        }
    if judgement.ended is not None:
        update["phase"] = judgement.ended
    if judgement.message is not None:
        update["message"] = judgement.message
    return rollout.model_copy(update=update)


def control_of(
    rollout: RolloutStatus | None, revisions: list[RevisionRecord]
) -> RevisionRecord | None:
    """The rollout's control, while it may still serve (not judged bad)."""
    if rollout is None:
        return None
    found = next((r for r in revisions if r.number == rollout.control), None)
    return found if found and found.verdict != RevisionVerdict.BAD else None


def _wanted(specmodel: SpecModel, desired: RevisionRecord) -> bool:
    spec = specmodel.spec
    strategy = spec.rollout.resolved_strategy(spec.pod.replicas)
    return desired.verdict == RevisionVerdict.PROBATION and strategy == RolloutStrategy.CANARY


def _control(
    status: SpecModelStatus, desired: RevisionRecord, revisions: list[RevisionRecord]
) -> RevisionRecord | None:
    served = status.active_revision
    if served is None or served == desired.number:
        return None
    found = next((r for r in revisions if r.number == served), None)
    return found if found and found.verdict != RevisionVerdict.BAD else None


def _started(desired: RevisionRecord, control: RevisionRecord, now: datetime) -> RolloutStatus:
    """Step 1; its pods and windows come from the spec (`_stepped`)."""
    return RolloutStatus(
        revision=desired.number,
        control=control.number,
        step=1,
        steps=1,
        pods=1,
        windows=1,
        phase=RolloutPhase.PROGRESSING,
        started=now.isoformat(),
    )


def restepped(
    specmodel: SpecModel, rollout: RolloutStatus | None, kill_switch: KillSwitchStatus | None
) -> RolloutStatus | None:
    """A running rollout after the guard moved it (a step passed): the new step's pods."""
    return _stepped(specmodel, rollout, kill_switch) if rollout and running(rollout) else rollout


def _stepped(
    specmodel: SpecModel, rollout: RolloutStatus, kill_switch: KillSwitchStatus | None
) -> RolloutStatus:
    """The step's pods and windows as the spec says now; waiting while a trial runs."""
    spec = specmodel.spec
    steps = spec.rollout.resolved_steps(spec.pod.replicas, spec.guard.consecutive_breaches)
    number = min(rollout.step, len(steps))
    step = steps[number - 1]
    trial = kill_switch is not None and kill_switch.trial
    phase = RolloutPhase.WAITING if trial else RolloutPhase.PROGRESSING
    message = (
        f"revision {rollout.revision} waits for the kill-switch trial to end before its canary "
        f"starts (the fleet serves revision {rollout.control})"
        if trial
        else f"canary step {number} of {len(steps)}: revision {rollout.revision} on {step.pods} "
        f"of {spec.pod.replicas} pods beside the control, revision {rollout.control}; "
        "kill-switch trials wait for the rollout"
    )
    return rollout.model_copy(
        update={
            "step": number,
            "steps": len(steps),
            "pods": step.pods,
            "windows": step.windows,
            "phase": phase,
            "message": message,
        }
    )
