"""Canary analysis of one window: per class, the rollout's canary against the control on the same
window, and against the class's SLOs, with the guard's evidence rules: minimum samples on both
sides, Wilson bounds for shares, inconclusive never bad.

A slowdown or a quality drop the control does not show is the new revision's: that is what a
comparison on the same window attributes (the kill switch judges the control alone)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from specfleet.api.spec import ClassSlo
from specfleet.guard.policy import MIN_ERROR_RATE_BREACH, MIN_ERRORS, QUALITY_MARGIN, Policy
from specfleet.guard.sequential import Bounds, confidence_sequence, mean_confidence_sequence
from specfleet.guard.speedup import wilson_interval
from specfleet.signals import (
    ACCEPTANCE_RATE,
    MEAN_TPOT,
    P95_TPOT,
    P95_TTFT,
    QUALITY,
    Rule,
    Signal,
)
from specfleet.telemetry.model import ClassWindow, Observation

LATENCY_TOLERANCE = 1.2
"""A canary's p95 may be this many times the control's before it breaches."""
DECISIVE_LATENCY = 2.0
"""A canary p95 this many times the control's is evidence enough alone."""
LATENCY_MIN_EXCESS = {P95_TTFT: 0.1, P95_TPOT: 0.005}
"""How far (seconds) a canary's p95 must also exceed the control's: p95s come from histogram
buckets (25 ms apart around 50 ms of TTFT), and a fresh pod's first requests are slower, so a
ratio of two small latencies is noise (on the local cluster 68 ms against 30 ms of TTFT)."""
ACCEPTANCE_MARGIN = 0.1
"""A canary's acceptance rate may fall this far (absolute) below the control's."""


class Breach(NamedTuple):
    klass: str
    signal: str
    canary: float
    control: float | None
    """None: judged against the class's SLO alone (the control had too few samples)."""
    canary_samples: float
    control_samples: float
    limit: float
    decisive: bool

    def words(self) -> str:
        versus = "" if self.control is None else f" vs control {self.control:.3f}"
        return (
            f"{self.klass}: {self.signal} {self.canary:.3f} on the canary{versus}, limit "
            f"{self.limit:.3f} (n={self.canary_samples:.0f} vs {self.control_samples:.0f})"
        )

    def evidence(self) -> dict[str, Any]:
        return {
            "class": self.klass,
            "signal": self.signal,
            "canary": round(self.canary, 4),
            "control": None if self.control is None else round(self.control, 4),
            "canarySamples": round(self.canary_samples, 1),
            "controlSamples": round(self.control_samples, 1),
            "limit": round(self.limit, 4),
            "decisive": self.decisive,
        }


class Unproven(NamedTuple):
    """A share neither confidently under its limit nor confidently within it (the limit less
    the hysteresis band): the evidence must grow before the step can pass."""

    klass: str
    signal: str
    canary: float
    samples: float
    bound: float
    """The canary's bound on the side of the limit."""
    needed: float
    """What that bound must reach: the limit less the band."""

    def words(self) -> str:
        return (
            f"{self.klass}: {self.signal} {self.canary:.3f} on the canary, not yet shown within "
            f"{self.needed:.3f} (bound {self.bound:.3f}, n={self.samples:.0f})"
        )


class Analysis(NamedTuple):
    verdict: str
    """good, bad or inconclusive."""
    breaches: list[Breach]
    unjudged: list[str] = []
    """The classes the control served (or critical ones) with too few requests on the canary:
    a window without them is not good, however the others look."""
    unproven: list[Unproven] = []
    """Shares not yet shown within their limits: not good either (the burden of proof is
    the same both ways)."""
    latency_judged: bool = True
    """False while the canary warms up: its latency counted only where decisive, so the window
    is not good."""

    @property
    def decisive(self) -> bool:
        return any(b.decisive for b in self.breaches)


class Sides(NamedTuple):
    """One class's window on the canary and on the control (None: too few requests)."""

    name: str
    canary: ClassWindow
    control: ClassWindow | None
    slo: ClassSlo
    min_samples: int
    error_rate: float | None = None
    """None: one look, a 95% Wilson interval (an experiment's report); else the bounds hold at
    this rate however often they are looked at (a canary step's evidence, judged every tick)."""

    def bounds(self, successes: float, trials: float) -> tuple[float, float]:
        if self.error_rate is None:
            return wilson_interval(successes, trials)
        return confidence_sequence(successes, trials, self.error_rate)


def analyse(
    policy: Policy, canary: Observation, control: Observation, latency: bool = True
) -> Analysis:
    """`latency`: whether the canary's latency is judged in full; while it warms up (a fresh
    pod's first requests are slow), only a decisive slowdown counts."""
    breaches: list[Breach] = []
    unproven: list[Unproven] = []
    minimum, error_rate = policy.guard.min_requests, policy.guard.error_rate
    judged = [c for c in policy.classes if _served(canary, c.name, minimum)]
    for klass in judged:
        other = control.classes.get(klass.name) if _served(control, klass.name, minimum) else None
        sides = Sides(klass.name, canary.classes[klass.name], other, klass.slo, minimum, error_rate)
        found = _class_breaches(sides, policy, latency)
        breaches += [b for b in found if isinstance(b, Breach)]
        unproven += [u for u in found if isinstance(u, Unproven)]
    if breaches:
        return Analysis("bad", breaches, latency_judged=latency)
    unjudged = [
        c.name
        for c in policy.classes
        if c not in judged and (c.critical or _served(control, c.name, minimum))
    ]
    good = judged and not unjudged and not unproven and latency
    verdict = "good" if good else "inconclusive"
    return Analysis(verdict, [], unjudged, unproven, latency)


def _served(observation: Observation, klass: str, minimum: int) -> bool:
    window = observation.classes.get(klass)
    return window is not None and (window.requests or 0) >= minimum


def _class_breaches(sides: Sides, policy: Policy, latency: bool) -> list[Breach | Unproven]:
    slo = sides.slo
    latencies = [
        _latency(sides, P95_TTFT, lambda w: w.p95_ttft_seconds, slo.max_p95_ttft_seconds),
        _latency(sides, P95_TPOT, lambda w: w.p95_tpot_seconds, slo.max_p95_tpot_seconds),
    ]
    found = [
        *(b for b in latencies if b is not None and (latency or b.decisive)),
        *_qualities(sides, policy.band),
        _acceptance(sides, policy),
        _tpot_unproven(sides, policy.band),
    ]
    return [b for b in found if b is not None]


def quality_breaches(sides: Sides, band: float) -> list[Breach]:
    """Whether the canary's answers are confidently worse than the control's, or past the
    class's SLOs where the control meets them, on each quality signal (`signals.QUALITY`).
    `band` is the policy's hysteresis band (what makes a breach decisive). Experiments judge
    each arm against the baseline arm with it."""
    return [b for b in _qualities(sides, band) if isinstance(b, Breach)]


def _qualities(sides: Sides, band: float) -> list[Breach | Unproven]:
    found = (_quality(sides, band, signal) for signal in QUALITY)
    return [b for b in found if b is not None]


def _quality(sides: Sides, band: float, signal: Signal) -> Breach | Unproven | None:
    """A share judged as the share that is good (`Signal.good`), told in the signal's sense."""
    if signal.rule is Rule.MULTIPLE:
        return _multiple(sides, signal)

    def read(window: ClassWindow) -> tuple[float | None, float]:
        value = signal.value(window)
        return (None if value is None else signal.good(value)), signal.samples(window)

    floor = signal.floor(sides.slo)
    breach = _share(sides, band, signal.name, read, floor, QUALITY_MARGIN)
    if breach is None or signal.higher_is_better:
        return breach
    if isinstance(breach, Unproven):
        flipped = (1.0 - breach.canary, 1.0 - breach.bound, 1.0 - breach.needed)
        return breach._replace(canary=flipped[0], bound=flipped[1], needed=flipped[2])
    control = None if breach.control is None else 1.0 - breach.control
    return breach._replace(canary=1.0 - breach.canary, control=control, limit=1.0 - breach.limit)


def _latency(
    sides: Sides, signal: str, read: Callable[[ClassWindow], float | None], slo: float | None
) -> Breach | None:
    """Over the control's p95 by the tolerance (and the minimum excess), or over the SLO where
    the control is within it."""
    canary = read(sides.canary)
    if canary is None:
        return None
    control = read(sides.control) if sides.control else None
    samples = (sides.canary.requests or 0.0, _requests(sides.control))
    if control and _body_slower(sides, signal):
        limit = max(control * LATENCY_TOLERANCE, control + LATENCY_MIN_EXCESS[signal])
        if canary > limit:
            decisive = canary > control * DECISIVE_LATENCY
            return Breach(sides.name, signal, canary, control, *samples, limit, decisive)
    if slo is not None and canary > slo and (control is None or control <= slo):
        return Breach(sides.name, signal, canary, control, *samples, slo, False)
    return None


MEANS: dict[str, Callable[[ClassWindow], tuple[float | None, float | None, float | None]]] = {
    P95_TPOT: lambda w: (w.mean_tpot_seconds, w.tpot_samples, w.tpot_squares),
    P95_TTFT: lambda w: (w.mean_ttft_seconds, w.ttft_samples, w.ttft_squares),
}
"""Each latency's mean, its samples and their sum of squares, as a window reads them."""


def _body_slower(sides: Sides, signal: str) -> bool:
    """A p95 over the control's counts only where the mean (exact, not read from buckets) is
    over the control's by the tolerance too, shown so where both sides' spreads are known: a
    few slow requests move a p95 interpolated in a bucket (a fresh pod's first prefills, a
    stalled stream), where a slower revision slows them all. A p95 is one window's reading;
    the mean's bounds accumulate and hold at the stated error rate."""
    if sides.control is None:
        return True
    bounds = _mean_bounds(sides, signal)
    if bounds is not None:
        canary, control = bounds
        return canary[0] > control[1] * LATENCY_TOLERANCE
    mean, other = MEANS[signal](sides.canary)[0], MEANS[signal](sides.control)[0]
    return mean is None or not other or mean > other * LATENCY_TOLERANCE


def _tpot_unproven(sides: Sides, band: float) -> Unproven | None:
    """The canary's mean TPOT not yet shown within the control's by the tolerance and the
    band: what a step needs shown to pass, as an abort needs it shown past."""
    bounds = _mean_bounds(sides, P95_TPOT)
    if bounds is None:
        return None
    (_, upper), (lower, _) = bounds
    needed = lower * LATENCY_TOLERANCE * (1.0 + band)
    if upper <= needed:
        return None
    mean = sides.canary.mean_tpot_seconds or 0.0
    return Unproven(sides.name, MEAN_TPOT, mean, sides.canary.tpot_samples or 0.0, upper, needed)


def _mean_bounds(sides: Sides, signal: str) -> tuple[Bounds, Bounds] | None:
    """The canary's and the control's bounds on the mean of `signal`'s latency, each at half
    the error rate (the two together hold at it); None for one look (an experiment's report)
    or without the sums."""
    if sides.error_rate is None or sides.control is None:
        return None
    rate = sides.error_rate / 2
    canary, control = (_bounds(MEANS[signal](w), rate) for w in (sides.canary, sides.control))
    return None if canary is None or control is None else (canary, control)


def _bounds(
    read: tuple[float | None, float | None, float | None], error_rate: float
) -> Bounds | None:
    mean, samples, squares = read
    if not mean or not samples or squares is None:
        return None
    return mean_confidence_sequence(mean * samples, squares, samples, error_rate)


def _share(
    sides: Sides,
    band: float,
    signal: str,
    read: Callable[[ClassWindow], tuple[float | None, float]],
    floor: float | None,
    margin: float,
) -> Breach | Unproven | None:
    """Confidently below the control's lower bound less the margin, or below the floor where
    the control meets it; unproven while the canary's lower bound is under that limit less
    the hysteresis band (None: within it, or nothing to judge). The band is the indifference
    zone that lets every step end: a canary a tenth under its limit, or worse, is aborted, one
    at its limit passes, and in between the evidence decides which bound crosses first."""
    canary, samples = read(sides.canary)
    if canary is None or samples < sides.min_samples:
        return None
    control, control_samples = read(sides.control) if sides.control else (None, 0.0)
    limits = []
    if control is not None and control_samples >= sides.min_samples:
        limits.append(sides.bounds(control * control_samples, control_samples)[0] - margin)
    else:
        control, control_samples = None, 0.0
    if floor is not None and (control is None or control >= floor):
        limits.append(floor)
    if not limits:
        return None
    limit = max(limits)
    lower, upper = sides.bounds(canary * samples, samples)
    if upper >= limit:
        needed = limit * (1.0 - band)
        if lower >= needed:
            return None
        return Unproven(sides.name, signal, canary, samples, lower, needed)
    decisive = upper < limit * (1.0 - band)
    return Breach(sides.name, signal, canary, control, samples, control_samples, limit, decisive)


def _acceptance(sides: Sides, policy: Policy) -> Breach | Unproven | None:
    """Acceptance where both sides drafted enough: judged over requests, as the guard does."""

    def read(window: ClassWindow) -> tuple[float | None, float]:
        drafted = (window.draft_tokens or 0.0) >= policy.guard.min_draft_tokens
        return (window.acceptance_rate if drafted else None), window.requests or 0.0

    floor = sides.slo.min_acceptance_rate
    return _share(sides, policy.band, ACCEPTANCE_RATE, read, floor, ACCEPTANCE_MARGIN)


def _multiple(sides: Sides, signal: Signal) -> Breach | None:
    """The rate's lower bound over twice the control's (at least 1%)."""
    window = sides.canary
    count, samples = signal.count(window) or 0.0, signal.samples(window)
    if count < MIN_ERRORS or not samples:
        return None
    control = signal.value(sides.control) if sides.control else None
    limit = max(MIN_ERROR_RATE_BREACH, 2 * (control or 0.0))
    lower, _ = sides.bounds(count, samples)
    if lower <= limit:
        return None
    others = signal.samples(sides.control) if sides.control else 0.0
    decisive = lower > 2 * limit
    return Breach(
        sides.name, signal.name, count / samples, control, samples, others, limit, decisive
    )


def _requests(window: ClassWindow | None) -> float:
    return (window.requests or 0.0) if window else 0.0
