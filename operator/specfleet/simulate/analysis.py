"""Judging the guard's decisions against the truth: detection latency, false and missed actions.

- An *episode* is a stretch of time in which speculation truly does not pay for what the fleet
  serves (see `truth`). Its detection latency runs from its start to the first
  `kill_switch_engaged` or `trial_failed`; an episode that starts with the kill switch already
  engaged needs no detection.
- A `kill_switch_engaged` / `trial_failed` is false when the truth was never bad (at the
  threshold it was judged against) in the stretch of windows that led to it; a
  `kill_switch_released` is false when the truth is bad at that moment; a `rolled_back` is false
  (or `quality_breach` alert) when the revision did not truly breach a quality limit or a
  latency SLO, and a `rollout_aborted` when its canary's revision did not against the control.
  An episode on a revision that is rolled back is acted on by the rollback.
- Missed: an episode never acted on, a truly bad revision promoted (after probation or on its
  canary).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specfleet.api.spec import GuardSpec
from specfleet.guard.actions import ActionKind
from specfleet.simulate.fleet import fleet_load
from specfleet.simulate.replay import GuardedRun, Timebase
from specfleet.simulate.truth import Truth, revision_breaches, truth_at
from specfleet.simulate.world import Load, World

DETECTIONS = (ActionKind.KILL_SWITCH_ENGAGED, ActionKind.TRIAL_FAILED)


@dataclass(frozen=True)
class Episode:
    start: float
    end: float
    speculation_at_start: bool
    detected_at: float | None
    action: str | None
    requests_per_window: dict[str, float]
    detectable: bool
    """Some class has at least minRequests per window in expectation."""
    critical_breaches: tuple[str, ...] = ()
    """Critical classes truly under their acceptance floor in the episode (`Truth`)."""
    true_speedup: tuple[float, float] | None = None
    """Min and max of the guard's speedup model at the true α and load, over the episode."""
    true_tpot_speedup: tuple[float, float] | None = None
    """Min and max of the simulator's TPOT speedup over the episode."""
    threshold: float = 1.0
    """minSpeedup, the speedup it was judged against."""

    @property
    def latency(self) -> float | None:
        return None if self.detected_at is None else self.detected_at - self.start

    @property
    def rule(self) -> str:
        """What made speculation truly bad: `notPaying` (the true speedup under minSpeedup),
        `criticalFloor` (a critical class under its acceptance floor while speculation pays),
        or `notPayingAndCriticalFloor`."""
        slow = self.true_speedup is not None and self.true_speedup[0] < self.threshold
        if slow and self.critical_breaches:
            return "notPayingAndCriticalFloor"
        return "notPaying" if slow else "criticalFloor"

    def to_json(self) -> dict[str, Any]:
        return {
            "start": self.start,
            "end": self.end,
            "speculationAtStart": self.speculation_at_start,
            "detectedAt": self.detected_at,
            "action": self.action,
            "latencySeconds": self.latency,
            "requestsPerWindow": {k: round(v, 1) for k, v in self.requests_per_window.items()},
            "detectable": self.detectable,
            "rule": self.rule,
            "criticalBreaches": list(self.critical_breaches),
            "trueSpeedup": _span(self.true_speedup),
            "trueTpotSpeedup": _span(self.true_tpot_speedup),
        }


def _span(values: tuple[float, float] | None) -> dict[str, float] | None:
    return None if values is None else {"min": round(values[0], 3), "max": round(values[1], 3)}


def _range(values: list[float | None]) -> tuple[float, float] | None:
    known = [v for v in values if v is not None]
    return (min(known), max(known)) if known else None


class TruthTable:
    """Truth per slice along the guarded run (cached per world segment and revision)."""

    def __init__(self, world: World, run: GuardedRun, base: Timebase) -> None:
        self.world, self.run, self.base = world, run, base
        self._cache: dict[tuple[float, str, Load], Truth] = {}

    def at_slice(self, index: int) -> Truth:
        t = self.base.time(index)
        config, load = self.run.serving[index].config, fleet_load(self.run.pools[index])
        key = (self.world._segment(t), config, load)
        if key not in self._cache:
            self._cache[key] = truth_at(self.world, t, config, load)
        return self._cache[key]

    def bad(self, index: int, threshold: float) -> bool:
        return self.at_slice(index).bad(threshold)


def episodes(table: TruthTable, guard: GuardSpec) -> list[Episode]:
    run = table.run
    flags = [table.bad(i, guard.min_speedup) for i in range(len(run.serving))]
    found, start = [], None
    for i, bad in enumerate([*flags, False]):
        if bad and start is None:
            start = i
        elif not bad and start is not None:
            found.append(_episode(table, guard, start, i))
            start = None
    return found


def _episode(table: TruthTable, guard: GuardSpec, first: int, end: int) -> Episode:
    base, run = table.base, table.run
    start, stop = base.time(first), base.time(end)
    grace = stop + guard.window_seconds
    speculation = run.serving[first].speculation
    revision = table.world.revisions[run.serving[first].config].number
    detection = next(
        (
            d
            for d in run.decisions
            if start <= d["t"] <= grace and (d["action"] in DETECTIONS or _rolled_back(d, revision))
        ),
        None,
    )
    if not speculation:
        detection = None  # already off: nothing to detect
    scenario, load = table.world.scenario, fleet_load(run.pools[first])
    per_window = {
        n: scenario.rps(start) * p.share * load.share(n) * guard.window_seconds
        for n, p in scenario.classes.items()
    }
    truths = [table.at_slice(i) for i in range(first, end)]
    return Episode(
        start=start,
        end=stop,
        speculation_at_start=speculation,
        detected_at=detection["t"] if detection else None,
        action=detection["action"] if detection else None,
        requests_per_window=per_window,
        detectable=max(per_window.values(), default=0.0) >= guard.min_requests,
        critical_breaches=tuple(dict.fromkeys(b for t in truths for b in t.critical_breaches)),
        true_speedup=_range([t.speedup for t in truths]),
        true_tpot_speedup=_range([t.tpot_speedup for t in truths]),
        threshold=guard.min_speedup,
    )


def describe(episode: Episode) -> str:
    """The rule that made speculation truly bad, with the true speedup beside it."""
    floor = f"critical class under its acceptance floor ({'; '.join(episode.critical_breaches)})"
    speedup = f"{_speedups(episode)} {{}} minSpeedup {episode.threshold:g}"
    if episode.rule == "criticalFloor":
        return f"{floor} while speculation pays ({speedup.format('>=')})"
    paying = f"speculation not paying ({speedup.format('<')})"
    return paying if episode.rule == "notPaying" else f"{paying} and {floor}"


def _speedups(episode: Episode) -> str:
    def span(values: tuple[float, float] | None) -> str:
        if values is None:
            return "unknown"
        low, high = values
        return f"{low:.2f}" if round(low, 2) == round(high, 2) else f"{low:.2f}-{high:.2f}"

    return f"true speedup {span(episode.true_speedup)}, TPOT {span(episode.true_tpot_speedup)}"


def _rolled_back(decision: dict[str, Any], revision: int) -> bool:
    return bool(decision["action"] == ActionKind.ROLLED_BACK and decision["revision"] == revision)


def false_actions(table: TruthTable, guard: GuardSpec) -> list[dict[str, Any]]:
    wrong = []
    for decision in table.run.decisions:
        why = _why_false(table, guard, decision)
        if why:
            wrong.append({"t": decision["t"], "action": decision["action"], "why": why})
    return wrong


def _why_false(table: TruthTable, guard: GuardSpec, decision: dict[str, Any]) -> str | None:
    action, t = decision["action"], decision["t"]
    base = table.base
    index = min(base.index(t), len(table.run.serving) - 1)
    if action in DETECTIONS:
        threshold = guard.min_speedup + (
            guard.release_margin if action == ActionKind.TRIAL_FAILED else 0
        )
        span = guard.window_seconds + (guard.consecutive_breaches - 1) * guard.interval_seconds
        first = max(base.index(t - span), 0)
        if not any(table.bad(i, threshold) for i in range(first, max(index, first + 1))):
            return "speculation truly paid throughout the windows that led to it"
    if action == ActionKind.KILL_SWITCH_RELEASED and table.bad(index, guard.min_speedup):
        return "speculation truly did not pay when released"
    quality = action in (ActionKind.ROLLED_BACK, ActionKind.QUALITY_BREACH)
    if quality and not _revision_bad(table, decision):
        return f"revision {decision['revision']} breached no quality limit or latency SLO"
    if action == ActionKind.ROLLOUT_ABORTED and not _revision_bad(table, _canary(decision)):
        return f"revision {decision['evidence']['revision']} breached nothing on its canary"
    return None


def _canary(decision: dict[str, Any]) -> dict[str, Any]:
    """A rollout's decision as about its revision, with its control as the reference."""
    evidence = decision["evidence"]
    return {**decision, "revision": evidence["revision"], "rollbackTarget": evidence["control"]}


def _revision_bad(table: TruthTable, decision: dict[str, Any]) -> bool:
    world = table.world
    config = world.by_number(decision["revision"]).config
    target = decision["rollbackTarget"]
    reference = world.by_number(target).config if target else None
    return bool(revision_breaches(world, decision["t"], config, reference))


def missed(table: TruthTable, found: list[Episode]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [
        {"t": e.start, "what": f"{describe(e)}, and the guard did not act", **e.to_json()}
        for e in found
        if e.detected_at is None and e.speculation_at_start
    ]
    for decision in table.run.decisions:
        if decision["action"] == ActionKind.ROLLOUT_PROMOTED:
            decision = _canary(decision)
        elif decision["action"] != ActionKind.REVISION_PROMOTED:
            continue
        if _revision_bad(table, decision):
            out.append(
                {
                    "t": decision["t"],
                    "what": f"revision {decision['revision']} promoted despite breaching its SLOs",
                }
            )
    return out
