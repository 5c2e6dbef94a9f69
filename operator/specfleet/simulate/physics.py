"""The simulated fleet in expectation: decode steps, the engines' acceptance rate, load, TPOT.

Acceptance follows the engine simulator (`specfleet.scenario.drafting.draw`): a step that drafts
d tokens accepts draft j with probability α·decay^j if every earlier one was. Draft models
and EAGLE draft k on every decode step; prompt-lookup drafters (`drafting`'s
PROMPT_LOOKUP) draft only on steps whose context holds a match (the class's
`draft_match_rate`), 1 to k tokens alike, and the other steps yield one token for one
forward (`draft_lengths`). Engines report
`accepted / drafted` as their acceptance rate, a property of the drafting steps, not α. The
speedup is the guard's (`guard.speedup.speedup`) over every decode step; step time comes
from the simulator's `TimingModel`, affine in the batch: requests in flight per replica
follow from Little's law.
"""

from __future__ import annotations

from specfleet.guard.speedup import speedup
from specfleet.scenario.timing import TimingModel

Z95 = 1.645
"""One-sided 95% quantile of the standard normal."""


def draft_lengths(k: int, match: float | None = None) -> list[tuple[float, int]]:
    """(probability, draft tokens) of one decode step: k on every step, or for a prompt-lookup
    drafter (`match` = P(a step finds a match)) none, or 1 to k alike on a match."""
    if not k:
        return [(1.0, 0)]
    if match is None:
        return [(1.0, k)]
    return [(1.0 - match, 0), *((match / k, d) for d in range(1, k + 1))]


def step_distribution(alpha: float, k: int, decay: float = 1.0) -> list[float]:
    """P(exactly j drafts accepted in one step that drafted k), j = 0..k."""
    probabilities, reach, p = [], 1.0, alpha
    for _ in range(k):
        probabilities.append(reach * (1.0 - p))
        reach *= p
        p *= decay
    return [*probabilities, reach]


def step_moments(
    alpha: float, k: int, decay: float = 1.0, match: float | None = None
) -> tuple[float, float]:
    """Mean and variance of the tokens one decode step yields (accepted drafts + 1), over
    the steps that drafted and those that did not."""
    mean = second = 0.0
    for share, drafted in draft_lengths(k, match):
        for j, p in enumerate(step_distribution(alpha, drafted, decay)):
            mean += share * p * (1 + j)
            second += share * p * (1 + j) ** 2
    return mean, second - mean * mean


def tokens_per_step(alpha: float, k: int, decay: float = 1.0, match: float | None = None) -> float:
    return step_moments(alpha, k, decay, match)[0]


def drafts_per_step(k: int, match: float | None = None) -> float:
    """δ: draft tokens per decode step, steps that drafted nothing included."""
    return sum(share * drafted for share, drafted in draft_lengths(k, match))


def drafting_share(k: int, match: float | None = None) -> float:
    """The share of decode steps that drafted: what engines count as verify steps."""
    return sum(share for share, drafted in draft_lengths(k, match) if drafted)


def engine_acceptance_rate(
    alpha: float, k: int, decay: float = 1.0, match: float | None = None
) -> float:
    """What engines report as acceptance rate: accepted / drafted."""
    drafts = drafts_per_step(k, match)
    return (tokens_per_step(alpha, k, decay, match) - 1.0) / drafts if drafts else 0.0


def modelled_speedup(
    alpha: float,
    k: int,
    draft_cost: float,
    step_overhead: float,
    decay: float = 1.0,
    match: float | None = None,
) -> float:
    """The guard's speedup function at the true α, over every decode step."""
    tokens = tokens_per_step(alpha, k, decay, match)
    return speedup(tokens, drafts_per_step(k, match), draft_cost, step_overhead)


def concurrency(
    timing: TimingModel,
    demand: float,
    drafts: float,
    draft_cost: float,
    max_batch: int,
    step_overhead: float = 0.0,
) -> float:
    """Requests decoding at once on one replica, B = demand · step(B), solved in closed form.

    `demand` is Σ rps · output tokens · tpot_factor / (E · replicas): step-seconds asked for
    per second per replica; `drafts` is δ over the batch. The timing model's step is affine
    in B, a + b·B, so B = demand·a / (1 - demand·b); past saturation the engine runs at its
    max batch.
    """
    a = timing.decode_seconds(0, drafts, draft_cost, step_overhead)
    b = timing.decode_seconds(1, drafts, draft_cost, step_overhead) - a
    denominator = 1.0 - demand * b
    if denominator <= 0:
        return float(max_batch)
    return min(max(demand * a / denominator, 1.0), float(max_batch))


def step_seconds(
    timing: TimingModel, batch: float, drafts: float, draft_cost: float, step_overhead: float = 0.0
) -> float:
    """One decode step at a (fractional) batch verifying `drafts` tokens a request on average,
    by interpolating the affine timing model."""
    a = timing.decode_seconds(0, drafts, draft_cost, step_overhead)
    b = timing.decode_seconds(1, drafts, draft_cost, step_overhead) - a
    return a + b * batch


MEAN_WAITING_STEPS = 1.0
P95_WAITING_STEPS = 2.0
"""The running steps a new request waits out before its prefill: on average, and at the p95."""


def ttft_seconds(
    timing: TimingModel,
    prompt_tokens: int,
    step: float,
    ttft_factor: float,
    waiting_steps: float = P95_WAITING_STEPS,
) -> float:
    """Time to first token: the prefill plus waiting out running steps."""
    prefill = timing.prefill_ms_per_token * prompt_tokens / 1000.0 * ttft_factor
    return prefill + waiting_steps * step
