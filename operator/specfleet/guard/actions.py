"""What the guard does: its actions' names, which of them change what runs, and the record of
one action with the evidence behind it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from specfleet.api.status import DecisionReason
from specfleet.guard.verdict import ClassVerdict, Evaluation


class ActionKind(StrEnum):
    KILL_SWITCH_ENGAGED = "kill_switch_engaged"
    KILL_SWITCH_RELEASED = "kill_switch_released"
    TRIAL_STARTED = "trial_started"
    TRIAL_FAILED = "trial_failed"
    ROLLED_BACK = "rolled_back"
    REVISION_PROMOTED = "revision_promoted"
    REVISION_KEPT = "revision_kept"
    QUALITY_BREACH = "quality_breach"
    ALERT = "alert"
    FLAPPING = "flapping"
    METRICS_BLIND = "metrics_blind"
    METRICS_RESTORED = "metrics_restored"
    CLASS_BREACH = "class_breach"
    CLASS_RECOVERED = "class_recovered"
    CLASS_SPECULATION_OFF = "class_speculation_off"
    CLASS_SPECULATION_ON = "class_speculation_on"
    CLASS_TRIAL_STARTED = "class_trial_started"
    CLASS_TRIAL_FAILED = "class_trial_failed"
    ROLLOUT_STEP_PASSED = "rollout_step_passed"
    ROLLOUT_PROMOTED = "rollout_promoted"
    ROLLOUT_ABORTED = "rollout_aborted"


ROLLOUT = frozenset(
    {ActionKind.ROLLOUT_STEP_PASSED, ActionKind.ROLLOUT_PROMOTED, ActionKind.ROLLOUT_ABORTED}
)
"""A canary rollout's steps and end (`guard.rollout`)."""
CLASS_SWITCH = frozenset(
    {
        ActionKind.CLASS_SPECULATION_OFF,
        ActionKind.CLASS_SPECULATION_ON,
        ActionKind.CLASS_TRIAL_STARTED,
        ActionKind.CLASS_TRIAL_FAILED,
    }
)
"""One class's speculation switched by routing (`guard.class_switch`)."""
ACTING = frozenset(
    {
        ActionKind.KILL_SWITCH_ENGAGED,
        ActionKind.KILL_SWITCH_RELEASED,
        ActionKind.TRIAL_STARTED,
        ActionKind.TRIAL_FAILED,
        ActionKind.ROLLED_BACK,
        *ROLLOUT,
        *CLASS_SWITCH,
    }
)
"""The actions that change what runs (unless in a dry run)."""
SCHEDULED = frozenset(
    {
        ActionKind.TRIAL_STARTED,
        ActionKind.TRIAL_FAILED,
        ActionKind.CLASS_TRIAL_STARTED,
        ActionKind.CLASS_TRIAL_FAILED,
        *ROLLOUT,
    }
)
"""Trials come from the backed-off schedule and rollouts from Git; neither counts towards
Flapping (which latches speculation off)."""
COUNTED = ACTING - SCHEDULED
"""The actions the rate limit counts."""
PER_CLASS = frozenset({ActionKind.CLASS_BREACH, ActionKind.CLASS_RECOVERED})
"""One class's state changed (`guard.classes`): named, never acting."""


@dataclass(frozen=True)
class Action:
    action: ActionKind
    reason: DecisionReason
    message: str
    evidence: dict[str, Any] = field(default_factory=dict)
    dry_run: bool = False

    @property
    def acts(self) -> bool:
        return self.action in ACTING and not self.dry_run


def named(evaluation: Evaluation, breaches: Callable[[ClassVerdict], Sequence[str]]) -> list[str]:
    """Each class's breaches, prefixed with the class's name."""
    return [f"{v.name}: {b}" for v in evaluation.classes for b in breaches(v)]
