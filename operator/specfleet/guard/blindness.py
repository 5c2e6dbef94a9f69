"""No data: after blindAfterSeconds the guard raises MetricsBlind and holds the current state
until data is back (a pending judgement's deadline then moves back: `guard.evidence`)."""

from __future__ import annotations

from specfleet.api.status import DecisionReason
from specfleet.guard.actions import ActionKind
from specfleet.guard.situation import Tick


def blind(tick: Tick) -> None:
    situation, guard = tick.situation, tick.guard
    reason = (situation.observation and situation.observation.blind) or "no series"
    silent = (situation.now - tick.silent_since).total_seconds()
    if silent >= situation.policy.guard.blind_after_seconds and not guard.blind:
        guard.blind = True
        tick.act(
            ActionKind.METRICS_BLIND,
            DecisionReason.METRICS_BLIND,
            f"No data for {silent:.0f}s ({reason}); the guard holds the current state.",
            {"silentSeconds": round(silent), "cause": reason},
        )


def data_seen(tick: Tick) -> None:
    if tick.guard.blind:
        silent = (tick.situation.now - tick.silent_since).total_seconds()
        tick.act(
            ActionKind.METRICS_RESTORED,
            DecisionReason.METRICS_RESTORED,
            f"Data is back after {silent:.0f}s; the guard resumes, and a pending judgement's "
            "deadline moves back by the time no window covered.",
            {"silentSeconds": round(silent)},
        )
        tick.guard.blind = False
    tick.guard.last_data = tick.stamp
