"""Per-class verdicts for one window: good, bad or inconclusive, per signal, with evidence.

Too few samples or no data is inconclusive, never bad.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from specfleet.api.spec import ClassSlo
from specfleet.api.status import QualityBaseline
from specfleet.guard.policy import (
    MIN_ERROR_RATE_BREACH,
    MIN_ERRORS,
    QUALITY_MARGIN,
    ClassPolicy,
    Policy,
)
from specfleet.guard.speedup import (
    expected_speedup,
    load_factor,
    speedup_from_length,
    weighted,
    wilson_interval,
)
from specfleet.telemetry.model import ClassWindow, Observation


class Judged(NamedTuple):
    """What one family of signals showed for a class: breaches and the raw readings."""

    breaches: list[str]
    readings: dict[str, Any]


class ClassVerdict(NamedTuple):
    """A NamedTuple, not a frozen dataclass: one is built per class, SpecModel and tick, and a
    frozen dataclass's __init__ would cost as much as the judgement."""

    name: str
    conclusive: bool
    weight: float
    """Output tokens (or requests) in the window: the class's share of traffic."""
    window: ClassWindow | None
    """The window, when it had enough requests to judge."""
    slo: ClassSlo
    policy: Policy
    baseline: QualityBaseline | None
    speedup: float | None = None
    """Set when speculation was judged."""
    source: str | None = None
    """Where the speedup comes from: the model, the rate, or measured TPOT."""
    speculation_breaches: Sequence[str] = ()
    load: float = 1.0
    """The model's load factor at the window's requests in flight (1: no load term)."""
    below_acceptance_floor: bool = False

    @property
    def verdict(self) -> str:
        if not self.conclusive:
            return "inconclusive"
        bad = self.speculation_breaches or self.quality_breaches or self.latency().breaches
        return "bad" if bad else "good"

    @property
    def quality_breaches(self) -> list[str]:
        return self.quality().breaches

    # Quality, latency and evidence are judged when asked, not stored: only a revision on
    # probation needs quality on every tick, the rest is read for status and actions.
    def quality(self) -> Judged:
        if self.window is None:
            return Judged([], {})
        return _judge_quality(self.slo, self.window, self.baseline, self.policy.guard.min_requests)

    def latency(self) -> Judged:
        if self.window is None:
            return Judged([], {})
        return _judge_latency(self.slo, self.window)

    def evidence(self) -> dict[str, Any]:
        window = self.window
        if window is None:
            return {}
        evidence: dict[str, Any] = {"requests": _round(window.requests)}
        if self.speedup is not None:
            evidence.update(
                {
                    "draftTokens": _round(window.draft_tokens or 0.0),
                    "acceptanceRate": _round(window.acceptance_rate),
                    "meanAcceptanceLength": _round(window.mean_acceptance_length),
                    "k": self.policy.k,
                    "draftCost": self.policy.draft_cost,
                    "loadFactor": _round(self.load),
                    "speedup": _round(self.speedup),
                    "speedupSource": self.source,
                }
            )
        measured = {**self.quality().readings, **self.latency().readings}
        return evidence | {name: _round(value) for name, value in measured.items()}


class Evaluation(NamedTuple):
    classes: list[ClassVerdict]
    speedup: float | None
    threshold: float
    speculation_bad: bool | None
    """None: inconclusive (or speculation off)."""
    in_flight: float | None = None
    """Mean requests in flight per replica over the window."""
    load: float = 1.0
    """The speedup model's load factor at `in_flight` (1 with speculation off)."""
    critical_breach: bool = False
    """A critical class breached its speculation floors (acceptance rate or speedup)."""
    below_acceptance_floor: bool = False
    """A critical class's acceptance rate is confidently below its floor."""

    @property
    def quality_bad(self) -> bool | None:
        """None: no class was conclusive."""
        conclusive = [v for v in self.classes if v.conclusive]
        return any(v.quality_breaches for v in conclusive) if conclusive else None

    def evidence(self) -> dict[str, Any]:
        return {
            "speedup": _round(self.speedup),
            "minSpeedup": self.threshold,
            "inFlightPerReplica": _round(self.in_flight),
            "classes": {c.name: c.evidence() for c in self.classes if c.conclusive},
        }


def evaluate(
    policy: Policy,
    observation: Observation,
    threshold: float,
    tpot_without_speculation: dict[str, float],
    baseline: QualityBaseline | None,
) -> Evaluation:
    in_flight = _in_flight_per_replica(policy, observation)
    load = 1.0
    if in_flight is not None and observation.speculation:
        load = load_factor(in_flight, policy.k, policy.per_token_compute)
    verdicts = [
        judge(
            policy,
            c,
            observation.classes.get(c.name),
            observation.speculation,
            threshold,
            tpot_without_speculation.get(c.name),
            baseline,
            load,
        )
        for c in policy.classes
    ]
    conclusive = [v for v in verdicts if v.conclusive]
    speedups = {v.name: v.speedup for v in conclusive if v.speedup is not None}
    speedup = weighted(speedups, {v.name: v.weight for v in conclusive})
    speculation_bad: bool | None = None
    critical = [v for v, c in zip(verdicts, policy.classes, strict=True) if c.critical]
    critical_breach = any(v.speculation_breaches for v in critical)
    if observation.speculation and speedup is not None:
        speculation_bad = speedup < threshold or critical_breach
    below_floor = any(v.below_acceptance_floor for v in critical)
    return Evaluation(
        verdicts, speedup, threshold, speculation_bad, in_flight, load, critical_breach, below_floor
    )


def _in_flight_per_replica(policy: Policy, observation: Observation) -> float | None:
    """Little's law: seconds in flight over the window's seconds is the mean batch."""
    seconds = [w.request_seconds for w in observation.classes.values() if w.request_seconds]
    if not seconds or not observation.window_seconds:
        return None
    return sum(seconds) / observation.window_seconds / max(policy.replicas, 1)


def judge(
    policy: Policy,
    klass: ClassPolicy,
    window: ClassWindow | None,
    speculation: bool,
    threshold: float,
    tpot_off: float | None,
    baseline: QualityBaseline | None,
    load: float = 1.0,
) -> ClassVerdict:
    if window is None or not window.requests or window.requests < policy.guard.min_requests:
        return ClassVerdict(klass.name, False, 0.0, None, klass.slo, policy, baseline)
    conclusive, judged = True, None
    if speculation and policy.k:
        judged = _judge_speculation(policy, klass, window, threshold, tpot_off, load)
        conclusive = judged is not None
    speedup, source, breaches, below_floor = judged or (None, None, (), False)
    return ClassVerdict(
        klass.name,
        conclusive,
        (window.output_tokens or window.requests) if conclusive else 0.0,
        window,
        klass.slo,
        policy,
        baseline,
        speedup,
        source,
        breaches,
        load,
        below_floor,
    )


def _judge_speculation(
    policy: Policy,
    klass: ClassPolicy,
    window: ClassWindow,
    threshold: float,
    tpot_off: float | None,
    load: float,
) -> tuple[float, str, list[str], bool] | None:
    """The class's speedup, its source, the breaches and whether the acceptance rate is below
    its floor; None when too little was drafted."""
    alpha = window.acceptance_rate
    if alpha is None or (window.draft_tokens or 0.0) < policy.guard.min_draft_tokens:
        return None
    length = window.mean_acceptance_length
    if length is not None:
        speedup, source = speedup_from_length(length, policy.k, policy.draft_cost), "model"
    else:  # no verify-step counts: read the rate as an i.i.d. α (an underestimate)
        speedup, source = expected_speedup(alpha, policy.k, policy.draft_cost), "model (rate)"
    speedup *= load
    if tpot_off and window.mean_tpot_seconds:
        speedup, source = tpot_off / window.mean_tpot_seconds, "measured"
    breaches, below_floor = [], False
    floor = klass.slo.min_acceptance_rate
    if floor is not None and alpha < floor:
        # A request's own rate lies in [0, 1], so its variance is at most α(1-α): counting
        # requests as trials is a conservative bound (tokens of one request are not independent).
        requests = window.requests or 0.0
        below_floor = _confidently_below(alpha, requests, floor)
        if below_floor:
            breaches.append(f"acceptance {alpha:.2f} < {floor:.2f} (n={requests:.0f})")
    if speedup < threshold:
        breaches.append(f"speedup {speedup:.2f} < {threshold:.2f}")
    return speedup, source, breaches, below_floor


def _judge_quality(
    slo: ClassSlo,
    window: ClassWindow,
    baseline: QualityBaseline | None,
    min_samples: int,
) -> Judged:
    checks = [
        (
            "toolCallValidity",
            window.tool_call_validity,
            _count(window.tool_calls_valid, window.tool_calls_invalid),
            slo.min_tool_call_validity,
            baseline.tool_call_validity if baseline else None,
        ),
        (
            "structuredOutputValidity",
            window.structured_output_validity,
            _count(window.structured_valid, window.structured_invalid),
            slo.min_structured_output_validity,
            baseline.structured_output_validity if baseline else None,
        ),
    ]
    breaches, readings = [], {}
    for name, value, samples, floor, good in checks:
        if value is None or samples < min_samples:
            continue
        readings[name] = value
        limit = _limit(floor, good)
        if _confidently_below(value, samples, limit):
            breaches.append(f"{name} {value:.3f} < {limit:.3f} (n={samples:.0f})")
    errors = _judge_errors(window, baseline, readings)
    return Judged([*breaches, errors] if errors else breaches, readings)


def _confidently_below(value: float, samples: float, limit: float) -> bool:
    """The Wilson 95% upper bound is under the limit: a breach, not a noisy dip."""
    _, upper = wilson_interval(value * samples, samples)
    return upper < limit


def _limit(floor: float | None, good: float | None) -> float:
    """The stricter of the class's floor and the last good revision's value less the margin;
    at least 0. (Explicit rather than max() over the candidates: this runs per class and tick.)"""
    limit = floor
    relative = good - QUALITY_MARGIN if good else None
    if limit is None or (relative is not None and relative > limit):
        limit = relative
    return limit if limit is not None and not limit < 0.0 else 0.0


def _judge_errors(
    window: ClassWindow, baseline: QualityBaseline | None, readings: dict[str, Any]
) -> str | None:
    error_rate, errors = window.error_rate, window.errors or 0.0
    if error_rate is None or window.requests is None:
        return None
    readings["errorRate"] = error_rate
    if errors < MIN_ERRORS:
        return None
    limit = max(MIN_ERROR_RATE_BREACH, 2 * (baseline.error_rate or 0.0) if baseline else 0.0)
    lower, _ = wilson_interval(errors, window.requests)
    return f"errorRate {error_rate:.3f} > {limit:.3f}" if lower > limit else None


def _judge_latency(slo: ClassSlo, window: ClassWindow) -> Judged:
    breaches, readings = [], {}
    for name, value, limit in (
        ("p95TtftSeconds", window.p95_ttft_seconds, slo.max_p95_ttft_seconds),
        ("p95TpotSeconds", window.p95_tpot_seconds, slo.max_p95_tpot_seconds),
    ):
        if value is None:
            continue
        readings[name] = value
        if limit is not None and value > limit:
            breaches.append(f"{name} {value:.3f} > {limit:.3f}")
    return Judged(breaches, readings)


def _count(good: float | None, bad: float | None) -> float:
    return (good or 0.0) + (bad or 0.0)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
