"""The real vLLM (its CPU build, the tiny local model; `make real-engine`): start time, memory,
throughput, and what n-gram speculation buys against what the speedup model predicts.

Two engines run side by side from the same SpecModel, one rendered with speculation (n-gram)
and one without, and the rounds alternate between them so drift on a shared machine hits both
alike. Per engine: seconds from spawn to a healthy `/health`, RSS of its process group (pages
its processes share count once per process), output tokens/s at each concurrency. Then TPOT
(client side, streamed, per request: time from the first to the last token over the tokens
after the first; and the engine's own mean, `vllm:request_time_per_output_token_seconds`) on a
copy-heavy prompt set at concurrency 1, n-gram on vs off, beside the speedup two readings of
the engine's counters predict (free drafts, c = 0):
- from E = 1 + accepted / steps (mean acceptance length): as if every step drafted;
- from accepted / output tokens: n-gram drafts only on steps where the lookup matches, so the
  target runs output - accepted forwards for `output` tokens: speedup 1 / (1 - accepted/output).

Run: `.venv/bin/python bench/real_engine.py` (about 5 minutes); writes
bench/results/real_engine.json.
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
COUNTERS = {
    "steps": "vllm:spec_decode_num_drafts_total",
    "drafted": "vllm:spec_decode_num_draft_tokens_total",
    "accepted": "vllm:spec_decode_num_accepted_tokens_total",
    "output": "vllm:generation_tokens_total",
    # the engine's own per-request TPOT histogram
    "tpot_sum": "vllm:request_time_per_output_token_seconds_sum",
    "tpot_count": "vllm:request_time_per_output_token_seconds_count",
}


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


async def stream_one(client: AsyncOpenAI, prompt: str, max_tokens: int) -> tuple[int, float]:
    """(output tokens, TPOT seconds) of one greedy streamed completion."""
    start = time.perf_counter()
    first = last = 0.0
    tokens = 0
    stream = await client.chat.completions.create(
        model=real_engine.SERVED_NAME,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=max_tokens,
        temperature=0.0,
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


async def tpot_rounds(
    engines: list[Engine], rounds: int, max_tokens: int
) -> tuple[dict[str, list[float]], dict[str, dict[str, float]]]:
    """Client-side TPOT of every copy-heavy prompt, alternating engines; each engine's counter
    deltas over the same requests."""
    tpots: dict[str, list[float]] = {e.name: [] for e in engines}
    before = {e.name: e.counters() for e in engines}
    for _ in range(rounds):
        for prompt in COPY_HEAVY:
            for engine in engines:
                _, tpot = await stream_one(engine.client, prompt, max_tokens)
                tpots[engine.name].append(tpot)
    deltas = {}
    for engine in engines:
        after = engine.counters()
        deltas[engine.name] = {key: after[key] - before[engine.name][key] for key in after}
    return tpots, deltas


def predictions(counts: dict[str, float]) -> dict[str, float]:
    mean_acceptance_length = 1 + counts["accepted"] / counts["steps"]
    accepted_share = counts["accepted"] / counts["output"]
    return {
        "mean_acceptance_length": mean_acceptance_length,
        "acceptance_rate": counts["accepted"] / counts["drafted"],
        "accepted_per_output_token": accepted_share,
        "predicted_speedup_from_E": mean_acceptance_length,
        "predicted_speedup_from_accepted_share": 1 / (1 - accepted_share),
        **guard_model(counts),
    }


def guard_model(counts: dict[str, float]) -> dict[str, float]:
    """What the guard's speedup model (guard/speedup.py) makes of the same counters, at the
    SpecModel's draft cost and per-token compute with one request in flight (the TPOT
    rounds' concurrency): every decode step counted, those that drafted nothing included."""
    policy = Policy.of(parse_specmodel(SPECMODEL), None)
    steps = decode_steps(counts["output"], counts["accepted"]) or 1.0
    drafts = counts["drafted"] / steps
    unloaded = speedup(counts["output"] / steps, drafts, policy.draft_cost)
    return {
        "decode_steps": steps,
        "drafting_step_share": counts["steps"] / steps,
        "drafts_per_decode_step": drafts,
        "draft_cost": policy.draft_cost,
        "per_token_compute": policy.per_token_compute,
        "predicted_speedup_guard_model": unloaded
        * load_factor(1.0, drafts, policy.per_token_compute),
    }


async def measure(engines: list[Engine], args: argparse.Namespace) -> dict[str, Any]:
    levels: dict[str, dict[int, float]] = {e.name: {} for e in engines}
    for c in args.concurrency:
        rates = await throughput(engines, c, args.rounds, args.requests, args.max_tokens)
        for name, rate in rates.items():
            levels[name][c] = rate
    tpots, deltas = await tpot_rounds(engines, args.rounds, args.max_tokens)
    p50 = {name: statistics.median(values) for name, values in tpots.items()}
    engine_tpot = {name: d["tpot_sum"] / d["tpot_count"] for name, d in deltas.items()}
    counts = deltas["ngram"]
    mean = {name: statistics.fmean(values) for name, values in tpots.items()}
    return {
        "engines": {
            e.name: {
                "start_s": e.start_s,
                "rss_mib": group_rss_mib(e.engine.process.pid),
                "tokens_per_s": levels[e.name],
                "tpot_p50_ms": 1000 * p50[e.name],
                "engine_tpot_mean_ms": 1000 * engine_tpot[e.name],
            }
            for e in engines
        },
        "ngram_counts": counts,
        "measured_speedup": p50["off"] / p50["ngram"],
        "measured_speedup_engine_side": engine_tpot["off"] / engine_tpot["ngram"],
        "measured_speedup_of_mean_tpot": mean["off"] / mean["ngram"],
        **predictions(counts),
    }


def start(stack: ExitStack, build: real_engine.Build, name: str, spec: bool, log: Path) -> Engine:
    args = real_engine.engine_args(
        parse_specmodel(SPECMODEL), build, real_engine.free_port(), speculation=spec
    )
    began = time.monotonic()
    engine = stack.enter_context(real_engine.running(build, args, log))
    return Engine(name, engine, time.monotonic() - began)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--requests", type=int, default=8, help="per engine, level and round")
    parser.add_argument("--rounds", type=int, default=4, help="alternations of the engines")
    parser.add_argument("--max-tokens", type=int, default=128)
    args = parser.parse_args()
    build = real_engine.build()
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        # One at a time: two starts at once would share the two cores and time each other.
        engines = [
            start(stack, build, "off", False, Path(tmp) / "off.log"),
            start(stack, build, "ngram", True, Path(tmp) / "ngram.log"),
        ]
        result = asyncio.run(measure(engines, args))
    result["settings"] = {**vars(args), "k": K, "load_average": os.getloadavg()}
    for name, e in result["engines"].items():
        rates = ", ".join(f"c={c} {v:.0f} tok/s" for c, v in e["tokens_per_s"].items())
        print(
            f"{name:<6} start {e['start_s']:.1f} s  RSS {e['rss_mib']:.0f} MiB  {rates}  "
            f"TPOT p50 {e['tpot_p50_ms']:.2f} ms (engine's mean {e['engine_tpot_mean_ms']:.2f})"
        )
    print(
        f"n-gram k={K}: measured speedup {result['measured_speedup']:.2f}x "
        f"(engine side {result['measured_speedup_engine_side']:.2f}x); predicted "
        f"{result['predicted_speedup_from_E']:.2f}x from E = 1 + accepted/steps, "
        f"{result['predicted_speedup_from_accepted_share']:.2f}x from accepted/output "
        f"({result['accepted_per_output_token']:.2f}); acceptance rate "
        f"{result['acceptance_rate']:.2f}"
    )
    model = result["predicted_speedup_guard_model"]
    print(
        f"guard model: {model:.2f}x at c = {result['draft_cost']} "
        f"({result['drafting_step_share']:.0%} of decode steps drafted); measured / model "
        f"{result['measured_speedup'] / model:.2f} (p50 TPOT), "
        f"{result['measured_speedup_of_mean_tpot'] / model:.2f} (mean TPOT)"
    )
    out = ROOT / "bench" / "results" / "real_engine.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
