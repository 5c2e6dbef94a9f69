"""Per-class verdicts for one window: good, bad or inconclusive, per signal, with evidence.

Too few samples or no data is inconclusive, never bad.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
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
    speedup_from_length,
    weighted,
    wilson_interval,
)
from specfleet.telemetry.model import ClassWindow, Observation

UNROUNDED = frozenset({"k", "draftCost", "speedupSource"})
"""Readings that are settings or labels, not measurements: evidence shows them as they are."""


class Service(NamedTuple):
    """What a class's quality and latency showed."""

    quality_breaches: list[str]
    latency_breaches: list[str]
    readings: dict[str, Any]


@dataclass(frozen=True)
class ClassVerdict:
    name: str
    conclusive: bool
    weight: float
    """Output tokens (or requests) in the window: the class's share of traffic."""
    readings: dict[str, Any]
    """Requests and the speculation numbers, unrounded: most windows never become evidence."""
    slo: ClassSlo
    speedup: float | None = None
    speculation_breaches: list[str] = field(default_factory=list)
    window: ClassWindow | None = None
    """The window, when it had enough requests to judge quality and latency from."""
    baseline: QualityBaseline | None = None
    min_samples: int = 0

    @property
    def verdict(self) -> str:
        if not self.conclusive:
            return "inconclusive"
        bad = self.speculation_breaches or self.quality_breaches or self.latency_breaches
        return "bad" if bad else "good"

    @property
    def quality_breaches(self) -> list[str]:
        return self.service.quality_breaches

    @property
    def latency_breaches(self) -> list[str]:
        return self.service.latency_breaches

    # Judged on first use: only a revision on probation needs it on every tick.
    @cached_property
    def service(self) -> Service:
        if self.window is None:
            return Service([], [], {})
        readings: dict[str, Any] = {}
        quality = _judge_quality(self.slo, self.window, self.baseline, self.min_samples, readings)
        return Service(quality, _judge_latency(self.slo, self.window, readings), readings)

    def evidence(self) -> dict[str, Any]:
        readings = {**self.readings, **self.service.readings}
        return {k: v if k in UNROUNDED else _round(v) for k, v in readings.items()}


@dataclass(frozen=True)
class Evaluation:
    classes: list[ClassVerdict]
    speedup: float | None
    threshold: float
    speculation_bad: bool | None
    """None: inconclusive (or speculation off)."""

    @property
    def quality_bad(self) -> bool | None:
        """None: no class was conclusive."""
        conclusive = [v for v in self.classes if v.conclusive]
        return any(v.quality_breaches for v in conclusive) if conclusive else None

    def evidence(self) -> dict[str, Any]:
        return {
            "speedup": _round(self.speedup),
            "minSpeedup": self.threshold,
            "classes": {c.name: c.evidence() for c in self.classes if c.conclusive},
        }


def evaluate(
    policy: Policy,
    observation: Observation,
    threshold: float,
    tpot_without_speculation: dict[str, float],
    baseline: QualityBaseline | None,
) -> Evaluation:
    verdicts = [
        judge(
            policy,
            c,
            observation.classes.get(c.name),
            observation.speculation,
            threshold,
            tpot_without_speculation.get(c.name),
            baseline,
        )
        for c in policy.classes
    ]
    conclusive = [v for v in verdicts if v.conclusive]
    speedups = {v.name: v.speedup for v in conclusive if v.speedup is not None}
    speedup = weighted(speedups, {v.name: v.weight for v in conclusive})
    speculation_bad: bool | None = None
    if observation.speculation and speedup is not None:
        critical = any(
            v.speculation_breaches
            for v, c in zip(verdicts, policy.classes, strict=True)
            if c.critical
        )
        speculation_bad = speedup < threshold or critical
    return Evaluation(verdicts, speedup, threshold, speculation_bad)


def judge(
    policy: Policy,
    klass: ClassPolicy,
    window: ClassWindow | None,
    speculation: bool,
    threshold: float,
    tpot_off: float | None,
    baseline: QualityBaseline | None,
) -> ClassVerdict:
    guard = policy.guard
    if window is None or not window.requests or window.requests < guard.min_requests:
        requests = window.requests if window else None
        return ClassVerdict(klass.name, False, 0.0, {"requests": requests}, klass.slo)
    readings: dict[str, Any] = {"requests": window.requests}
    conclusive, speedup, speculation_breaches = True, None, []
    if speculation and policy.k:
        judged = _judge_speculation(policy, klass, window, threshold, tpot_off, readings)
        conclusive = judged is not None
        speedup, speculation_breaches = judged or (None, [])
    return ClassVerdict(
        klass.name,
        conclusive,
        (window.output_tokens or window.requests) if conclusive else 0.0,
        readings,
        klass.slo,
        speedup,
        speculation_breaches,
        window,
        baseline,
        guard.min_requests,
    )


def _judge_speculation(
    policy: Policy,
    klass: ClassPolicy,
    window: ClassWindow,
    threshold: float,
    tpot_off: float | None,
    readings: dict[str, Any],
) -> tuple[float, list[str]] | None:
    """The class's speedup and speculation breaches; None when too little was drafted."""
    alpha = window.acceptance_rate
    drafted = window.draft_tokens or 0.0
    readings.update({"draftTokens": drafted, "acceptanceRate": alpha})
    if alpha is None or drafted < policy.guard.min_draft_tokens:
        return None
    length = window.mean_acceptance_length
    if length is not None:
        speedup, source = speedup_from_length(length, policy.k, policy.draft_cost), "model"
    else:  # no verify-step counts: read the rate as an i.i.d. α (an underestimate)
        speedup, source = expected_speedup(alpha, policy.k, policy.draft_cost), "model (rate)"
    if tpot_off and window.mean_tpot_seconds:
        speedup, source = tpot_off / window.mean_tpot_seconds, "measured"
    readings.update(
        {
            "meanAcceptanceLength": length,
            "k": policy.k,
            "draftCost": policy.draft_cost,
            "speedup": speedup,
            "speedupSource": source,
        }
    )
    breaches = []
    floor = klass.slo.min_acceptance_rate
    if floor is not None and alpha < floor:
        breaches.append(f"acceptance {alpha:.2f} < {floor:.2f}")
    if speedup < threshold:
        breaches.append(f"speedup {speedup:.2f} < {threshold:.2f}")
    return speedup, breaches


def _judge_quality(
    slo: ClassSlo,
    window: ClassWindow,
    baseline: QualityBaseline | None,
    min_samples: int,
    readings: dict[str, Any],
) -> list[str]:
    checks = [
        (
            "toolCallValidity",
            window.tool_call_validity,
            _count(window.tool_calls_valid, window.tool_calls_invalid),
            slo.min_tool_call_validity,
            baseline and baseline.tool_call_validity,
        ),
        (
            "structuredOutputValidity",
            window.structured_output_validity,
            _count(window.structured_valid, window.structured_invalid),
            slo.min_structured_output_validity,
            baseline and baseline.structured_output_validity,
        ),
    ]
    breaches = []
    for name, value, samples, floor, good in checks:
        if value is None or samples < min_samples:
            continue
        readings[name] = value
        limit = max(
            x for x in (floor, (good - QUALITY_MARGIN) if good else None, 0.0) if x is not None
        )
        _, upper = wilson_interval(value * samples, samples)
        if upper < limit:  # confidently below, not a noisy dip
            breaches.append(f"{name} {value:.3f} < {limit:.3f} (n={samples:.0f})")
    errors = _judge_errors(window, baseline, readings)
    return [*breaches, errors] if errors else breaches


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


def _judge_latency(slo: ClassSlo, window: ClassWindow, readings: dict[str, Any]) -> list[str]:
    breaches = []
    for name, value, limit in (
        ("p95TtftSeconds", window.p95_ttft_seconds, slo.max_p95_ttft_seconds),
        ("p95TpotSeconds", window.p95_tpot_seconds, slo.max_p95_tpot_seconds),
    ):
        if value is None:
            continue
        readings[name] = value
        if limit is not None and value > limit:
            breaches.append(f"{name} {value:.3f} > {limit:.3f}")
    return breaches


def _count(good: float | None, bad: float | None) -> float:
    return (good or 0.0) + (bad or 0.0)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
