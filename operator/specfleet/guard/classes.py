"""Every class, critical or not: one whose speculation does not pay, or which breaches one of
its SLOs (acceptance floor, p95 TTFT or TPOT, a quality signal's bound: `signals.QUALITY`), is
named once in a `class_breach` decision, and once in a `class_recovered` decision when it is back.

The kill switch's evidence rules: N breaching windows in a row, or one decisive window (a bound
at guard.errorRate past the limit by the hysteresis band; a p95 latency has no interval, so it
needs N); a signal with too few samples is not judged, and a window that judges none of a
class's signals (or, while it breaches, not all of those it breaches) is inconclusive and counts
for nothing.
These decisions change nothing that runs, so they never count towards Flapping.
"""

from __future__ import annotations

from operator import is_not
from typing import Any, NamedTuple

from specfleet.api.status import ClassGuardStatus, ClassState, DecisionReason
from specfleet.guard.actions import ActionKind
from specfleet.guard.sequential import excludes
from specfleet.guard.situation import Tick
from specfleet.guard.verdict import ClassVerdict, Evaluation
from specfleet.signals import ACCEPTANCE_RATE, P95_TPOT, P95_TTFT, QUALITY, SPEEDUP, Signal
from specfleet.telemetry.model import ClassWindow

BREACHING = ClassState.BREACHING
"""Read once (as `killswitch.TRIAL`)."""
MAXIMA = frozenset({P95_TTFT, P95_TPOT, *(s.name for s in QUALITY if not s.higher_is_better)})
"""The signals whose limit is a maximum; the others' is a floor."""


class Reading(NamedTuple):
    """One signal of one class in one window, judged against its limit."""

    signal: str
    value: float
    limit: float
    samples: float
    breached: bool
    decisive: bool

    def evidence(self) -> dict[str, Any]:
        return {
            "signal": self.signal,
            "value": round(self.value, 4),
            "limit": self.limit,
            "samples": round(self.samples),
        }

    def words(self) -> str:
        if self.signal in MAXIMA:
            side = ">" if self.value > self.limit else "<="
        else:
            side = "<" if self.value < self.limit else ">="
        return f"{self.signal} {self.value:.3f} {side} {self.limit:.3f} (n={self.samples:.0f})"


def judge(tick: Tick, evaluation: Evaluation) -> None:
    """Each class's state after a judged window (the fleet's, not a trial's canary)."""
    before = tick.guard.classes
    known = {s.name: s for s in before}
    states = [_next(tick, v, known.get(v.name)) for v in evaluation.classes]
    if len(states) != len(before) or any(map(is_not, states, before)):
        tick.guard.classes = states


def readings(verdict: ClassVerdict) -> list[Reading]:
    """The class's signals this window judged: acceptance and speedup when speculation ran,
    latency, and each quality signal its SLO bounds (`signals.QUALITY`) on enough samples."""
    window = verdict.window
    if window is None:
        return []
    found: list[Reading] = []
    requests, slo, bounds = window.requests or 0.0, verdict.slo, verdict.acceptance_bounds
    floor = slo.min_acceptance_rate
    if floor is not None and bounds is not None:
        alpha = window.acceptance_rate
        if alpha is not None:
            breached = bounds[1] < floor
            decisive = bounds[1] < floor * (1.0 - verdict.policy.band)
            found.append(Reading(ACCEPTANCE_RATE, alpha, floor, requests, breached, decisive))
    if verdict.speedup is not None and verdict.speedup_bounds is not None:
        found.append(_speedup(verdict, verdict.speedup, verdict.speedup_bounds[1], requests))
    limit, value = slo.max_p95_ttft_seconds, window.p95_ttft_seconds
    if limit is not None and value is not None:
        found.append(Reading(P95_TTFT, value, limit, requests, value > limit, False))
    limit, value = slo.max_p95_tpot_seconds, window.p95_tpot_seconds
    if limit is not None and value is not None:
        found.append(Reading(P95_TPOT, value, limit, requests, value > limit, False))
    least = verdict.policy.guard.min_requests
    for signal in QUALITY:
        bound = signal.slo(slo)
        if bound is None:
            continue
        samples = signal.samples(window)
        if samples >= least:
            found.append(_quality(verdict, signal, bound, window, samples))
    return found


def _speedup(verdict: ClassVerdict, speedup: float, upper: float, requests: float) -> Reading:
    guard = verdict.policy.guard
    paying = guard.min_speedup
    decisive = upper < paying - guard.release_margin
    return Reading(SPEEDUP, speedup, paying, requests, speedup < paying, decisive)


def _quality(
    verdict: ClassVerdict, signal: Signal, bound: float, window: ClassWindow, samples: float
) -> Reading:
    """Samples > 0, so the value is known. Judged as the share that is good (`Signal.good`),
    as a validity (at or above the floor needs no interval); told in the signal's sense."""
    value = signal.value(window) or 0.0
    share, floor = signal.good(value), signal.good(bound)
    if share >= floor:
        return Reading(signal.name, value, bound, samples, False, False)
    error_rate, good = verdict.policy.guard.error_rate, share * samples
    breached = excludes(floor, good, samples, error_rate)
    far = floor * (1.0 - verdict.policy.band)
    decisive = breached and share < far and excludes(far, good, samples, error_rate)
    return Reading(signal.name, value, bound, samples, breached, decisive)


def _next(tick: Tick, verdict: ClassVerdict, old: ClassGuardStatus | None) -> ClassGuardStatus:
    """The class's state after this window; the same object when nothing changed."""
    state = old or ClassGuardStatus(name=verdict.name, since=tick.stamp)
    found = readings(verdict)
    if not found:
        return state
    breached = [r for r in found if r.breached]
    if state.state == BREACHING:
        return _while_breaching(tick, verdict, state, found, breached)
    if not breached:
        return state if not state.bad else state.model_copy(update={"bad": 0})
    windows = state.bad + 1
    decisive = any(r.decisive for r in breached)
    if windows < tick.situation.policy.guard.consecutive_breaches and not decisive:
        return state.model_copy(update={"bad": windows})
    _breach(tick, verdict, breached, windows, decisive)
    signals = [r.signal for r in breached]
    return ClassGuardStatus(name=verdict.name, state=BREACHING, since=tick.stamp, signals=signals)


def _while_breaching(
    tick: Tick,
    verdict: ClassVerdict,
    state: ClassGuardStatus,
    found: list[Reading],
    breached: list[Reading],
) -> ClassGuardStatus:
    if breached:
        signals = [r.signal for r in breached]
        if signals == state.signals and not state.good:
            return state
        return state.model_copy(update={"signals": signals, "good": 0})
    judged = {r.signal for r in found}
    if not judged.issuperset(state.signals):
        return state  # what it breached was not judged: no evidence it is back
    windows = state.good + 1
    if windows < tick.situation.policy.guard.consecutive_breaches:
        return state.model_copy(update={"good": windows})
    _recovered(tick, verdict, state, found, windows)
    return ClassGuardStatus(name=verdict.name, since=tick.stamp)


def _breach(
    tick: Tick, verdict: ClassVerdict, breached: list[Reading], windows: int, decisive: bool
) -> None:
    first = breached[0]
    evidence = {
        "class": verdict.name,
        "critical": verdict.critical,
        **first.evidence(),
        "breaches": [r.evidence() for r in breached],
        "windows": windows,
        "decisive": decisive,
    }
    kind = "critical" if verdict.critical else "not critical"
    message = (
        f"Class {verdict.name} ({kind}) breaches after {_windows_words(windows, decisive)}: "
        f"{'; '.join(r.words() for r in breached)}. This decision changes nothing that runs."
    )
    tick.act(ActionKind.CLASS_BREACH, DecisionReason.CLASS_BREACH, message, evidence)


def _recovered(
    tick: Tick,
    verdict: ClassVerdict,
    state: ClassGuardStatus,
    found: list[Reading],
    windows: int,
) -> None:
    back = sorted(found, key=lambda r: r.signal not in state.signals)  # what it breached first
    evidence = {
        "class": verdict.name,
        "critical": verdict.critical,
        **back[0].evidence(),
        "readings": [r.evidence() for r in back],
        "windows": windows,
        "breachingSince": state.since,
    }
    message = (
        f"Class {verdict.name} is back for {windows} windows in a row: "
        f"{'; '.join(r.words() for r in back)}."
    )
    tick.act(ActionKind.CLASS_RECOVERED, DecisionReason.CLASS_RECOVERED, message, evidence)


def _windows_words(windows: int, decisive: bool) -> str:
    if not decisive:
        return f"{windows} windows in a row"
    return "1 decisive window" if windows == 1 else f"{windows} windows, the last decisive"
