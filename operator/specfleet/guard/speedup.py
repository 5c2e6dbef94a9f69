"""Does speculation pay? The expected speedup of speculative decoding over plain decoding.

With acceptance rate α, k draft tokens per verify step and draft cost c (one draft forward over
one target forward), a verify step yields E = (1 - α^(k+1)) / (1 - α) tokens on average and
costs 1 + k·c target-forward times, so the speedup is E / (1 + k·c) (Leviathan et al. 2023).
Speculation can pay only if α > c.
"""

from __future__ import annotations


def expected_tokens_per_step(alpha: float, k: int) -> float:
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def expected_speedup(alpha: float, k: int, draft_cost: float) -> float:
    return expected_tokens_per_step(alpha, k) / (1.0 + k * draft_cost)


def weighted(values: dict[str, float], weights: dict[str, float]) -> float | None:
    """Traffic-weighted mean over the classes that have both a value and a weight."""
    total = sum(weights[name] for name in values if weights.get(name))
    if total <= 0:
        return None
    return sum(values[name] * weights[name] for name in values if weights.get(name)) / total
