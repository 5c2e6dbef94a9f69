"""What the guard should have seen: the scenario's true numbers, without sampling noise.

Speculation truly stops paying when the guard's own speedup function at the scenario's true α
and true batch (traffic-weighted by expected output tokens) falls below minSpeedup, or a
critical class's true acceptance rate (the engines' accepted / drafted, in expectation) falls
below its floor, over what the fleet serves (a class routed to the plain pool is not its). The
true TPOT speedup (the simulator's timing model) is reported beside it.
A revision is truly bad when its effects put a class's tool-call / structured-output validity
below the guard's limit or its truncation or error rate above it, judged against the last good
revision, or its p95 TTFT or TPOT above the class's SLO or LATENCY_MARGIN times the last good
revision's, each served as well as it can be (with speculation or without, whichever is faster).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specfleet.api.spec import ClassSlo
from specfleet.guard import Policy
from specfleet.guard.policy import LATENCY_MARGIN, MIN_ERROR_RATE_BREACH, QUALITY_MARGIN
from specfleet.guard.speedup import load_factor, weighted
from specfleet.signals import P95_TPOT, P95_TTFT
from specfleet.simulate import physics
from specfleet.simulate.outcome import p95_tpot_seconds
from specfleet.simulate.world import WHOLE, Conditions, Load, Setting, World


@dataclass(frozen=True)
class Truth:
    rates: dict[str, float]
    """Expected engine acceptance rate (accepted / drafted) per class."""
    speedups: dict[str, float]
    speedup: float | None
    tpot_speedup: float | None
    critical_breaches: list[str] = field(default_factory=list)

    def bad(self, threshold: float) -> bool:
        slow = self.speedup is not None and self.speedup < threshold
        return slow or bool(self.critical_breaches)


def truth_at(world: World, t: float, config: str, load: Load = WHOLE) -> Truth:
    """The truth for the fleet's pods serving `load`."""
    policy = Policy.of(world.specmodel_at(t), None)
    on = world.conditions(t, Setting(config, True), load)
    if not on.k or not policy.k:
        return Truth({}, {}, None, None)
    rates, speedups, weights = {}, {}, {}
    factor = load_factor(on.batch, on.drafts_per_step, policy.per_token_compute)
    for c in on.classes:
        rates[c.name] = physics.engine_acceptance_rate(c.alpha, on.k, c.decay, c.match_rate)
        modelled = physics.modelled_speedup(
            c.alpha, on.k, policy.draft_cost, policy.step_overhead, c.decay, c.match_rate
        )
        speedups[c.name] = modelled * factor
        weights[c.name] = c.rate * c.output_tokens
    floors = {
        p.name: p.slo.min_acceptance_rate
        for p in policy.classes
        if p.critical and p.slo.min_acceptance_rate is not None
    }
    breaches = [
        f"{name} acceptance {rates[name]:.2f} < {floor:.2f}"
        for name, floor in floors.items()
        if name in rates and weights[name] > 0 and rates[name] < floor
    ]
    off = world.conditions(t, Setting(config, False), load)
    return Truth(rates, speedups, weighted(speedups, weights), _tpot_speedup(on, off), breaches)


def _tpot_speedup(on: Conditions, off: Conditions) -> float | None:
    """Plain-decoding TPOT over speculative TPOT, weighted by expected output tokens."""
    weights = [c.rate * c.output_tokens for c in on.classes]
    if not sum(weights):
        return None
    tpot_on = sum(
        w * on.step_seconds / physics.tokens_per_step(c.alpha, on.k, c.decay, c.match_rate)
        for w, c in zip(weights, on.classes, strict=True)
    )
    return sum(weights) * off.step_seconds / tpot_on


def revision_breaches(world: World, t: float, config: str, reference: str | None) -> list[str]:
    """How revision `config` truly breaches the guard's quality limits and latency SLOs
    against `reference`."""
    return [
        *quality_breaches(world, t, config, reference),
        *latency_breaches(world, t, config, reference),
    ]


def latency_breaches(world: World, t: float, config: str, reference: str | None) -> list[str]:
    slos = {c.name: c.slo or ClassSlo() for c in world.specmodel_at(t).spec.classes}
    now = _best_latency(world, t, config)
    good = _best_latency(world, t, reference) if reference else {}
    breaches = []
    for name, signals in now.items():
        slo = slos.get(name, ClassSlo())
        maxima = {P95_TTFT: slo.max_p95_ttft_seconds, P95_TPOT: slo.max_p95_tpot_seconds}
        for signal, value in signals.items():
            limits = [maxima[signal]]
            if name in good:
                limits.append(good[name][signal] * LATENCY_MARGIN)
            limit = min((x for x in limits if x is not None), default=None)
            if limit is not None and value > limit:
                breaches.append(f"{name} {signal} {value:.3f} > {limit:.3f}")
    return breaches


def _best_latency(world: World, t: float, config: str) -> dict[str, dict[str, float]]:
    """Per class p95 TTFT and TPOT with speculation or without, whichever is faster."""
    settings = [world.conditions(t, Setting(config, on)) for on in (True, False)]
    best: dict[str, dict[str, float]] = {}
    for conditions in settings:
        for c in conditions.classes:
            if c.rate <= 0:
                continue
            tpot = p95_tpot_seconds(conditions, c, c.alpha)
            known = best.get(c.name)
            if known is None or tpot < known[P95_TPOT]:
                best[c.name] = {P95_TTFT: c.p95_ttft_seconds, P95_TPOT: tpot}
    return best


def quality_breaches(world: World, t: float, config: str, reference: str | None) -> list[str]:
    """How revision `config` truly breaks the guard's quality limits against `reference`."""
    policy = Policy.of(world.specmodel_at(t), None)
    now = world.conditions(t, Setting(config, False))
    ref = world.conditions(t, Setting(reference, False)) if reference else None
    slos = {p.name: p.slo for p in policy.classes}
    breaches = []
    for index, c in enumerate(now.classes):
        good = ref.classes[index] if ref else None
        slo = slos.get(c.name)
        floors = [
            (c.tool_call_rate > 0, slo.min_tool_call_validity if slo else None),
            (c.structured, slo.min_structured_output_validity if slo else None),
        ]
        for used, floor in floors:
            limit = max(floor or 0.0, (good.validity - QUALITY_MARGIN) if good else 0.0)
            if used and c.validity < limit:
                breaches.append(f"{c.name} validity {c.validity:.3f} < {limit:.3f}")
        ceiling = slo.max_truncation_rate if slo else None
        cut_limit = min(
            1.0 if ceiling is None else ceiling,
            good.truncation_rate + QUALITY_MARGIN if good else 1.0,
        )
        if c.truncation_rate > cut_limit:
            breaches.append(f"{c.name} truncation rate {c.truncation_rate:.3f} > {cut_limit:.3f}")
        error_limit = max(MIN_ERROR_RATE_BREACH, 2 * good.error_rate if good else 0.0)
        if c.error_rate > error_limit:
            breaches.append(f"{c.name} error rate {c.error_rate:.3f} > {error_limit:.3f}")
    return breaches
