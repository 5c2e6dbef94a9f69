"""The simulated fleet in expectation: verify steps, the engines' acceptance rate, load, TPOT.

Acceptance follows the engine simulator (`specfleet.sim.acceptance.draw`): a verify step
proposes k drafts and draft j is accepted with probability α·decay^j if every earlier one was.
Engines report `accepted / drafted` as their acceptance rate, which is (E - 1) / k for a mean
of E tokens per step, not α. Step time comes from the simulator's `TimingModel`, whose decode
time is affine in the batch: requests in flight per replica follow from Little's law.
"""

from __future__ import annotations

from specfleet.guard.speedup import expected_speedup
from specfleet.sim.timing import TimingModel

Z95 = 1.645
"""One-sided 95% quantile of the standard normal."""


def step_distribution(alpha: float, k: int, decay: float = 1.0) -> list[float]:
    """P(exactly j drafts accepted in one verify step), j = 0..k."""
    probabilities, reach, p = [], 1.0, alpha
    for _ in range(k):
        probabilities.append(reach * (1.0 - p))
        reach *= p
        p *= decay
    return [*probabilities, reach]


def step_moments(alpha: float, k: int, decay: float = 1.0) -> tuple[float, float]:
    """Mean and variance of the tokens one verify step yields (accepted drafts + 1)."""
    distribution = step_distribution(alpha, k, decay)
    mean = sum(j * p for j, p in enumerate(distribution))
    variance = sum((j - mean) ** 2 * p for j, p in enumerate(distribution))
    return 1.0 + mean, variance


def tokens_per_step(alpha: float, k: int, decay: float = 1.0) -> float:
    return step_moments(alpha, k, decay)[0] if k else 1.0


def engine_acceptance_rate(alpha: float, k: int, decay: float = 1.0) -> float:
    """What engines report as acceptance rate: accepted / drafted = (E - 1) / k."""
    return (tokens_per_step(alpha, k, decay) - 1.0) / k if k else 0.0


def modelled_speedup(alpha: float, k: int, draft_cost: float, decay: float = 1.0) -> float:
    """The guard's speedup function (Leviathan et al.) at the true α; with position decay the
    same E / (1 + k·c) with the decayed E."""
    if decay == 1.0:
        return expected_speedup(alpha, k, draft_cost)
    return tokens_per_step(alpha, k, decay) / (1.0 + k * draft_cost)


def concurrency(
    timing: TimingModel,
    demand: float,
    k: int,
    draft_cost: float,
    max_batch: int,
) -> float:
    """Requests decoding at once on one replica, B = demand · step(B), solved in closed form.

    `demand` is Σ rps · output tokens · tpot_factor / (E · replicas): step-seconds asked for
    per second per replica. The timing model's step is affine in B, a + b·B, so
    B = demand·a / (1 - demand·b); past saturation the engine runs at its max batch.
    """
    a = timing.decode_seconds(0, k, draft_cost)
    b = timing.decode_seconds(1, k, draft_cost) - a
    denominator = 1.0 - demand * b
    if denominator <= 0:
        return float(max_batch)
    return min(max(demand * a / denominator, 1.0), float(max_batch))


def step_seconds(timing: TimingModel, batch: float, k: int, draft_cost: float) -> float:
    """One verify step at a (fractional) batch, by interpolating the affine timing model."""
    a = timing.decode_seconds(0, k, draft_cost)
    b = timing.decode_seconds(1, k, draft_cost) - a
    return a + b * batch


def ttft_seconds(timing: TimingModel, prompt_tokens: int, step: float, ttft_factor: float) -> float:
    """p95 time to first token: the prefill plus waiting out up to two running steps."""
    prefill = timing.prefill_ms_per_token * prompt_tokens / 1000.0 * ttft_factor
    return prefill + 2.0 * step
