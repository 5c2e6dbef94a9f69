"""Does speculation pay? The expected speedup of speculative decoding over plain decoding.

With acceptance rate α, k draft tokens per verify step and draft cost c (one draft forward over
one target forward), a verify step yields E = (1 - α^(k+1)) / (1 - α) tokens on average and
costs 1 + k·c target-forward times, so the speedup is E / (1 + k·c) (Leviathan et al. 2023).
Speculation can pay only if α > c, and only while the batch is small enough that verifying
k + 1 tokens per request costs little more than one (`load_factor`).

Engines report E directly (mean acceptance length = 1 + accepted / verify steps), so the guard
uses E / (1 + k·c) and needs no i.i.d. assumption. Note that the engines' "acceptance rate"
(accepted / drafted tokens = (E - 1) / k) is not the α of the formula: α = 0.4 at k = 4 reads
as an acceptance rate of 0.16.
"""

from __future__ import annotations

import math


def expected_tokens_per_step(alpha: float, k: int) -> float:
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def expected_speedup(alpha: float, k: int, draft_cost: float) -> float:
    return expected_tokens_per_step(alpha, k) / (1.0 + k * draft_cost)


def speedup_from_length(mean_acceptance_length: float, k: int, draft_cost: float) -> float:
    return mean_acceptance_length / (1.0 + k * draft_cost)


def load_factor(batch: float, k: int, per_token_compute: float) -> float:
    """Plain step time over verify step time at `batch` requests per replica, draft cost aside.

    A forward over n tokens costs 1 + g·n one-token forwards: memory-bound at small n, compute
    grows with n. A verify step runs B·(k+1) tokens, a plain step B, so the speedup above is
    multiplied by (1 + g·B) / (1 + g·B·(k+1)): about 1 at low load, far below it at high load.
    """
    return (1.0 + per_token_compute * batch) / (1.0 + per_token_compute * batch * (k + 1))


def paying_batch(unloaded: float, k: int, per_token_compute: float, threshold: float) -> float:
    """The largest batch at which `unloaded · load_factor(batch)` still reaches `threshold`:
    0 when it does not even at batch 0, infinite when load can never push it below."""
    r = threshold / unloaded if unloaded > 0 else math.inf
    if r > 1.0:
        return 0.0
    if per_token_compute <= 0.0 or r * (k + 1) <= 1.0:
        return math.inf
    return (1.0 - r) / (per_token_compute * (r * (k + 1) - 1.0))


def wilson_interval(successes: float, trials: float, z: float = 1.96) -> tuple[float, float]:
    """95% confidence interval of a proportion: quality verdicts need confidence, not a point."""
    if trials <= 0:
        return 0.0, 1.0
    p = successes / trials
    denominator = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denominator
    margin = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denominator
    lower, upper = centre - margin, centre + margin
    return (lower if lower > 0.0 else 0.0), (upper if upper < 1.0 else 1.0)


def weighted(values: dict[str, float], weights: dict[str, float]) -> float | None:
    """Traffic-weighted mean over the classes that have both a value and a weight."""
    names = [name for name in values if weights.get(name)]
    total = sum([weights[name] for name in names])
    if total <= 0:
        return None
    return sum([values[name] * weights[name] for name in names]) / total
