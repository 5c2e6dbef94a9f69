"""Does speculation pay? The expected speedup of speculative decoding over plain decoding.

A decode step runs one target forward and yields 1 + accepted tokens; a step that drafted d
tokens also pays d draft forwards of cost c each (one draft forward over one target forward).
Speculation being on also costs every step o target forwards, drafts or none: the drafter's
lookup or proposal pass, the rejection sampler, the bookkeeping of a verify step (engines.md:
k = 0 is not free). A step thus costs 1 + o + d·c target forwards; plain decoding yields one
token per target forward, so over many steps

    speedup = tokens per step / (1 + o + δ·c),    δ = draft tokens per decode step,

counting every decode step, those that drafted nothing too; at o = 0 it is the draft-cost-only
model. A window that drafted nothing runs at 1 / (1 + o): it does not pay when o > 0.

Prompt-lookup drafters (n-gram, suffix) draft only on steps whose context holds a match, a
depth schedule at k = 0 and TensorRT-LLM above max_concurrency not at all: those steps yield
one token at the cost of 1 + o forwards and pull the speedup towards 1 / (1 + o).

From the engines' counters: every decode step makes one token of its own plus the drafts it
accepted, so decode steps = output - accepted tokens (the prefill's token counted as one: it
is one forward too), tokens per step = output / (output - accepted) and δ = drafted /
(output - accepted). At acceptance rate p (accepted / drafted, a property of the drafting
steps alone) the tokens per step are 1 + δ·p, so

    speedup = (1 + δ·p) / (1 + o + δ·c)
            = output / ((1 + o)·(output - accepted) + c·drafted).

When every step drafts k tokens δ = k and 1 + k·p is the engines' mean acceptance length E
(1 + accepted / verify steps): E / (1 + o + k·c), at o = 0 Leviathan et al. (2023), who
also give E = (1 - α^(k+1)) / (1 - α) for i.i.d. acceptance α per draft position. Note that
the engines' acceptance rate (E - 1) / k is not that α: α = 0.4 at k = 4 reads as 0.16.
Speculation can pay only if δ·p > o + δ·c, and only while the batch is small enough that
verifying 1 + δ tokens per request costs little more than one (`load_factor`).
"""

from __future__ import annotations

import math


def speedup(
    tokens_per_step: float, drafts_per_step: float, draft_cost: float, step_overhead: float
) -> float:
    """Tokens a decode step yields over what it costs in target forwards."""
    return tokens_per_step / step_cost(drafts_per_step, draft_cost, step_overhead)


def step_cost(drafts_per_step: float, draft_cost: float, step_overhead: float) -> float:
    """A decode step with speculation on, in target forwards: 1 + o + δ·c."""
    return 1.0 + step_overhead + drafts_per_step * draft_cost


def decode_steps(output: float, accepted: float) -> float | None:
    """Decode steps from the counters, those that drafted nothing included (each made one token
    of its own plus the drafts it accepted); None when the counts describe none."""
    steps = output - accepted
    return steps if steps > 0 else None


def expected_tokens_per_step(alpha: float, k: int) -> float:
    """E at i.i.d. acceptance α when every step drafts k tokens."""
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def expected_speedup(alpha: float, k: int, draft_cost: float, step_overhead: float = 0.0) -> float:
    """Every step drafting k tokens at i.i.d. acceptance α."""
    return speedup(expected_tokens_per_step(alpha, k), k, draft_cost, step_overhead)


def load_factor(batch: float, drafts_per_step: float, per_token_compute: float) -> float:
    """Plain step time over verify step time at `batch` requests per replica, draft cost aside.

    A forward over n tokens costs 1 + g·n one-token forwards: memory-bound at small n, compute
    grows with n. A verify step runs B·(1 + δ) tokens, a plain step B, so the speedup above is
    multiplied by (1 + g·B) / (1 + g·B·(1 + δ)): about 1 at low load, far below it at high load.
    """
    plain = forward_cost(batch, per_token_compute)
    return plain / forward_cost(batch * (1.0 + drafts_per_step), per_token_compute)


def forward_cost(tokens: float, per_token_compute: float) -> float:
    """A forward over `tokens` tokens, in one-token forwards: 1 + g·n."""
    return 1.0 + per_token_compute * tokens


def paying_batch(
    unloaded: float, drafts_per_step: float, per_token_compute: float, threshold: float
) -> float:
    """The largest batch at which `unloaded · load_factor(batch)` still reaches `threshold`:
    0 when it does not even at batch 0, infinite when load can never push it below."""
    r = threshold / unloaded if unloaded > 0 else math.inf
    if r > 1.0:
        return 0.0
    verified = 1.0 + drafts_per_step
    if per_token_compute <= 0.0 or r * verified <= 1.0:
        return math.inf
    return (1.0 - r) / (per_token_compute * (r * verified - 1.0))


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
