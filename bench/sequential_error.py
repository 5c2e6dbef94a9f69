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

Run: `.venv/bin/python bench/sequential_error.py [--streams 2000] [--horizon 10000] [--json]`
(about 40 s); prints a table (or, with --json, the JSON) and writes
bench/results/sequential_error.json.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from pathlib import Path
from typing import Any

from specfleet.guard.sequential import PRIOR, confidence_sequence, trials_to_decide
from specfleet.guard.speedup import wilson_interval

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
        "crossCheck": {
            "checks": sum(c["checks"] for c in checked),
            "disagreements": sum(c["disagreements"] for c in checked),
        },
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=2000)
    parser.add_argument("--horizon", type=int, default=10000, help="draws per stream")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", action="store_true", help="print the JSON, not the tables")
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/sequential_error.json")
    args = parser.parse_args()
    result = run(args.streams, args.horizon, args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        show(result)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
