"""Kubernetes Events for what changed between two statuses. Reasons are stable: tooling and
alerts match on them."""

from __future__ import annotations

from dataclasses import dataclass

from specfleet.api import SpecModelStatus
from specfleet.api.experiment import SpecExperimentStatus
from specfleet.api.status import CanaryState, ConditionType, DecisionReason
from specfleet.guard.actions import Action, ActionKind

NORMAL, WARNING = "Normal", "Warning"
GOOD_NEWS = frozenset(
    {
        ActionKind.REVISION_PROMOTED,
        ActionKind.CLASS_RECOVERED,
        ActionKind.CLASS_SPECULATION_ON,
        ActionKind.ROLLOUT_STEP_PASSED,
        ActionKind.ROLLOUT_PROMOTED,
        ActionKind.KILL_SWITCH_RELEASED,
        ActionKind.METRICS_RESTORED,
    }
)
"""Guard actions whose Event is Normal (something passed or came back); the others' are
Warnings."""


@dataclass(frozen=True)
class Event:
    type: str
    reason: str
    message: str


def action_type(action: str) -> str:
    """The type of a guard action's Event (its reason is the action's)."""
    return NORMAL if action in GOOD_NEWS else WARNING


def of_reconcile(
    before: SpecModelStatus, after: SpecModelStatus, actions: list[Action]
) -> list[Event]:
    """A reconcile's Events: what changed between the statuses, then each guard action's. A
    change an action tells already is told once, by the action, whose message says why: a
    rollback turns the RolledBack condition True and is the guard's RolledBack action."""
    told = [Event(action_type(a.action), a.reason, a.message) for a in actions]
    said = {(e.type, e.reason) for e in told}
    return [e for e in transitions(before, after) if (e.type, e.reason) not in said] + told


def transitions(before: SpecModelStatus, after: SpecModelStatus) -> list[Event]:
    events = _revision_events(before, after) + _plan_events(before, after)
    events += _canary_events(before, after) + _rollout_events(before, after)
    old = {c.type: c for c in before.conditions}
    for condition in after.conditions:
        previous = old.get(condition.type)
        if previous is not None and previous.status == condition.status:
            continue
        event = _condition_event(
            condition.type, condition.status, condition.reason, condition.message
        )
        if event and (previous is not None or event.type == WARNING):
            events.append(event)
    return events


def _revision_events(before: SpecModelStatus, after: SpecModelStatus) -> list[Event]:
    known = {r.number for r in before.revisions}
    return [
        Event(
            NORMAL,
            "RevisionCreated",
            f"revision {r.number} ({r.hash}) for generation {r.generation}",
        )
        for r in after.revisions
        if r.number not in known
    ]


def _plan_events(before: SpecModelStatus, after: SpecModelStatus) -> list[Event]:
    old, new = before.serving_plan, after.serving_plan
    if new is None or old is None or old.speculation == new.speculation:
        return []
    if new.speculation:
        return [Event(NORMAL, "SpeculationEnabled", f"speculation on (by {new.reason})")]
    return [Event(WARNING, "SpeculationDisabled", f"speculation off (by {new.reason})")]


def _canary_events(before: SpecModelStatus, after: SpecModelStatus) -> list[Event]:
    old, new = before.canary, after.canary
    if new is None:
        return [Event(NORMAL, "CanaryRemoved", f"canary {old.deployment} removed")] if old else []
    if old is None:
        message = f"canary {new.deployment} runs revision {new.revision} with speculation"
        return [Event(NORMAL, "CanaryCreated", message)]
    if old.state != new.state == CanaryState.SERVING:
        return [Event(NORMAL, "CanaryServing", f"canary {new.deployment} takes traffic")]
    return []


def _rollout_events(before: SpecModelStatus, after: SpecModelStatus) -> list[Event]:
    """A canary rollout's step as it starts serving (its end is the guard's decision's Event)."""
    old, new = before.rollout, after.rollout
    if new is None or new.step_since is None:
        return []
    if old and (old.revision, old.step, old.step_since) == (new.revision, new.step, new.step_since):
        return []
    pods = "1 pod" if new.pods == 1 else f"{new.pods} pods"
    message = (
        f"revision {new.revision} serves on {pods} beside revision {new.control} "
        f"(step {new.step} of {new.steps})"
    )
    return [Event(NORMAL, "CanaryStepServing", message)]


def _condition_event(kind: str, status: str, reason: str, message: str) -> Event | None:
    if kind == ConditionType.DEGRADED and status == "True":
        return Event(WARNING, reason, message)
    if kind == ConditionType.READY and status == "True":
        return Event(NORMAL, "RolloutComplete", message)
    if kind == ConditionType.ROLLED_BACK and status == "True":
        # the guard's RolledBack decision's reason: the rollback is told once (`of_reconcile`)
        return Event(WARNING, DecisionReason.ROLLED_BACK, message)
    if kind == ConditionType.ROLLED_BACK and status == "False":
        return Event(NORMAL, "RollbackCleared", message)
    return None


def experiment_transitions(
    before: SpecExperimentStatus, after: SpecExperimentStatus
) -> list[Event]:
    """A SpecExperiment's arms ready, its load tests started or their sample not taken, a
    load test that failed, its conclusion with the recommendation, a measurement gone blind, a
    failure."""
    old = {c.type: c for c in before.conditions}
    events = []
    for condition in after.conditions:
        previous = old.get(condition.type)
        if previous is not None and (previous.status, previous.reason) == (
            condition.status,
            condition.reason,
        ):
            continue
        event = _experiment_event(condition.type, condition.status, condition.reason)
        if event is not None:
            events.append(Event(event[0], event[1], condition.message))
    return events


def _experiment_event(kind: str, status: str, reason: str) -> tuple[str, str] | None:
    if kind == "Concluded" and status == "True":
        return NORMAL, "ExperimentConcluded"
    if kind == "Measured" and status == "False":
        return WARNING, "ExperimentBlind"
    if kind == "CapacitySampled":
        return (NORMAL, "LoadTestsStarted") if status == "True" else (WARNING, reason)
    if kind == "CapacityMeasured" and status == "False":
        return WARNING, reason
    if kind == "Ready" and status == "True":
        return NORMAL, "ArmsReady"
    if kind == "Ready" and reason not in {"ArmsStarting"}:
        return WARNING, reason
    return None
