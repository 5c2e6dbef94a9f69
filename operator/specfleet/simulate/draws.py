"""Common random numbers: every run of a scenario (guarded, always-on, always-off, oracle) sees
the same arrivals and the same noise, drawn once per (slice, class) from one seeded RNG in an
order that does not depend on what the fleet does.

Counts that depend on the fleet's state (errors, invalid tool calls, truncated answers) are
inverse-CDF transforms of the same uniforms, so a better setting never gets luckier draws than a
worse one. Truncation draws from a stream of its own: the signal came later, and a stream shared
with it would have redrawn every other number (and every seeded run's outcome).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from statistics import NormalDist

from specfleet.scenario import Scenario

EXACT_POISSON_MAX = 500.0
EXACT_BINOMIAL_MAX = 1000


@dataclass(frozen=True)
class ClassDraw:
    """The randomness of one class over one slice."""

    requests: int
    alpha_noise: float
    """Standard normal: how this slice's requests drafted better or worse than the class mean."""
    steps_noise: float
    """Standard normal: renewal noise of the number of verify steps."""
    errors: float
    tool_calls: float
    invalid_tool_calls: float
    invalid_structured: float
    truncated: float
    """Uniforms in (0, 1) for the binomial counts."""


def draw_slices(
    scenario: Scenario, seed: int, slice_seconds: float, count: int
) -> list[dict[str, ClassDraw]]:
    """`count` slices of `slice_seconds`, each with one draw per scenario class."""
    rng, cuts = random.Random(seed), random.Random(f"truncation-{seed}")
    return [
        {
            name: _draw(rng, cuts, _rate(scenario, name, i * slice_seconds) * slice_seconds)
            for name in scenario.classes
        }
        for i in range(count)
    ]


def _rate(scenario: Scenario, name: str, t: float) -> float:
    return scenario.rps(t) * scenario.classes[name].share


def _draw(rng: random.Random, cuts: random.Random, mean_requests: float) -> ClassDraw:
    return ClassDraw(
        requests=poisson(mean_requests, rng.random()),
        alpha_noise=rng.gauss(0.0, 1.0),
        steps_noise=rng.gauss(0.0, 1.0),
        errors=rng.random(),
        tool_calls=rng.random(),
        invalid_tool_calls=rng.random(),
        invalid_structured=rng.random(),
        truncated=cuts.random(),
    )


def poisson(mean: float, u: float) -> int:
    """The Poisson(mean) quantile at u (normal approximation above EXACT_POISSON_MAX)."""
    if mean <= 0:
        return 0
    if mean > EXACT_POISSON_MAX:
        return max(0, round(mean + math.sqrt(mean) * _normal_quantile(u)))
    k, p = 0, math.exp(-mean)
    cumulative = p
    while cumulative < u and p > 0:
        k += 1
        p *= mean / k
        cumulative += p
    return k


def binomial(n: int, p: float, u: float) -> int:
    """The Binomial(n, p) quantile at u (normal approximation above EXACT_BINOMIAL_MAX)."""
    if n <= 0 or p <= 0:
        return 0
    if p >= 1:
        return n
    if p > 0.5:
        return n - binomial(n, 1.0 - p, 1.0 - u)
    if n > EXACT_BINOMIAL_MAX:
        sd = math.sqrt(n * p * (1.0 - p))
        return min(n, max(0, round(n * p + sd * _normal_quantile(u))))
    k, q = 0, (1.0 - p) ** n
    cumulative, ratio = q, p / (1.0 - p)
    while cumulative < u and k < n:
        q *= ratio * (n - k) / (k + 1)
        k += 1
        cumulative += q
    return k


def _normal_quantile(u: float) -> float:
    return NormalDist().inv_cdf(min(max(u, 1e-12), 1.0 - 1e-12))
