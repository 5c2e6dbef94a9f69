"""What the next guard tick reads and when it is due, as the tick states it from the status it
computes (`Step.next_tick`). The shell (`controller.operator.guard_tick`) acts on it from the
status its watch has, without reading status fields of its own. Pure."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import NamedTuple

from specfleet.api import SpecModel, SpecModelStatus
from specfleet.tick import rollouts

DUE_SLACK_SECONDS = 0.5
"""A guard tick a moment early is due: the timer that looks for due SpecModels fires a moment
before the interval has passed as often as after it, and missing by that little would slip the
evaluation by a whole timer period."""


class Arm(NamedTuple):
    """Pods read apart: the revision they run, with or without speculation."""

    revision: int
    speculation: bool


@dataclass(frozen=True)
class NextTick:
    due_at: datetime | None
    """When the guard evaluates next; None: at once (it never has)."""
    window_seconds: int
    fleet: Arm | None
    """The fleet's pods: the serving plan's revision and speculation. None: nothing is planned
    yet, nothing to read."""
    canary: Arm | None = None
    """A canary rollout's pods while a step runs: the new revision, with the fleet's
    speculation. None: the fleet's revision with speculation the other way (a trial's canary,
    if one runs)."""

    def due(self, now: datetime) -> bool:
        return self.due_at is None or now >= self.due_at


def next_tick(specmodel: SpecModel, status: SpecModelStatus) -> NextTick:
    """What the guard tick after `status` reads, and when."""
    guard = specmodel.spec.guard
    last = status.guard.last_evaluation if status.guard else None
    due_at = None
    if last is not None:
        interval = timedelta(seconds=guard.interval_seconds - DUE_SLACK_SECONDS)
        due_at = datetime.fromisoformat(last) + interval
    plan = status.serving_plan
    if plan is None:
        return NextTick(due_at, guard.window_seconds, None)
    canary = None
    if status.rollout is not None and rollouts.canary_pods(status.rollout):
        canary = Arm(status.rollout.revision, plan.speculation)
    return NextTick(due_at, guard.window_seconds, Arm(plan.revision, plan.speculation), canary)
