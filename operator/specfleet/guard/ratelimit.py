"""More than maxActionsPerHour actions latch speculation off (Flapping) until the next revision."""

from __future__ import annotations

from datetime import datetime, timedelta

from specfleet.api.status import (
    DecisionReason,
    KillSwitchState,
    KillSwitchStatus,
    SpeculationSource,
)
from specfleet.guard.actions import Action, ActionKind
from specfleet.guard.situation import Tick

HOUR = timedelta(hours=1)


def limit(tick: Tick) -> None:
    situation, guard = tick.situation, tick.guard
    recent = [t for t in guard.action_times if situation.now - datetime.fromisoformat(t) < HOUR]
    if len(recent) < len(guard.action_times):
        guard.action_times = recent
    most = situation.policy.guard.max_actions_per_hour
    if len(recent) <= most or guard.flapping:
        return
    guard.flapping = True
    message = (
        f"{len(recent)} actions in the last hour (limit {most}): speculation latched off "
        "until the next revision."
    )
    tick.actions.append(
        Action(
            action=ActionKind.FLAPPING,
            reason=DecisionReason.FLAPPING,
            message=message,
            evidence={"actions": len(recent)},
        )
    )
    if situation.policy.k and not situation.policy.guard.dry_run:
        tick.kill_switch = KillSwitchStatus(
            state=KillSwitchState.ENGAGED,
            source=SpeculationSource.GUARD,
            since=tick.stamp,
            reason=message,
        )
