"""What mirroring costs the fleet's gateway (issue 18): the same streaming load through three
fleet gateways in front of one engine simulator, mirroring off, 5% and 100% of every class to
two arms (each an engine simulator behind its own gateway), rotated round by round in one run so
drift on a shared machine hits every mode alike.

Reports, per mode (added = mode minus mirroring off, same run):
- added TTFT p50 / p99 (client-side time to the first content chunk);
- the fleet gateway's CPU (its process, all threads) per 1000 requests;
- what the mirror did: requests sent to each arm, dropped, arm errors.

The load's requests are not greedy (no `temperature: 0`), so no output is compared: the cost
measured is sampling, queueing and sending. Processes: simulators and gateways are subprocesses,
the load generator runs here. Run: `.venv/bin/python bench/gateway_mirror.py --quick` (about
1 minute); writes bench/results/gateway_mirror.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from gateway_overhead import (
    GATEWAY_CONFIG,
    ROOT,
    Measured,
    Mode,
    Run,
    Sample,
    gateway,
    measure_round,
    simulator,
)

MODES = {"off": None, "5%": 0.05, "100%": 1.0}
ARMS = ("baseline", "quantized")


def fleet_config(share: float | None, arm_urls: dict[str, str]) -> dict[str, Any]:
    if share is None:
        return GATEWAY_CONFIG
    mirror = {
        "experiment": "bench",
        "arms": [{"name": name, "url": url} for name, url in arm_urls.items()],
        "baseline": ARMS[0],
        "sample": {c["name"]: share for c in GATEWAY_CONFIG["classes"]},
        "queueBound": 1024,
        "concurrency": 64,
    }
    return {**GATEWAY_CONFIG, "mirror": mirror}


async def mirror_counts(metrics_url: str) -> dict[str, float]:
    async with aiohttp.ClientSession() as session, session.get(metrics_url + "/metrics") as r:
        text = await r.text()
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.startswith("specfleet_mirror_") and s.name.endswith("_total") and s.value:
                key = s.name.removeprefix("specfleet_mirror_").removesuffix("_total")
                label = s.labels.get("arm") or s.labels.get("reason", "")
                counts[f"{key}:{label}"] = counts.get(f"{key}:{label}", 0.0) + s.value
    return counts


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    async with contextlib.AsyncExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        fleet_sim, fleet_pid = await stack.enter_async_context(simulator(args.time_scale))
        arm_urls = {}
        for name in ARMS:
            sim, _ = await stack.enter_async_context(simulator(args.time_scale))
            arm_urls[name], _, _ = await stack.enter_async_context(
                gateway(sim, GATEWAY_CONFIG, tmp)
            )
        fleets = {
            mode: await stack.enter_async_context(
                gateway(fleet_sim, fleet_config(share, arm_urls), tmp)
            )
            for mode, share in MODES.items()
        }
        samples = {mode: Sample(run=Run(max_tokens=args.max_tokens)) for mode in MODES}
        for _ in range(args.rounds):
            for mode, (url, _, pid) in fleets.items():
                seconds = args.duration / args.rounds
                fleet = Mode(mode, url, fleet_sim, fleet_pid, pid)
                await measure_round(fleet, args.concurrency, seconds, samples[mode])
        await asyncio.sleep(1.0)  # the last mirrored requests land
        mirrored = {mode: await mirror_counts(metrics) for mode, (_, metrics, _) in fleets.items()}
    measured = {mode: Measured.of(sample) for mode, sample in samples.items()}
    return {
        "settings": {
            "time_scale": args.time_scale,
            "duration_s_per_mode": args.duration,
            "rounds": args.rounds,
            "concurrency": args.concurrency,
            "max_tokens": args.max_tokens,
            "cpus": os.cpu_count(),
            "load_average": os.getloadavg(),
        },
        "modes": {mode: summary(measured, mode, mirrored[mode]) for mode in MODES},
    }


def summary(measured: dict[str, Measured], mode: str, mirrored: dict[str, float]) -> dict[str, Any]:
    m, off = measured[mode], measured["off"]
    return {
        "added_ttft_p50_ms": round(m.ttft_p50_ms - off.ttft_p50_ms, 3),
        "added_ttft_p99_ms": round(m.ttft_p99_ms - off.ttft_p99_ms, 3),
        "gateway_cpu_s_per_1000_requests": round(m.gateway_cpu_s / max(m.requests, 1) * 1000, 3),
        "mirror": mirrored,
        "measured": asdict(m),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="6 s per mode, 2 rounds")
    parser.add_argument("--time-scale", type=float, default=0.5)
    parser.add_argument("--duration", type=float, default=20.0, help="seconds per mode")
    parser.add_argument("--rounds", type=int, default=4, help="rotations of the three modes")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/gateway_mirror.json")
    args = parser.parse_args()
    if args.quick:
        args.duration, args.rounds = 6.0, 2
    result = asyncio.run(bench(args))
    for mode, row in result["modes"].items():
        m = row["measured"]
        print(
            f"{mode:>5}: {m['requests']} requests, TTFT p50 {m['ttft_p50_ms']:.2f} "
            f"p99 {m['ttft_p99_ms']:.2f} ms (added {row['added_ttft_p50_ms']:+.2f} / "
            f"{row['added_ttft_p99_ms']:+.2f} ms); gateway CPU "
            f"{row['gateway_cpu_s_per_1000_requests']:.3f} s / 1000 requests; "
            f"mirror {row['mirror']}"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
