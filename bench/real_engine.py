"""The real vLLM (its CPU build, the tiny local model; `make real-engine`): start time, memory,
throughput, and what n-gram speculation buys against what the guard's speedup model predicts.

Two engines run side by side from the same SpecModel, one rendered with speculation (n-gram)
and one without, and the requests alternate between them so drift on a shared machine hits both
alike. Per engine: seconds from spawn to a healthy `/health`, RSS of its process group (pages
its processes share count once per process), output tokens/s at each concurrency (greedy,
copy-heavy prompts). Then, at concurrency 1, two regimes on both engines:
- greedy copy-heavy prompts: n-gram drafts on most decode steps;
- sampled prose at temperature 1.0: n-gram finds almost nothing to draft.
Per prompt and per regime: the measured speedup (the engines' own mean TPOT,
`vllm:request_time_per_output_token_seconds`, off over on; client-side p50 TPOT beside it) and
the n-gram engine's counter deltas, from which the guard's model (`guard/speedup.py`, every
decode step counted, load factor at one request in flight) predicts

    speedup = tokens per step / (1 + o + δ·c).

(c, o) are fitted on one regime's prompts (least squares on tokens per step / measured - 1 =
o + δ·c; with too little spread in δ there, c stays the SpecModel's and o alone is fitted) and
checked on the other, both ways; the SpecModel's own (c, o) are checked on both.

Run: `.venv/bin/python bench/real_engine.py` (about 10 minutes); writes
bench/results/real_engine.json.

`--pair`: draft-model speculation with the pair of hack/tiny_model.py (a wide, deep target and
its 1-layer prefix as the draft) against plain decoding. One engine at a time (a pair engine
wants most of two cores), in sessions that alternate off, k=K1, k=K2, ... `--alternations`
times; per session: start time, RSS, greedy TPOT (engine-side mean and client p50) and tokens/s
at one stream, tokens/s at `--streams`, the load average, and with speculation the greedy and
the sampled (temperature 1.0) acceptance from the engine's counters. Writes
bench/results/real_engine_pair.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from openai import AsyncOpenAI

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from e2e import real_engine  # noqa: E402

from specfleet.api.validation import parse_specmodel  # noqa: E402
from specfleet.guard import Policy  # noqa: E402
from specfleet.guard.speedup import decode_steps, load_factor, speedup  # noqa: E402

K = 5
SPECMODEL = real_engine.tiny_specmodel(
    {"method": "ngram", "numSpeculativeTokens": K, "ngram": {"minMatch": 2, "maxMatch": 4}}
)
COPY_HEAVY = [
    "Repeat this code exactly:\ndef add(a, b):\n    return a + b\ndef add(a, b):\n    return a + b",
    "Fix the typo and print the rest as it is: the draft token was accepted, the draft token "
    "was accepted, the draft token was acepted, the draft token was accepted.",
    'Copy the JSON: {"model": "tiny", "tokens": [1, 2, 3], "model": "tiny", "tokens": [1, 2, 3]}',
    "for i in range(10):\n    print(i)\nfor i in range(10):\n    print(i)\nfor i in range(10):",
]
PROSE = [
    "Write a short story about a lighthouse keeper who finds a letter in a bottle.",
    "Describe a walk through a market town on a rainy autumn morning.",
    "Explain to a child why the sky changes colour at sunset, in your own words.",
    "Tell me about a journey by night train across the mountains.",
]
REGIMES = {"greedy copy-heavy": (COPY_HEAVY, 0.0), "sampled prose": (PROSE, 1.0)}
COUNTERS = {
    "steps": "vllm:spec_decode_num_drafts_total",
    "drafted": "vllm:spec_decode_num_draft_tokens_total",
    "accepted": "vllm:spec_decode_num_accepted_tokens_total",
    "output": "vllm:generation_tokens_total",
    # the engine's own per-request TPOT histogram
    "tpot_sum": "vllm:request_time_per_output_token_seconds_sum",
    "tpot_count": "vllm:request_time_per_output_token_seconds_count",
}
SETTLE_S = 0.5
"""Before reading the counters after a prompt's requests: the last request's are in."""
MIN_DRAFT_SPREAD = 0.5
"""Drafts per step a regime's prompts must span to fit c and o apart."""


@dataclass
class Engine:
    name: str
    engine: real_engine.RealEngine
    start_s: float

    @property
    def client(self) -> AsyncOpenAI:
        return AsyncOpenAI(base_url=f"{self.engine.url}/v1", api_key="unused", max_retries=0)

    def counters(self) -> dict[str, float]:
        totals = real_engine.samples(self.engine.metrics())
        return {key: sum(totals.get(name, {}).values()) for key, name in COUNTERS.items()}


@dataclass
class Block:
    """One prompt's requests on both engines: client-side TPOTs and counter deltas."""

    regime: str
    tpots: dict[str, list[float]]
    counts: dict[str, dict[str, float]]


@dataclass
class Point:
    """A prompt or a regime, n-gram on against off at one request in flight."""

    tokens_per_step: float
    drafts_per_step: float
    drafting_step_share: float
    acceptance_rate: float | None
    measured: float
    """Engine-side mean TPOT, off over on."""
    measured_client_p50: float

    def predicted(self, cost: float, overhead: float, per_token_compute: float) -> float:
        load = load_factor(1.0, self.drafts_per_step, per_token_compute)
        return speedup(self.tokens_per_step, self.drafts_per_step, cost, overhead) * load


def group_rss_mib(leader: int) -> float:
    """RSS of every process in `leader`'s process group (API server and engine core)."""
    total_kib = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.getpgid(int(entry.name)) != leader:
                continue
            status = (entry / "status").read_text()
        except (ProcessLookupError, FileNotFoundError, PermissionError):
            continue
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                total_kib += int(line.split()[1])
    return total_kib / 1024


async def stream_one(
    client: AsyncOpenAI, prompt: str, max_tokens: int, temperature: float = 0.0
) -> tuple[int, float]:
    """(output tokens, TPOT seconds) of one streamed completion."""
    start = time.perf_counter()
    first = last = 0.0
    tokens = 0
    stream = await client.chat.completions.create(
        model=real_engine.SERVED_NAME,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=max_tokens,
        temperature=temperature,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            last = time.perf_counter() - start
            first = first or last
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    return tokens, (last - first) / max(tokens - 1, 1)


async def throughput(
    engines: list[Engine], concurrency: int, rounds: int, requests: int, max_tokens: int
) -> dict[str, float]:
    """Output tokens/s per engine of `requests` greedy streams per round, `concurrency` at a
    time, the engines alternating round by round."""
    tokens = {e.name: 0 for e in engines}
    seconds = {e.name: 0.0 for e in engines}

    async def worker(engine: Engine, client: AsyncOpenAI, queue: list[int]) -> None:
        while queue:
            i = queue.pop()
            n, _ = await stream_one(client, COPY_HEAVY[i % len(COPY_HEAVY)], max_tokens)
            tokens[engine.name] += n

    for _ in range(rounds):
        for engine in engines:
            client, queue = engine.client, list(range(requests))
            start = time.perf_counter()
            await asyncio.gather(*(worker(engine, client, queue) for _ in range(concurrency)))
            seconds[engine.name] += time.perf_counter() - start
    return {name: tokens[name] / seconds[name] for name in tokens}


async def blocks(engines: list[Engine], rounds: int, max_tokens: int) -> list[Block]:
    """Every prompt of every regime `rounds` times on each engine, alternating; the counters
    are read around each prompt's requests."""
    found = []
    for regime, (prompts, temperature) in REGIMES.items():
        for prompt in prompts:
            before = {e.name: e.counters() for e in engines}
            tpots: dict[str, list[float]] = {e.name: [] for e in engines}
            for _ in range(rounds):
                for engine in engines:
                    _, tpot = await stream_one(engine.client, prompt, max_tokens, temperature)
                    tpots[engine.name].append(tpot)
            await asyncio.sleep(SETTLE_S)
            counts = {}
            for engine in engines:
                after = engine.counters()
                counts[engine.name] = {key: after[key] - before[engine.name][key] for key in after}
            found.append(Block(regime, tpots, counts))
    return found


def point(group: list[Block]) -> Point:
    def total(engine: str, key: str) -> float:
        return sum(b.counts[engine][key] for b in group)

    def tpot(engine: str) -> float:
        return total(engine, "tpot_sum") / total(engine, "tpot_count")

    def p50(engine: str) -> float:
        return statistics.median([t for b in group for t in b.tpots[engine]])

    output, accepted, drafted = (total("ngram", k) for k in ("output", "accepted", "drafted"))
    steps = decode_steps(output, accepted) or 1.0
    return Point(
        tokens_per_step=output / steps,
        drafts_per_step=drafted / steps,
        drafting_step_share=total("ngram", "steps") / steps,
        acceptance_rate=accepted / drafted if drafted else None,
        measured=tpot("off") / tpot("ngram"),
        measured_client_p50=p50("off") / p50("ngram"),
    )


def fit(points: list[Point], prior_cost: float, per_token_compute: float) -> tuple[float, float]:
    """(c, o) by least squares on tokens per step · load / measured - 1 = o + δ·c; c stays
    `prior_cost` when the points' δ span too little to tell the two apart."""
    xs = [p.drafts_per_step for p in points]
    ys = [
        p.tokens_per_step * load_factor(1.0, p.drafts_per_step, per_token_compute) / p.measured
        - 1.0
        for p in points
    ]
    if max(xs) - min(xs) < MIN_DRAFT_SPREAD:
        residuals = [y - prior_cost * x for x, y in zip(xs, ys, strict=True)]
        return prior_cost, statistics.fmean(residuals)
    slope, intercept = statistics.linear_regression(xs, ys)
    return slope, intercept


def model_check(blocks_run: list[Block]) -> dict[str, Any]:
    """Each regime's measured speedup against the model at the SpecModel's (c, o) and at the
    (c, o) fitted on the other regime's prompts."""
    policy = Policy.of(parse_specmodel(SPECMODEL), None)
    g = policy.per_token_compute
    regimes: dict[str, Any] = {}
    for regime in REGIMES:
        group = [b for b in blocks_run if b.regime == regime]
        prompts = [point([b]) for b in group]
        cost, overhead = fit(prompts, policy.draft_cost, g)
        regimes[regime] = {
            "point": point(group),
            "prompts": prompts,
            "fit": {"draft_cost": cost, "step_overhead": overhead},
        }
    out: dict[str, Any] = {
        "specmodel": {"draft_cost": policy.draft_cost, "step_overhead": policy.step_overhead},
        "per_token_compute": g,
        "regimes": {},
    }
    for regime, found in regimes.items():
        p: Point = found["point"]
        other = next(r for r in regimes if r != regime)
        fitted = regimes[other]["fit"]
        at_spec = p.predicted(policy.draft_cost, policy.step_overhead, g)
        at_fit = p.predicted(fitted["draft_cost"], fitted["step_overhead"], g)
        out["regimes"][regime] = {
            **vars(p),
            "prompts": [vars(q) for q in found["prompts"]],
            "fit_on_these_prompts": found["fit"],
            "predicted_at_specmodel": at_spec,
            "measured_over_predicted_at_specmodel": p.measured / at_spec,
            "fit_on_other_regime": {"regime": other, **fitted},
            "predicted_at_other_regimes_fit": at_fit,
            "measured_over_predicted_at_other_regimes_fit": p.measured / at_fit,
        }
    return out


async def measure(engines: list[Engine], args: argparse.Namespace) -> dict[str, Any]:
    levels: dict[str, dict[int, float]] = {e.name: {} for e in engines}
    for c in args.concurrency:
        rates = await throughput(engines, c, args.rounds, args.requests, args.max_tokens)
        for name, rate in rates.items():
            levels[name][c] = rate
    found = await blocks(engines, args.rounds, args.max_tokens)
    return {
        "engines": {
            e.name: {
                "start_s": e.start_s,
                "rss_mib": group_rss_mib(e.engine.process.pid),
                "tokens_per_s": levels[e.name],
            }
            for e in engines
        },
        "model": model_check(found),
        "counts": [{"regime": b.regime, **b.counts} for b in found],
    }


def start(stack: ExitStack, build: real_engine.Build, name: str, spec: bool, log: Path) -> Engine:
    args = real_engine.engine_args(
        parse_specmodel(SPECMODEL), build, real_engine.free_port(), speculation=spec
    )
    began = time.monotonic()
    engine = stack.enter_context(real_engine.running(build, args, log))
    return Engine(name, engine, time.monotonic() - began)


def report(result: dict[str, Any]) -> None:
    for name, e in result["engines"].items():
        rates = ", ".join(f"c={c} {v:.0f} tok/s" for c, v in e["tokens_per_s"].items())
        print(f"{name:<6} start {e['start_s']:.1f} s  RSS {e['rss_mib']:.0f} MiB  {rates}")
    model = result["model"]
    spec = model["specmodel"]
    print(
        f"n-gram k={K} on vs off, one request in flight; model tokens/step / (1 + o + δ·c) at "
        f"SpecModel c={spec['draft_cost']}, o={spec['step_overhead']}"
    )
    for regime, r in model["regimes"].items():
        other = r["fit_on_other_regime"]
        own = r["fit_on_these_prompts"]
        print(
            f"{regime:<18} tokens/step {r['tokens_per_step']:.2f}  δ {r['drafts_per_step']:.2f}  "
            f"measured {r['measured']:.2f}x (client p50 {r['measured_client_p50']:.2f}x)  "
            f"model at SpecModel {r['predicted_at_specmodel']:.2f}x "
            f"(measured/model {r['measured_over_predicted_at_specmodel']:.2f})  "
            f"model at c={other['draft_cost']:.3f}, o={other['step_overhead']:.3f} fitted on "
            f"{other['regime']} {r['predicted_at_other_regimes_fit']:.2f}x "
            f"(measured/model {r['measured_over_predicted_at_other_regimes_fit']:.2f}); "
            f"own fit c={own['draft_cost']:.3f}, o={own['step_overhead']:.3f}"
        )


PAIR_PROMPTS = COPY_HEAVY + PROSE
PAIR_SAMPLED = 1.0


def pair_specmodel(k: int) -> dict[str, Any]:
    return real_engine.tiny_specmodel(
        {"method": "draft_model", "draftModel": "local/pair-draft", "numSpeculativeTokens": k},
        source=real_engine.PAIR_SOURCE,
    )


async def pair_session(engine: Engine, args: argparse.Namespace) -> dict[str, Any]:
    """One engine's greedy TPOT and tokens/s at one stream and at `args.streams`, and the
    acceptance of greedy and of sampled requests from its counters."""
    client = engine.client
    # warm-up, not counted: a new engine's first requests of each batch shape stall
    await stream_one(client, PAIR_PROMPTS[0], args.max_tokens)
    await asyncio.gather(*(stream_one(client, p, 16) for p in PAIR_PROMPTS[: args.streams]))
    load = [os.getloadavg()[0]]
    before = engine.counters()
    tpots, began = [], time.perf_counter()
    for prompt in PAIR_PROMPTS:
        _, tpot = await stream_one(client, prompt, args.max_tokens)
        tpots.append(tpot)
    elapsed = time.perf_counter() - began
    await asyncio.sleep(SETTLE_S)
    greedy = {k: v - before[k] for k, v in engine.counters().items()}
    load.append(os.getloadavg()[0])

    queue = list(range(len(PAIR_PROMPTS) * args.streams // 2))

    async def worker() -> int:
        n = 0
        while queue:
            i = queue.pop()
            n += (await stream_one(client, PAIR_PROMPTS[i % len(PAIR_PROMPTS)], args.max_tokens))[0]
        return n

    began = time.perf_counter()
    tokens = sum(await asyncio.gather(*(worker() for _ in range(args.streams))))
    streams_rate = tokens / (time.perf_counter() - began)
    load.append(os.getloadavg()[0])

    before = engine.counters()
    for prompt in PROSE:
        await stream_one(client, prompt, args.max_tokens // 2, PAIR_SAMPLED)
    await asyncio.sleep(SETTLE_S)
    sampled = {k: v - before[k] for k, v in engine.counters().items()}

    def acceptance(counts: dict[str, float]) -> float | None:
        return counts["accepted"] / counts["drafted"] if counts["drafted"] else None

    return {
        "tpot_ms": 1000 * greedy["tpot_sum"] / greedy["tpot_count"],
        "client_p50_tpot_ms": 1000 * statistics.median(tpots),
        "tokens_per_s_1": greedy["output"] / elapsed,
        f"tokens_per_s_{args.streams}": streams_rate,
        "greedy_acceptance": acceptance(greedy),
        "sampled_acceptance": acceptance(sampled),
        "load_average_1m": load,
        "rss_mib": group_rss_mib(engine.engine.process.pid),
    }


def pair_main(args: argparse.Namespace) -> None:
    build = real_engine.build()
    if args.models:
        build = real_engine.Build(vllm=build.vllm, models=args.models)
    variants = [0, *args.k]
    sessions: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for alternation in range(args.alternations):
            for k in variants:
                specmodel = parse_specmodel(pair_specmodel(k or 1))
                port = real_engine.free_port()
                argv = real_engine.engine_args(specmodel, build, port, speculation=bool(k))
                log = Path(tmp) / f"{alternation}-{k}.log"
                began = time.monotonic()
                with real_engine.running(build, argv, log, iomp=args.iomp) as running:
                    name = f"k={k}" if k else "off"
                    start_s = time.monotonic() - began
                    found = asyncio.run(pair_session(Engine(name, running, start_s), args))
                session = {"alternation": alternation, "k": k, "start_s": start_s, **found}
                sessions.append(session)
                print(json.dumps(session), flush=True)
    summary = pair_summary(sessions, args)
    out = ROOT / "bench" / "results" / "real_engine_pair.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "settings": vars(args) | {"models": str(build.models)},
                "sessions": sessions,
                "summary": summary,
            },
            indent=2,
        )
        + "\n"
    )


def pair_summary(sessions: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """Per k: each alternation's speedup over that alternation's off session, and medians."""
    off = {s["alternation"]: s for s in sessions if s["k"] == 0}
    rate = f"tokens_per_s_{args.streams}"
    out: dict[str, Any] = {}
    for k in args.k:
        runs = [s for s in sessions if s["k"] == k]
        speedups = [off[s["alternation"]]["tpot_ms"] / s["tpot_ms"] for s in runs]
        streams = [s[rate] / off[s["alternation"]][rate] for s in runs]
        out[f"k={k}"] = {
            "tpot_speedup": speedups,
            "streams_speedup": streams,
            "greedy_acceptance": [s["greedy_acceptance"] for s in runs],
            "sampled_acceptance": [s["sampled_acceptance"] for s in runs],
        }
        print(
            f"k={k}: TPOT speedup {statistics.median(speedups):.2f}x "
            f"(min {min(speedups):.2f}), {args.streams} streams "
            f"{statistics.median(streams):.2f}x (min {min(streams):.2f}), acceptance greedy "
            f"{min(a for a in out[f'k={k}']['greedy_acceptance'] if a is not None):.3f} "
            f"sampled {max(a for a in out[f'k={k}']['sampled_acceptance'] if a is not None):.3f}"
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--requests", type=int, default=8, help="per engine, level and round")
    parser.add_argument("--rounds", type=int, default=4, help="alternations of the engines")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--pair", action="store_true", help="draft-model speculation, the pair")
    parser.add_argument("--k", type=int, nargs="+", default=[3], help="with --pair")
    parser.add_argument("--streams", type=int, default=4, help="with --pair")
    parser.add_argument("--alternations", type=int, default=2, help="with --pair")
    parser.add_argument("--models", type=Path, help="with --pair: a models dir, not the build's")
    parser.add_argument(
        "--no-iomp",
        dest="iomp",
        action="store_false",
        help="with --pair: without Intel OpenMP preloaded (real_engine.engine_env)",
    )
    args = parser.parse_args()
    if args.pair:
        pair_main(args)
        return
    build = real_engine.build()
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        # One at a time: two starts at once would share the two cores and time each other.
        engines = [
            start(stack, build, "off", False, Path(tmp) / "off.log"),
            start(stack, build, "ngram", True, Path(tmp) / "ngram.log"),
        ]
        result = asyncio.run(measure(engines, args))
    result["settings"] = {**vars(args), "k": K, "load_average": os.getloadavg()}
    report(result)
    out = ROOT / "bench" / "results" / "real_engine.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
