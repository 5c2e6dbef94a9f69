"""What the guard should have seen: the scenario's true numbers, without sampling noise.

Speculation truly stops paying when the guard's own speedup function at the scenario's true α
and true batch (traffic-weighted by expected output tokens) falls below minSpeedup, or a
critical class's true acceptance rate (the engines' accepted / drafted, in expectation) falls
below its floor. The true TPOT speedup (the simulator's timing model) is reported beside it.
A revision is truly bad when its effects put a class's tool-call / structured-output validity
below the guard's limit or its error rate above it, judged against the last good revision.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specfleet.guard import Policy
from specfleet.guard.policy import MIN_ERROR_RATE_BREACH, QUALITY_MARGIN
from specfleet.guard.speedup import load_factor, weighted
from specfleet.simulate import physics
from specfleet.simulate.world import Conditions, Setting, World


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


def truth_at(world: World, t: float, config: str) -> Truth:
    policy = Policy.of(world.specmodel_at(t), None)
    on = world.conditions(t, Setting(config, True))
    if not on.k or not policy.k:
        return Truth({}, {}, None, None)
    rates, speedups, weights = {}, {}, {}
    load = load_factor(on.batch, on.drafts_per_step, policy.per_token_compute)
    for c in on.classes:
        rates[c.name] = physics.engine_acceptance_rate(c.alpha, on.k, c.decay, c.match_rate)
        modelled = physics.modelled_speedup(
            c.alpha, on.k, policy.draft_cost, policy.step_overhead, c.decay, c.match_rate
        )
        speedups[c.name] = modelled * load
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
    off = world.conditions(t, Setting(config, False))
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
        error_limit = max(MIN_ERROR_RATE_BREACH, 2 * good.error_rate if good else 0.0)
        if c.error_rate > error_limit:
            breaches.append(f"{c.name} error rate {c.error_rate:.3f} > {error_limit:.3f}")
    return breaches
