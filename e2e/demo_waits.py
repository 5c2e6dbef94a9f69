"""How long each step of the demo may take, derived from the guard's own settings, and a wait
that says what it waits for.

The guard needs, at best: a window of Ready pods before it judges (settling), N evaluations in a
row to act, probationSeconds to promote, a cooldown (doubling on failed trials) before a trial.
A budget is that ideal stretched by LOAD_FACTOR, plus pod starts as measured on this machine by
the demo's first rollout: the machine may be a shared 2-core one, where ticks, scrapes and
process starts all run late.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple, TypeVar

from specfleet.api.spec import GuardSpec

LOAD_FACTOR = 3.0
PROGRESS_EVERY_S = 12.0
T = TypeVar("T")


class StepTimeout(TimeoutError):
    pass


def settling(g: GuardSpec) -> float:
    """Ready for one window before the guard judges, then its next tick."""
    return g.window_seconds + g.interval_seconds


def convincing(g: GuardSpec) -> float:
    """A window full of the new behaviour and N evaluations in a row."""
    return g.window_seconds + g.consecutive_breaches * g.interval_seconds


def probation(g: GuardSpec) -> float:
    """probationSeconds, and N good evaluations in a row."""
    return max(g.probation_seconds, g.consecutive_breaches * g.interval_seconds)


class StoryTimes(NamedTuple):
    """When (scenario time, from the pods' start) the story's acceptance changes."""

    collapse: float
    """Code's collapse: a window after the ideal promotion."""
    recover: float
    """Code's recovery: once the kill switch has engaged and the first trial has been judged
    on the low acceptance."""
    tools_collapse: float
    """Tools' collapse (full mode): once the kill switch is typically released (a failed
    trial, the doubled cooldown, a trial) and the fleet, rolled back to speculation, has shown
    code recovered (settling, N windows): routing turns on then."""
    tools_recover: float
    """Tools' recovery: a cooldown after it is routed off, before its first class trial can
    start."""


def story_times(g: GuardSpec) -> StoryTimes:
    collapse = settling(g) + probation(g) + g.window_seconds
    recover = collapse + 2 * convincing(g) + g.cooldown_seconds
    released = recover + 2 * g.cooldown_seconds + 2 * convincing(g)
    tools_collapse = released + settling(g) + convincing(g)
    return StoryTimes(
        collapse, recover, tools_collapse, tools_collapse + convincing(g) + g.cooldown_seconds
    )


@dataclass(frozen=True)
class Budgets:
    guard: GuardSpec
    rollout_s: float
    """A pod start (new pods Ready), as the demo's first rollout measured it."""

    def _stretched(self, ideal: float) -> float:
        """The ideal stretched, and two pod starts: the demo's rollouts replace its two pods one
        at a time (maxSurge 1, maxUnavailable 0)."""
        return LOAD_FACTOR * ideal + 2 * self.rollout_s

    def promotion(self) -> float:
        """From the first pods Ready to revision_promoted (a collapse before it rolls the pods
        once more: twice settling)."""
        g = self.guard
        return self._stretched(2 * settling(g) + probation(g) + g.interval_seconds)

    def not_paying(self) -> float:
        """From a collapse to the guard's answer: kill_switch_engaged, or class_speculation_off
        (a class routed off alone: the same evidence rules)."""
        return self._stretched(convincing(self.guard))

    def abort(self) -> float:
        """From applying a revision that breaks quality to rollout_aborted: its canary pod
        starts, serves an interval, then a window and N evaluations in a row (one when
        decisive)."""
        g = self.guard
        return self._stretched(g.interval_seconds + convincing(g))

    def pool_start(self) -> float:
        """From class_speculation_off to the class on the plain pool: its first pod starts."""
        return self._stretched(self.guard.interval_seconds)

    def class_back(self) -> float:
        """From class_speculation_off to class_speculation_on: the cooldown, then a trial judged
        on the class's share on the fleet; room for one failed trial (the cooldown doubled)."""
        g = self.guard
        return 3 * g.cooldown_seconds + self._stretched(2 * convincing(g))

    def release(self, engaged_to_recovery: float) -> float:
        """From kill_switch_engaged to kill_switch_released, when acceptance recovers
        `engaged_to_recovery` seconds after the engagement: trials before it fail and double
        the cooldown; the first whose canary is Ready after it passes."""
        g = self.guard
        trial = self.rollout_s + convincing(g)
        at, failed, cooling = 0.0, 0, 0.0
        while True:
            cooldown = min(g.cooldown_seconds << failed, g.max_cooldown_seconds)
            at, cooling = at + cooldown, cooling + cooldown
            if at + self.rollout_s >= engaged_to_recovery:
                return cooling + self._stretched(failed * trial + trial)
            at += trial
            failed += 1

    def describe(self) -> str:
        g = self.guard
        return (
            f"interval {g.interval_seconds}s, window {g.window_seconds}s, "
            f"{g.consecutive_breaches} evaluations in a row, probation {g.probation_seconds}s, "
            f"cooldown {g.cooldown_seconds}s; a pod start took {self.rollout_s:.0f}s here"
        )


def summary(status: dict[str, Any], now: datetime | None = None) -> str:
    """The status fields that say how far the guard has come."""
    parts = [f"phase {status.get('phase', '-')}"]
    replicas = status.get("replicas") or {}
    parts.append(f"pods {replicas.get('ready', 0)}/{replicas.get('desired', '?')} ready")
    active = status.get("activeRevision")
    verdict = next(
        (r.get("verdict") for r in status.get("revisions", []) if r.get("number") == active), None
    )
    guard = status.get("guard") or {}
    if verdict == "probation":
        parts.append(
            f"revision {active} on probation since {_clock(guard.get('probationSince'))} "
            f"(good windows {guard.get('qualityGood', 0)}, bad {guard.get('qualityBad', 0)})"
        )
    elif active is not None:
        parts.append(f"revision {active} {verdict}")
    switch = status.get("killSwitch") or {}
    state = switch.get("state", "released")
    if state == "engaged" and switch.get("nextTrialAfter"):
        state += f", next trial after {_clock(switch['nextTrialAfter'])}"
    parts.append(f"kill switch {state}")
    if status.get("canary"):
        parts.append(f"canary {status['canary'].get('state')}")
    classes = status.get("classSpeculation", [])
    off = [c for c in classes if c["state"] != "speculating"]
    if 0 < len(off) < len(classes):  # all off: the kill switch's
        states = ", ".join(f"{c['name']} {c['state']}" for c in off)
        parts.append(f"classes speculating {status.get('classesSpeculating')} ({states})")
    parts.append(
        f"speculation windows bad {guard.get('consecutiveBad', 0)}, "
        f"good {guard.get('consecutiveGood', 0)}"
    )
    parts.append(f"acceptance {status.get('acceptance') or '-'}")
    parts.append(f"last evaluation {_clock(guard.get('lastEvaluation'))}")
    return "; ".join(parts)


def _clock(stamp: str | None) -> str:
    if not stamp:
        return "-"
    return datetime.fromisoformat(stamp).astimezone().strftime("%H:%M:%S")


def wait(
    what: str,
    budget_s: float,
    check: Callable[[], tuple[T | None, dict[str, Any]]],
    say: Callable[[str], None] = print,
    every_s: float = PROGRESS_EVERY_S,
) -> T:
    """Polls `check` (its result, or None, and the SpecModel's status) until it has a result;
    says every `every_s` what it waits for; raises StepTimeout after `budget_s`."""
    start = time.monotonic()
    last_said = start
    while True:
        found, status = check()
        if found is not None:
            return found
        now = time.monotonic()
        waited = now - start
        if waited > budget_s:
            raise StepTimeout(f"no {what} within {budget_s:.0f}s; {summary(status)}")
        if now - last_said >= every_s:
            say(f"  waiting for {what}: {waited:.0f}s of {budget_s:.0f}s; {summary(status)}")
            last_said = now
        time.sleep(min(1.0, every_s))
