"""Always-valid confidence bounds for a proportion, for a guard that looks every 15 s.

A fixed-level interval (`speedup.wilson_interval`) holds its 5% only for one look at a sample
size fixed in advance; a guard that recomputes it on accumulating counts every tick and acts the
first time it excludes a limit errs far more often (bench/sequential_error.py measures it). A
confidence sequence holds at every number of trials at once (Johari et al. 2017, "always valid
inference"; Howard, Ramdas, McAuliffe and Sekhon 2021, "Time-uniform, nonparametric,
nonasymptotic confidence sequences"), so it can be looked at as often as one likes.

The method is Robbins' conjugate beta-binomial mixture. For a candidate proportion p, after S
successes in n trials (F = n - S failures),

    M_n(p) = B(a + S, b + F) / B(a, b) / (p^S (1 - p)^F)

is the likelihood of the data under a Beta(a, b) mixture over that under p: a nonnegative
martingale of mean 1 when p is the truth. Ville's inequality bounds the chance that it ever
reaches 1 / error_rate, so {p : M_n(p) < 1 / error_rate} covers the true p at every n at once
with probability at least 1 - error_rate. In x = logit p,

    log M_n(p) - log(1 / error_rate) = S·softplus(-x) + F·softplus(x) + C

is convex with slope n·p - S and linear far out, so the set is an interval around S / n and
Newton's method finds each end from any start (after its first step, from the outside in).

The prior is Jeffreys', Beta(1/2, 1/2): its cost over the best single proportion, which sets
the bound's width, is about the same at every observed share (1/2·log(π·n/2) nats), and the
guard's limits sit both near 1/2 (acceptance floors) and near 1 (validity floors, 0.95-0.98).
Over the judgements bench/sequential_error.py times (tens to a thousand trials), it never needs
more than 1.48 times the trials of the best of Beta(1/4, 1/4), Beta(1, 1), Beta(2, 2) and
Beta(10, 10), each of which needs 1.6 to 9 times the best somewhere: a concentrated prior is
tightest near 1/2 and pays most near 0 and 1.

Counts are floats (increases of Prometheus counters: 37.0, or 36.8 after extrapolation). An
uncached call costs about 5 µs (bench/sequential_error.py); both functions also memoize their
exact inputs, a repeated call 0.3 µs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import lru_cache

Bounds = tuple[float, float]
"""(lower, upper)."""

PRIOR = (0.5, 0.5)
"""Beta(a, b) of the mixture: Jeffreys' prior (see the module's docstring)."""

MAX_TRIALS = 1e7
"""`trials_to_decide` looks no further: a judgement needing more is no judgement for a guard."""

_CACHE = 4096
_FAR = 800.0  # in logit space: sigmoid(800) is 1.0 and sigmoid(-800) 0.0 in floats


def confidence_sequence(
    successes: float,
    trials: float,
    error_rate: float,
    *,
    prior: tuple[float, float] = PRIOR,
) -> Bounds:
    """(lower, upper) bounds of a proportion such that, for i.i.d. Bernoulli draws, the chance the
    true proportion is ever outside them, at any number of trials, is at most error_rate.

    trials <= 0 (or not finite, or successes NaN) -> (0.0, 1.0); successes are clipped to
    [0, trials]. `prior` is the mixture's Beta(a, b); other priors than the default are for
    comparing them (bench/sequential_error.py).
    """
    _check(error_rate)
    if not 0.0 < trials < math.inf or math.isnan(successes):
        return 0.0, 1.0
    successes = 0.0 if successes < 0.0 else trials if successes > trials else successes
    return _bounds(successes, trials, error_rate, prior)


def trials_to_decide(
    share: float,
    limit: float,
    error_rate: float,
    *,
    prior: tuple[float, float] = PRIOR,
) -> float | None:
    """The fewest trials at which an observed `share` puts the bound on the far side of `limit`:
    the upper bound below it when share < limit, the lower bound above it when share > limit.

    That is where M_n(limit), S = share·n, reaches 1 / error_rate; at a fixed share it stays
    there for every larger n (tests/test_sequential.py checks this). Found by doubling from
    1 trial and bisecting to 0.1%, the larger end returned. None when share == limit, when the
    limit is not strictly between 0 and 1, or when more than MAX_TRIALS would be needed.
    """
    _check(error_rate)
    if math.isnan(share) or not 0.0 < limit < 1.0:
        return None
    return _trials(min(max(share, 0.0), 1.0), limit, error_rate, prior)


def log_martingale(
    p: float, successes: float, trials: float, *, prior: tuple[float, float] = PRIOR
) -> float:
    """log M_n(p): the mixture's evidence against p after `successes` in `trials` (counts as
    given: not clipped); +inf at p = 0 or 1 when the counts rule it out."""
    failures = trials - successes
    against = 0.0
    if successes > 0.0:
        against -= successes * math.log(p) if p > 0.0 else -math.inf
    if failures > 0.0:
        against -= failures * math.log1p(-p) if p < 1.0 else -math.inf
    return _log_marginal(successes, failures, *prior) + against


def excludes(p: float, successes: float, trials: float, error_rate: float) -> bool:
    """Whether the bounds at `error_rate` leave `p` out: `p` is shown on the far side of the
    share. One evaluation of the martingale (about 1 µs) instead of the bounds' roots: the
    guard asks this of every class and signal of every SpecModel each tick."""
    if trials <= 0.0:
        return False
    successes = min(max(successes, 0.0), trials)
    return log_martingale(p, successes, trials) >= -math.log(error_rate)


def _check(error_rate: float) -> None:
    if not 0.0 < error_rate < 1.0:
        raise ValueError(f"error_rate must lie strictly between 0 and 1, not {error_rate}")


def _log_marginal(successes: float, failures: float, a: float, b: float) -> float:
    """log B(a + S, b + F) - log B(a, b): log of the data's likelihood under the mixture."""
    lgamma = math.lgamma
    return (
        lgamma(a + successes)
        + lgamma(b + failures)
        - lgamma(a + b + successes + failures)
        - lgamma(a)
        - lgamma(b)
        + lgamma(a + b)
    )


@lru_cache(maxsize=_CACHE)
def _bounds(
    successes: float, trials: float, error_rate: float, prior: tuple[float, float]
) -> Bounds:
    # M_n(p) < 1/α  <=>  S·softplus(-x) + F·softplus(x) + c < 0,  x = logit p
    failures = trials - successes
    c = _log_marginal(successes, failures, *prior) - math.log(1.0 / error_rate)
    if successes <= 0.0:  # F·softplus(x) = -c in closed form
        return 0.0, -math.expm1(c / failures)
    if failures <= 0.0:
        return math.exp(c / successes), 1.0
    # Start where the quadratic about x = log S/F, curvature S·F/n, reaches zero.
    depth = successes * math.log(successes / trials) + failures * math.log(failures / trials) - c
    step = min(math.sqrt(2.0 * max(depth, 1e-9) * trials / successes / failures), _FAR)
    centre = math.log(successes / failures)
    upper = _root(successes, failures, c, min(centre + step, _FAR))
    lower = _root(failures, successes, c, min(step - centre, _FAR))  # the mirror image: y = -x
    return _sigmoid(-lower), _sigmoid(upper)


def _root(successes: float, failures: float, c: float, x: float) -> float:
    """The root of g(x) = S·softplus(-x) + F·softplus(x) + c right of its minimum, x = log S/F,
    by Newton's method from x (right of the minimum): g is convex there with slope n·sigmoid(x) - S,
    so every step after the first lands right of the root and the iterates fall to it. A root
    beyond _FAR, where sigmoid(x) is 1 and sigmoid(-x) 0 in floats, is returned as infinity."""
    trials = successes + failures
    exp, log1p = math.exp, math.log1p
    for _ in range(100):
        if x > 0.0:
            tail = exp(-x)
            softplus = log1p(tail)  # softplus(x) = x + this, softplus(-x) = this
            g = successes * softplus + failures * (x + softplus) + c
            slope = trials / (1.0 + tail) - successes
        else:
            tail = exp(x)
            softplus = log1p(tail)  # softplus(x) = this, softplus(-x) = this - x
            g = successes * (softplus - x) + failures * softplus + c
            slope = trials * tail / (1.0 + tail) - successes
        if x >= _FAR and g <= 0.0:
            return math.inf
        if slope <= 0.0:  # at or left of the minimum (rounding): the root lies right
            x = min(2.0 * abs(x) + 1.0, _FAR)
            continue
        dx = g / slope
        x -= dx
        if x > _FAR:
            x = _FAR
        if abs(dx) <= 1e-12 * (1.0 + abs(x)):
            break
    return x


def _sigmoid(x: float) -> float:
    if x >= 0.0:
        return 1.0 / (1.0 + math.exp(-x))
    tail = math.exp(x)
    return tail / (1.0 + tail)


@lru_cache(maxsize=_CACHE)
def _trials(
    share: float, limit: float, error_rate: float, prior: tuple[float, float]
) -> float | None:
    if share == limit:
        return None
    level = math.log(1.0 / error_rate)

    return _fewest(lambda n: log_martingale(limit, share * n, n, prior=prior) >= level)


def _fewest(decided: Callable[[float], bool]) -> float | None:
    """The fewest trials (to 0.1%, the larger end) at which `decided` holds, by doubling from
    one and bisecting; None past MAX_TRIALS. `decided` must stay true once it is."""
    low, high = 0.0, 1.0
    while not decided(high):
        if high >= MAX_TRIALS:
            return None
        low, high = high, min(2.0 * high, MAX_TRIALS)
    while high - low > 1e-3 * high:
        middle = 0.5 * (low + high)
        if decided(middle):
            high = middle
        else:
            low = middle
    return high


TUNED_REQUESTS = 100.0
"""The number of requests the ratio's bound is tightest at (its mixture's spread is chosen for
it): the guard's judgements are decided between tens and a few hundred requests."""
PRIOR_REQUESTS = 10.0
"""Pseudo-requests at the largest spread a rate can have, added to the observed spread: few
requests that happen to agree cannot make the bound narrow, nor can a rare kind of request
(one in twenty that accepts nothing) the first requests have not shown yet. Two were not
enough for that: bench/sequential_error.py measures both."""


def ratio_confidence_sequence(
    numerator: float,
    denominator: float,
    deviations: float,
    requests: float,
    error_rate: float,
) -> Bounds:
    """(lower, upper) bounds of a rate of sums, Σa / Σd over requests (accepted over drafted
    tokens), from `deviations` = Σ(a - rate·d)²: how much requests differ from one another.

    The bound of `confidence_sequence` on requests assumes the largest spread a rate in [0, 1]
    can have; the requests of one class differ far less, and the bound here is as wide as they
    do. It is the asymptotic confidence sequence of Waudby-Smith, Arbour, Sinha, Kennedy and
    Ramdas (2021, "Time-uniform central limit theory and asymptotic confidence sequences"):
    Robbins' two-sided normal mixture applied to the mean of a - rate·d, its spread estimated
    (with PRIOR_REQUESTS at the largest), and divided by the mean d. It is valid as the number
    of requests grows; bench/sequential_error.py measures what it delivers from twenty.
    """
    _check(error_rate)
    if not 0.0 < requests < math.inf or not denominator > 0.0:
        return 0.0, 1.0
    spread = ratio_spread(deviations, denominator, requests)
    half = _half_width(requests, spread * spread, RATE_SPREAD2, error_rate)
    rate = numerator / denominator
    return max(rate - half, 0.0), min(rate + half, 1.0)


def ratio_spread(deviations: float, denominator: float, requests: float) -> float:
    """How far one request's own rate lies from the rate of sums, a standard deviation in the
    rate's units: sqrt(Σ(a - rate·d)² / n) over the mean d."""
    return math.sqrt(max(deviations, 0.0) / requests) / (denominator / requests)


def requests_to_decide(rate: float, limit: float, spread: float, error_rate: float) -> float | None:
    """The fewest requests at which `ratio_confidence_sequence` puts an observed `rate`, whose
    requests differ from it by `spread` (a standard deviation, in the rate's units), on its side
    of `limit`: what a pending judgement still needs. None when rate == limit or more than
    MAX_TRIALS would be needed."""
    _check(error_rate)
    gap = abs(rate - limit)
    if not gap > 0.0:
        return None
    return _fewest(lambda n: _half_width(n, spread * spread, RATE_SPREAD2, error_rate) < gap)


RATE_SPREAD2 = 0.25
"""The largest variance of a rate in [0, 1]: the prior's, for a rate."""
MEAN_SPREAD2 = 1.0
"""The prior's variance for a positive mean, relative to its square: requests as far apart as
the mean itself (a TPOT's requests differ by a fraction of it)."""


def mean_confidence_sequence(
    total: float, squares: float, samples: float, error_rate: float
) -> Bounds:
    """(lower, upper) bounds of a mean (a class's TPOT) from the sum, the sum of squares and
    the number of its samples: `ratio_confidence_sequence`'s method with PRIOR_REQUESTS at a
    spread as large as the mean (MEAN_SPREAD2). (0, inf) without samples."""
    _check(error_rate)
    if not 0.0 < samples < math.inf or not total > 0.0:
        return 0.0, math.inf
    mean = total / samples
    spread2 = max(squares / samples - mean * mean, 0.0) / (mean * mean)
    half = mean * _half_width(samples, spread2, MEAN_SPREAD2, error_rate)
    return max(mean - half, 0.0), mean + half


def _half_width(samples: float, spread2: float, prior2: float, error_rate: float) -> float:
    """The half-width of a bound over `samples` that differ by a variance `spread2`, with
    PRIOR_REQUESTS more at `prior2` (both in the unit of what is bounded)."""
    variance = (samples * spread2 + PRIOR_REQUESTS * prior2) / (samples + PRIOR_REQUESTS)
    return math.sqrt(variance) * _mixture_radius(samples, error_rate)


def _mixture_radius(n: float, error_rate: float) -> float:
    """The half-width of the normal mixture's sequence for the mean of n unit-variance terms,
    its mixing variance (the paper's rho squared) tuned for TUNED_REQUESTS."""
    level = -2.0 * math.log(error_rate)
    rho2 = (level + math.log(level + 1.0)) / TUNED_REQUESTS
    spread = n * rho2 + 1.0
    return math.sqrt(2.0 * spread / (n * n * rho2) * math.log(math.sqrt(spread) / error_rate))
