"""The guard's bound under continuous monitoring: the confidence sequence of
`specfleet.guard.sequential` against a fixed 95% Wilson interval looked at after every draw.

For each true share p, `--streams` streams of `--horizon` Bernoulli(p) draws (seeded); a stream
errs when its bound excludes p at any step. Delivered error = the share of streams that erred.
The confidence sequence excludes p exactly when its mixture martingale M_n(p) reaches
1 / error_rate, and the Wilson interval exactly when (S - n·p)² > z²·n·p(1 - p) (the score test
it inverts), so both are checked at every step in O(1) from running counts; a cross-check calls
`confidence_sequence` and `wilson_interval` themselves every 10th step on the first streams and
counts disagreements with those shortcuts (expected 0).

Then the bound's width at n = 20, 100, 1000 and the trials `trials_to_decide` says a judgement
needs, for candidate Beta priors (how PRIOR was chosen), and microseconds per call.

Then the acceptance rate's bound, `ratio_confidence_sequence` (a rate of sums over requests that
differ): `--ratio-streams` streams of `--ratio-horizon` requests for each of several request
mixes (drafted lengths and per-request rates drawn with numpy, accepted tokens binomial), the
bound asked after every request whether it excludes the true rate of sums, with
PRIOR_REQUESTS at 2 and at the module's value side by side on the same draws (the constant is
set in the module for the bench's calls); the requests `requests_to_decide` says a judgement
needs against `trials_to_decide`'s on requests; microseconds per call. A cross-check builds the
guard's own window (`ClassWindow`) every 10th request of the first streams and compares
`verdict.acceptance_bounds` with the bound from the sums here (expected 0 disagreements).

Run: `.venv/bin/python bench/sequential_error.py [--streams 2000] [--horizon 10000]
[--ratio-streams 1000] [--ratio-horizon 1000] [--only proportion|ratio] [--json]` (about 40 s
for the proportion, a minute or two for the ratio); prints tables (or, with --json, the JSON)
and writes bench/results/sequential_error.json.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from specfleet.guard import sequential
from specfleet.guard.sequential import (
    PRIOR,
    confidence_sequence,
    ratio_confidence_sequence,
    requests_to_decide,
    trials_to_decide,
)
from specfleet.guard.speedup import wilson_interval
from specfleet.guard.verdict import acceptance_bounds
from specfleet.telemetry.model import ClassWindow

ROOT = Path(__file__).resolve().parent.parent
Z = 1.96
SHARES = (0.02, 0.1, 0.5, 0.9)
ERROR_RATES = (0.01, 0.05, 0.1)
PRIORS = ((0.25, 0.25), (0.5, 0.5), (1.0, 1.0), (2.0, 2.0), (10.0, 10.0))
WIDTH_SHARES = (0.02, 0.3, 0.5, 0.95)
SIZES = (20, 100, 1000)
# (observed share, limit): a collapse below an acceptance floor, drifts near it, a validity
# breach and a healthy validity class confirming against its floor.
JUDGEMENTS = ((0.05, 0.3), (0.2, 0.3), (0.4, 0.5), (0.5, 0.3), (0.93, 0.98), (0.995, 0.98),
              (1.0, 0.95))  # fmt: skip
CROSS_CHECK_STREAMS = 40


def monitor(p: float, streams: int, horizon: int, rng: random.Random) -> dict[str, Any]:
    """Per stream: the largest log M_n(p) over the horizon, whether Wilson ever excluded p, and
    whether it excluded p at the horizon alone."""
    a, b = PRIOR
    log_p, log_q = math.log(p), math.log1p(-p)
    spread = Z * Z * p * (1.0 - p)
    peaks: list[float] = []
    wilson_ever = wilson_last = 0
    draw, log = rng.random, math.log
    for _ in range(streams):
        successes = 0
        evidence = peak = 0.0
        ever = False
        for n in range(horizon):  # n draws so far; the mixture predicts the next one
            if draw() < p:
                evidence += log((a + successes) / (a + b + n)) - log_p
                successes += 1
            else:
                evidence += log((b + n - successes) / (a + b + n)) - log_q
            if evidence > peak:
                peak = evidence
            if not ever:
                miss = successes - (n + 1) * p
                ever = miss * miss > spread * (n + 1)
        peaks.append(peak)
        wilson_ever += ever
        miss = successes - horizon * p
        wilson_last += miss * miss > spread * horizon
    return {
        "sequence": {
            str(alpha): sum(peak >= math.log(1.0 / alpha) for peak in peaks) / streams
            for alpha in ERROR_RATES
        },
        "wilsonEveryStep": wilson_ever / streams,
        "wilsonAtHorizonOnly": wilson_last / streams,
    }


def cross_check(p: float, horizon: int, rng: random.Random) -> dict[str, int]:
    """The shortcuts against the functions themselves, every 10th step."""
    a, b = PRIOR
    alpha = 0.05
    checks = disagreements = 0
    for _ in range(CROSS_CHECK_STREAMS):
        successes = 0
        evidence = 0.0
        for n in range(horizon):
            if rng.random() < p:
                evidence += math.log((a + successes) / (a + b + n) / p)
                successes += 1
            else:
                evidence += math.log((b + n - successes) / (a + b + n) / (1.0 - p))
            if (n + 1) % 10:
                continue
            lower, upper = confidence_sequence(successes, n + 1, alpha)
            excluded = not lower <= p <= upper
            # Ties (|log M - level| at rounding) cannot be told apart: skip them.
            if abs(evidence - math.log(1.0 / alpha)) > 1e-9:
                checks += 1
                disagreements += excluded != (evidence >= math.log(1.0 / alpha))
            low, high = wilson_interval(successes, n + 1)
            miss = successes - (n + 1) * p
            checks += 1
            disagreements += (not low <= p <= high) != (miss * miss > Z * Z * (n + 1) * p * (1 - p))
    return {"checks": checks, "disagreements": disagreements}


def widths() -> dict[str, Any]:
    rows: dict[str, Any] = {}
    for share in WIDTH_SHARES:
        for n in SIZES:
            row = {}
            for prior in PRIORS:
                lower, upper = confidence_sequence(share * n, n, 0.05, prior=prior)
                row[prior_name(prior)] = upper - lower
            lower, upper = wilson_interval(share * n, n)
            row["wilson95"] = upper - lower
            rows[f"{share}@{n}"] = row
    return rows


def judgements() -> dict[str, Any]:
    return {
        f"{share}vs{limit}": {
            prior_name(prior): trials_to_decide(share, limit, 0.05, prior=prior) for prior in PRIORS
        }
        for share, limit in JUDGEMENTS
    }


def microseconds(rng: random.Random, calls: int = 50_000) -> dict[str, float]:
    trials = [rng.uniform(1.0, 2000.0) for _ in range(calls)]
    inputs = [(rng.uniform(0.0, n), n) for n in trials]  # distinct floats: every call a miss
    result = {}
    began = time.perf_counter()
    for successes, n in inputs:
        confidence_sequence(successes, n, 0.05)
    result["confidenceSequenceMiss"] = (time.perf_counter() - began) / calls * 1e6
    repeated = inputs[:1000] * (calls // 1000)
    for successes, n in repeated[:1000]:
        confidence_sequence(successes, n, 0.05)
    began = time.perf_counter()
    for successes, n in repeated:
        confidence_sequence(successes, n, 0.05)
    result["confidenceSequenceHit"] = (time.perf_counter() - began) / len(repeated) * 1e6
    began = time.perf_counter()
    for successes, n in inputs:
        wilson_interval(successes, n)
    result["wilsonInterval"] = (time.perf_counter() - began) / calls * 1e6
    shares = [rng.random() for _ in range(calls // 10)]
    began = time.perf_counter()
    for share in shares:
        trials_to_decide(share, 0.5, 0.05)
    result["trialsToDecideMiss"] = (time.perf_counter() - began) / len(shares) * 1e6
    return {name: round(value, 2) for name, value in result.items()}


def summed(checks: list[dict[str, int]]) -> dict[str, int]:
    return {key: sum(c[key] for c in checks) for key in ("checks", "disagreements")}


def prior_name(prior: tuple[float, float]) -> str:
    return f"Beta({prior[0]:g},{prior[1]:g})"


def run(streams: int, horizon: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    began = time.perf_counter()
    delivered = {str(p): monitor(p, streams, horizon, rng) for p in SHARES}
    checked = [cross_check(p, min(horizon, 2000), rng) for p in SHARES]
    return {
        "streams": streams,
        "horizon": horizon,
        "seed": seed,
        "prior": prior_name(PRIOR),
        "delivered": delivered,
        "crossCheck": summed(checked),
        "monitorSeconds": round(time.perf_counter() - began, 1),
        "widthAlpha0.05": widths(),
        "trialsToDecideAlpha0.05": judgements(),
        "microsecondsPerCall": microseconds(rng),
    }


def show(result: dict[str, Any]) -> None:
    rates = " | ".join(f"sequence α={alpha}" for alpha in ERROR_RATES)
    print(
        f"Delivered error, {result['streams']} streams x {result['horizon']} draws, bound checked "
        f"after every draw (prior {result['prior']}):\n"
        f"| p | {rates} | Wilson 95% every draw | Wilson 95% at the horizon only |\n"
        f"|{' --- |' * (3 + len(ERROR_RATES))}"
    )
    for p, row in result["delivered"].items():
        cells = " | ".join(f"{row['sequence'][str(alpha)]:.3f}" for alpha in ERROR_RATES)
        print(
            f"| {p} | {cells} | {row['wilsonEveryStep']:.3f} | {row['wilsonAtHorizonOnly']:.3f} |"
        )
    check = result["crossCheck"]
    print(
        f"cross-check against the functions every 10th draw: {check['disagreements']} "
        f"disagreements in {check['checks']} checks ({result['monitorSeconds']} s)\n"
    )
    names = [prior_name(prior) for prior in PRIORS]
    print(
        "Width of the bound at α = 0.05:\n"
        f"| share @ n | {' | '.join(names)} | Wilson 95% (one look) |\n"
        f"|{' --- |' * (2 + len(names))}"
    )
    for key, row in result["widthAlpha0.05"].items():
        cells = " | ".join(f"{row[name]:.4f}" for name in [*names, "wilson95"])
        print(f"| {key} | {cells} |")
    print(
        "\nTrials to a judgement (trials_to_decide) at α = 0.05, and over the best prior:\n"
        f"| share vs limit | {' | '.join(names)} |\n|{' --- |' * (1 + len(names))}"
    )
    for key, row in result["trialsToDecideAlpha0.05"].items():
        best = min(value for value in row.values() if value is not None)
        cells = " | ".join(
            "-" if row[name] is None else f"{row[name]:.0f} ({row[name] / best:.2f})"
            for name in names
        )
        print(f"| {key.replace('vs', ' vs ')} | {cells} |")
    us = result["microsecondsPerCall"]
    print(
        f"\nµs per call: confidence_sequence {us['confidenceSequenceMiss']} (cache miss), "
        f"{us['confidenceSequenceHit']} (hit); trials_to_decide {us['trialsToDecideMiss']} "
        f"(miss); wilson_interval {us['wilsonInterval']}"
    )


# -- the acceptance rate: a rate of sums over requests that differ ----------------------------

RATIO_PRIORS = (2.0, sequential.PRIOR_REQUESTS)
"""PRIOR_REQUESTS side by side: two, and the module's value."""
FIRST_LOOK = 20
"""The guard judges a class's acceptance from minRequests (20 by default) requests on; the
delivered error is counted from there, and from the first request."""
DRAFTED = (20, 300)
"""Drafted tokens per request, uniform between these."""
NOTHING = 1 / 20
"""The share of requests that accept nothing in the tight mix."""
LONG_RATES = (0.8, 0.3)
"""The long-requests mix: the mean rate of the shortest and of the longest requests, linear
between; each request's rate Beta around it with LONG_CONCENTRATION (sd about 0.1)."""
LONG_CONCENTRATION = 20.0
# (observed rate, limit): a critical class's recovery at 0.59 over its floor of 0.5 first, then
# the acceptance rows of JUDGEMENTS.
RATIO_JUDGEMENTS = ((0.59, 0.5), (0.05, 0.3), (0.2, 0.3), (0.4, 0.5), (0.5, 0.3))
SPREADS = (0.1, 0.15, 0.3)
"""How much requests differ: a standard deviation of their rates."""
RATIO_CROSS_CHECK_STREAMS = 10


@dataclass(frozen=True)
class RequestMix:
    name: str
    words: str
    rate: float
    """The true rate of sums, E[accepted] / E[drafted]."""
    draw: Callable[[np.random.Generator, tuple[int, int]], tuple[np.ndarray, np.ndarray]]
    """(rng, (streams, requests)) -> accepted and drafted tokens of each request."""


def _drafted(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    return rng.integers(DRAFTED[0], DRAFTED[1] + 1, size=shape)


def _beta(mean: float, sd: float) -> tuple[float, float]:
    total = mean * (1.0 - mean) / (sd * sd) - 1.0
    return mean * total, (1.0 - mean) * total


def _spread_around(rng: np.random.Generator, shape: tuple[int, int]) -> tuple[Any, Any]:
    drafted = _drafted(rng, shape)
    return rng.binomial(drafted, rng.beta(*_beta(0.6, 0.15), size=shape)), drafted


def _bimodal(rng: np.random.Generator, shape: tuple[int, int]) -> tuple[Any, Any]:
    drafted = _drafted(rng, shape)
    return rng.binomial(drafted, np.where(rng.random(shape) < 0.5, 0.9, 0.1)), drafted


def _long_rate(drafted: Any) -> Any:
    (shortest, longest), (short, long) = DRAFTED, LONG_RATES
    return short + (long - short) * (drafted - shortest) / (longest - shortest)


def _long_accept_less(rng: np.random.Generator, shape: tuple[int, int]) -> tuple[Any, Any]:
    drafted = _drafted(rng, shape)
    mean = _long_rate(drafted)
    rates = rng.beta(LONG_CONCENTRATION * mean, LONG_CONCENTRATION * (1.0 - mean))
    return rng.binomial(drafted, rates), drafted


def _long_accept_less_truth() -> float:
    lengths = range(DRAFTED[0], DRAFTED[1] + 1)
    return sum(_long_rate(d) * d for d in lengths) / sum(lengths)


def _tight_some_nothing(rng: np.random.Generator, shape: tuple[int, int]) -> tuple[Any, Any]:
    drafted = _drafted(rng, shape)
    accepted = rng.binomial(drafted, rng.beta(70.0, 30.0, size=shape))
    accepted[rng.random(shape) < NOTHING] = 0
    return accepted, drafted


MIXES = (
    RequestMix("beta", "rates Beta around 0.6, sd 0.15", 0.6, _spread_around),
    RequestMix("bimodal", "half the requests at 0.9, half at 0.1", 0.5, _bimodal),
    RequestMix(
        "longAcceptLess",
        "long requests accept less (0.8 at 20 drafted to 0.3 at 300, sd ~0.1)",
        _long_accept_less_truth(),
        _long_accept_less,
    ),
    RequestMix(
        "tightSomeNothing",
        "tight rates Beta(70,30), one request in twenty accepts nothing",
        0.7 * (1.0 - NOTHING),
        _tight_some_nothing,
    ),
)
"""Each with drafted lengths uniform over DRAFTED, accepted tokens binomial at the request's
rate."""


@contextmanager
def prior_requests(value: float) -> Iterator[None]:
    """`sequential.PRIOR_REQUESTS` at `value` for the calls inside (the module reads it at each
    call)."""
    kept = sequential.PRIOR_REQUESTS
    sequential.PRIOR_REQUESTS = value
    try:
        yield
    finally:
        sequential.PRIOR_REQUESTS = kept


def running_sums(accepted: np.ndarray, drafted: np.ndarray) -> dict[str, np.ndarray]:
    """What the gateways' counters hold after each request of each stream."""
    a, d = accepted.astype(float), drafted.astype(float)
    terms = {"accepted": a, "drafted": d, "squares": a * a, "draftedSquares": d * d, "both": a * d}
    return {name: np.cumsum(values, axis=1) for name, values in terms.items()}


def deviations(sums: dict[str, np.ndarray]) -> np.ndarray:
    """Σ(accepted - rate·drafted)² after each request, expanded from the sums as
    `ClassWindow.acceptance_deviations` expands them (vectorized: a window costs 12 µs to build;
    `ratio_cross_check` compares the two)."""
    rate = sums["accepted"] / sums["drafted"]
    spread = sums["squares"] - 2.0 * rate * sums["both"] + rate * rate * sums["draftedSquares"]
    return np.maximum(spread, 0.0)


def ratio_erred(truth: float, sums: dict[str, np.ndarray], spread: np.ndarray) -> dict[str, Any]:
    """The share of streams whose bound ever excluded `truth`, per error rate, looked at from the
    first request and from FIRST_LOOK, and (from FIRST_LOOK) the median request at which a
    stream that erred first did. A bound at a smaller error rate is wider, so the rates a stream
    has erred at are always the loosest few: counted, not listed."""
    loosest = sorted(ERROR_RATES, reverse=True)
    first_counts = [0] * len(loosest)
    late_at: list[list[int]] = [[] for _ in loosest]
    rows = zip(sums["accepted"].tolist(), sums["drafted"].tolist(), spread.tolist(), strict=True)
    for accepted, drafted, deviation in rows:
        first = late = 0  # error rates erred at, the loosest first
        for n, (a, d, v) in enumerate(zip(accepted, drafted, deviation, strict=True), start=1):
            counted = n >= FIRST_LOOK
            k = late if counted else first
            while k < len(loosest):
                lower, upper = ratio_confidence_sequence(a, d, v, n, loosest[k])
                if lower <= truth <= upper:
                    break
                k += 1
            first = max(first, k)
            if counted:
                for index in range(late, k):
                    late_at[index].append(n)
                late = max(late, k)
                if late == len(loosest):
                    break
        for index in range(first):
            first_counts[index] += 1
    streams = len(spread)
    return {
        "from1": {str(alpha): c / streams for alpha, c in zip(loosest, first_counts, strict=True)},
        f"from{FIRST_LOOK}": {
            str(alpha): len(at) / streams for alpha, at in zip(loosest, late_at, strict=True)
        },
        "medianFirstError": {
            str(alpha): statistics.median(at) if at else None
            for alpha, at in zip(loosest, late_at, strict=True)
        },
    }


def ratio_cross_check(sums: dict[str, np.ndarray], spread: np.ndarray) -> dict[str, int]:
    """The guard's path (a ClassWindow, `verdict.acceptance_bounds`) against the bound from the
    vectorized sums, every 10th request of the first streams."""
    checks = disagreements = 0
    for stream in range(min(RATIO_CROSS_CHECK_STREAMS, len(spread))):
        for index in range(9, spread.shape[1], 10):
            counts = {name: float(values[stream, index]) for name, values in sums.items()}
            n = float(index + 1)
            window = ClassWindow(
                requests=n,
                spec_requests=n,
                draft_tokens=counts["drafted"],
                accepted_tokens=counts["accepted"],
                accepted_squares=counts["squares"],
                drafted_squares=counts["draftedSquares"],
                accepted_by_drafted=counts["both"],
            )
            _, guard = acceptance_bounds(window, 0.05)
            here = ratio_confidence_sequence(
                counts["accepted"], counts["drafted"], float(spread[stream, index]), n, 0.05
            )
            checks += 1
            disagreements += max(abs(g - h) for g, h in zip(guard, here, strict=True)) > 1e-9
    return {"checks": checks, "disagreements": disagreements}


def requests_needed() -> dict[str, Any]:
    """requests_to_decide at each spread and PRIOR_REQUESTS, and trials_to_decide on requests."""
    rows: dict[str, Any] = {}
    for rate, limit in RATIO_JUDGEMENTS:
        row: dict[str, Any] = {"trialsToDecide": trials_to_decide(rate, limit, 0.05)}
        for prior in RATIO_PRIORS:
            with prior_requests(prior):
                row[f"priorRequests{prior:g}"] = {
                    str(spread): requests_to_decide(rate, limit, spread, 0.05) for spread in SPREADS
                }
        rows[f"{rate}vs{limit}"] = row
    return rows


def ratio_microseconds(rng: random.Random, calls: int = 50_000) -> dict[str, float]:
    inputs = []
    for _ in range(calls):
        n, each = rng.uniform(20.0, 2000.0), rng.uniform(20.0, 300.0)
        spread = rng.uniform(0.05, 0.4) * each
        inputs.append((rng.random() * each * n, each * n, n * spread * spread, n))
    began = time.perf_counter()
    for accepted, drafted, deviation, n in inputs:
        ratio_confidence_sequence(accepted, drafted, deviation, n, 0.05)
    bound = (time.perf_counter() - began) / calls * 1e6
    rates = [rng.random() for _ in range(calls // 10)]
    began = time.perf_counter()
    for rate in rates:
        requests_to_decide(rate, 0.5, 0.15, 0.05)
    needed = (time.perf_counter() - began) / len(rates) * 1e6
    return {"ratioConfidenceSequence": round(bound, 2), "requestsToDecide": round(needed, 2)}


def ratio_run(streams: int, horizon: int, seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    began = time.perf_counter()
    delivered, checked = {}, []
    for mix in MIXES:
        sums = running_sums(*mix.draw(rng, (streams, horizon)))
        spread = deviations(sums)
        checked.append(ratio_cross_check(sums, spread))
        by_prior = {}
        for prior in RATIO_PRIORS:
            with prior_requests(prior):
                by_prior[f"{prior:g}"] = ratio_erred(mix.rate, sums, spread)
        drafted = sums["drafted"][:, -1] / horizon
        delivered[mix.name] = {
            "words": mix.words,
            "rate": round(mix.rate, 4),
            # how much requests differ, in the rate's units, at the horizon (mean over streams)
            "spread": round(float(np.mean(np.sqrt(spread[:, -1] / horizon) / drafted)), 3),
            "byPriorRequests": by_prior,
        }
    return {
        "streams": streams,
        "horizon": horizon,
        "seed": seed,
        "drafted": DRAFTED,
        "delivered": delivered,
        "crossCheck": summed(checked),
        "monitorSeconds": round(time.perf_counter() - began, 1),
        "requestsToDecideAlpha0.05": requests_needed(),
        "microsecondsPerCall": ratio_microseconds(random.Random(seed)),
    }


def show_ratio(result: dict[str, Any]) -> None:
    priors = [f"{prior:g}" for prior in RATIO_PRIORS]
    header = " | ".join(f"{p} pseudo-requests: α={alpha}" for p in priors for alpha in ERROR_RATES)
    print(
        f"\nAcceptance rate (ratio_confidence_sequence): delivered error, {result['streams']} "
        f"streams x {result['horizon']} requests ({result['drafted'][0]}-{result['drafted'][1]} "
        f"drafted each), bound checked after every request from the {FIRST_LOOK}th (from the "
        f"first in brackets):\n| mix | true rate | spread | {header} |\n"
        f"|{' --- |' * (3 + len(priors) * len(ERROR_RATES))}"
    )
    over = []
    for name, row in result["delivered"].items():
        cells = []
        for prior in priors:
            erred = row["byPriorRequests"][prior]
            for alpha in ERROR_RATES:
                late, first = erred[f"from{FIRST_LOOK}"][str(alpha)], erred["from1"][str(alpha)]
                cells.append(f"{late:.3f} ({first:.3f})")
                if late > alpha:
                    over.append(f"{name} at α={alpha}, {prior} pseudo-requests: {late:.3f}")
        print(f"| {name}: {row['words']} | {row['rate']} | {row['spread']} | {' | '.join(cells)} |")
    firsts = ", ".join(
        f"{name} {_count(row['byPriorRequests'][priors[-1]]['medianFirstError']['0.05'])} "
        f"({_count(row['byPriorRequests'][priors[0]]['medianFirstError']['0.05'])})"
        for name, row in result["delivered"].items()
    )
    check = result["crossCheck"]
    print(
        f"median request of a stream's first exclusion at α=0.05, {priors[-1]} pseudo-requests "
        f"({priors[0]} in brackets): {firsts}\n"
        f"more than asked (from the {FIRST_LOOK}th request): {'; '.join(over) or 'none'}\n"
        f"cross-check against the guard's window every 10th request: {check['disagreements']} "
        f"disagreements in {check['checks']} checks ({result['monitorSeconds']} s)\n"
    )
    print(
        "Requests to a judgement at α = 0.05: requests_to_decide at a spread, "
        f"{priors[-1]} pseudo-requests ({priors[0]} in brackets), against trials_to_decide on "
        f"requests:\n| rate vs limit | trials_to_decide | "
        f"{' | '.join(f'spread {spread}' for spread in SPREADS)} |\n"
        f"|{' --- |' * (2 + len(SPREADS))}"
    )
    for key, row in result["requestsToDecideAlpha0.05"].items():
        chosen, other = row[f"priorRequests{priors[-1]}"], row[f"priorRequests{priors[0]}"]
        cells = " | ".join(
            f"{_count(chosen[str(spread)])} ({_count(other[str(spread)])})" for spread in SPREADS
        )
        print(f"| {key.replace('vs', ' vs ')} | {_count(row['trialsToDecide'])} | {cells} |")
    us = result["microsecondsPerCall"]
    print(
        f"\nµs per call: ratio_confidence_sequence {us['ratioConfidenceSequence']}; "
        f"requests_to_decide {us['requestsToDecide']}"
    )


def _count(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=2000)
    parser.add_argument("--horizon", type=int, default=10000, help="draws per stream")
    parser.add_argument("--ratio-streams", type=int, default=1000)
    parser.add_argument("--ratio-horizon", type=int, default=1000, help="requests per stream")
    parser.add_argument("--only", choices=("proportion", "ratio"), action="append")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", action="store_true", help="print the JSON, not the tables")
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/sequential_error.json")
    args = parser.parse_args()
    parts = args.only or ["proportion", "ratio"]
    result: dict[str, Any] = {}
    if "proportion" in parts:
        result.update(run(args.streams, args.horizon, args.seed))
    if "ratio" in parts:
        result["ratio"] = ratio_run(args.ratio_streams, args.ratio_horizon, args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    if args.json:
        print(json.dumps(result, indent=2))
        return
    if "proportion" in parts:
        show(result)
    if "ratio" in parts:
        show_ratio(result["ratio"])
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
