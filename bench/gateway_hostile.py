"""The gateway sidecar under a long hostile mix (issue 17): remote `$ref`s to a server that
never answers, a distinct large schema on every request, backtracking patterns, exponential
local references, unsatisfiable schemas, bodies nested past the parser, malformed bodies and
fields, beside ordinary streams. Upstream is the engine simulator (`specfleet-testbed engine`).

Reports the gateway's RSS (VmRSS of its process) after a warm-up and after the mix, its peak
(VmHWM), and the worst stall of its event loop: a probe coroutine on the gateway's own loop
sleeps 5 ms at a time and records how late it wakes (`/healthz` timed from here is reported
too, but it includes this process's own delays). Also: connections the tarpit received (must
be 0), the gateway's outcomes and unjudged quality checks by reason.

Processes: simulator and gateway (this script in `--serve-gateway` mode: `specfleet gateway`'s
server and loop, plus the probe) are subprocesses; the tarpit and the load run here.
Run: `.venv/bin/python bench/gateway_hostile.py` (about a minute); prints the numbers and the
JSON, and writes bench/results/gateway_hostile.json.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import uvloop
import yaml
from prometheus_client.parser import text_string_to_metric_families

from gateway_overhead import free_port, process

ROOT = Path(__file__).resolve().parent.parent
TESTBED = [sys.executable, "-c", "from specfleet_testbed.cli import main; main()"]
ENGINE_ARGS = [
    "meta-llama/Llama-3.1-8B-Instruct", "--served-model-name", "llama",
    "--speculative-config",
    json.dumps({"method": "eagle3", "model": "d/eagle3", "num_speculative_tokens": 3}),
    "--per-request-spec-decode-metrics", "summary",
    "--enable-auto-tool-choice", "--tool-call-parser", "llama3_json",
]  # fmt: skip
GATEWAY_CONFIG = {
    "specmodel": "bench",
    "engine": "vllm",
    "servedName": "llama",
    "classes": [{"name": "chat"}],
    "defaultClass": "chat",
    "numSpeculativeTokens": 3,
}
MESSAGES = [{"role": "user", "content": "What is the weather in Oslo?"}]


async def serve_gateway(
    config: Path, upstream: str, port: int, metrics_port: int
) -> dict[str, float]:
    """The gateway as `specfleet gateway` runs it, with a lateness probe on its loop, until
    SIGTERM; then the probe's numbers."""
    from specfleet.gateway.config import load_gateway_config
    from specfleet.gateway.proxy import ProxySettings
    from specfleet.gateway.server import Address, GatewayServer, run

    server = GatewayServer(
        load_gateway_config(config),
        ProxySettings(upstream=upstream),
        Address("127.0.0.1", port),
        Address("127.0.0.1", metrics_port),
    )
    late: list[float] = []
    busy: list[float] = []

    async def probe() -> None:
        while True:
            wall, cpu = time.perf_counter(), time.process_time()
            await asyncio.sleep(0.005)
            late.append(time.perf_counter() - wall - 0.005)
            busy.append(time.process_time() - cpu)

    prober = asyncio.create_task(probe())
    await run(server)
    prober.cancel()
    return {
        "max": max(late), "p99": percentile(late, 0.99), "wakeups": len(late),
        "busy_max": max(busy), "busy_p99": percentile(busy, 0.99),
    }  # fmt: skip


def read_json(path: Path) -> Any:
    return json.loads(path.read_text())


def rss_kib(pid: int) -> dict[str, int]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0])
    return fields


# ------------------------------------------------------------------ the hostile mix


def with_schema(schema: Any, stream: bool = False) -> dict[str, Any]:
    tool = {"type": "function", "function": {"name": "f", "parameters": schema}}
    return {
        "model": "llama",
        "messages": MESSAGES,
        "tools": [tool],
        "tool_choice": "required",
        "max_tokens": 32,
        "stream": stream,
    }


def structured(schema: Any) -> dict[str, Any]:
    response_format = {"type": "json_schema", "json_schema": {"name": "r", "schema": schema}}
    return {"model": "llama", "messages": MESSAGES, "response_format": response_format}


def large_schema(i: int, size: int) -> dict[str, Any]:
    """Distinct per request (1300 properties: ~60 KB): what filled the old cache."""
    properties = {f"p{i}_{j}": {"type": "string", "maxLength": j} for j in range(size)}
    return {"type": "object", "properties": properties}


def exponential_refs(depth: int = 30) -> dict[str, Any]:
    defs: dict[str, Any] = {
        f"d{n}": {"anyOf": [{"$ref": f"#/$defs/d{n + 1}"}] * 2} for n in range(depth)
    }
    defs[f"d{depth}"] = {"type": "integer"}
    return {"$defs": defs, "$ref": "#/$defs/d0"}


def request(kind: str, i: int, tarpit: str) -> tuple[bytes, str]:
    """(body, what it is) for the i-th request of a kind."""
    backtracking = {"type": "object", "properties": {"a": {"type": "string", "pattern": "^(a+)+$"}}}
    bodies: dict[str, Any] = {
        "remote_ref": lambda: with_schema({"$ref": f"{tarpit}/{i}.json"}),
        "remote_ref_output": lambda: structured({"$ref": f"{tarpit}/{i}.json"}),
        "large_tool_schema": lambda: with_schema(large_schema(i, 120)),  # fits the context
        "large_output_schema": lambda: structured(large_schema(i, 1300)),
        "backtracking_pattern": lambda: structured(backtracking),
        "exponential_refs": lambda: with_schema(exponential_refs()),
        "unsatisfiable": lambda: with_schema({"type": "object", "required": ["a"], "not": {}}),
        "ordinary_stream": lambda: {
            "model": "llama", "messages": MESSAGES, "stream": True, "stream_options": {},
            "max_tokens": 64,
        },
    }  # fmt: skip
    raw: dict[str, bytes] = {
        "deep_body": b"[" * 200_000 + b"]" * 200_000,
        "not_json": b'{"model": "llama", "messages": [',
        "wrong_type": b'{"model": "llama", "messages": [], "stream": "yes"}',
    }
    if kind in raw:
        return raw[kind], kind
    return json.dumps(bodies[kind]()).encode(), kind


KINDS = [
    "remote_ref", "remote_ref_output", "large_tool_schema", "large_output_schema",
    "backtracking_pattern",
    "exponential_refs", "unsatisfiable", "deep_body", "not_json", "wrong_type",
    "ordinary_stream", "ordinary_stream",
]  # fmt: skip


class Tarpit:
    """Accepts connections, never answers: a remote `$ref` fetched here would hang."""

    def __init__(self) -> None:
        self.connections = 0

    async def hold(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        await reader.read()


async def hostile_load(
    url: str, tarpit: str, total: int, concurrency: int, kinds: list[str]
) -> tuple[Counter[str], Counter[str]]:
    statuses: Counter[str] = Counter()
    failures: Counter[str] = Counter()
    numbers = itertools.count()
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def worker() -> None:
            while (i := next(numbers)) < total:
                body, kind = request(kinds[i % len(kinds)], i, tarpit)
                headers = {"Content-Type": "application/json"}
                try:
                    async with session.post(url, data=body, headers=headers) as r:
                        await r.read()
                        statuses[f"{kind} {r.status}"] += 1
                except (aiohttp.ClientError, TimeoutError) as exc:
                    failures[f"{kind} {type(exc).__name__}"] += 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return statuses, failures


async def probe(url: str, stop: asyncio.Event, into: list[float]) -> None:
    """/healthz every 10 ms, timed from here."""
    async with aiohttp.ClientSession() as session:
        while not stop.is_set():
            started = time.perf_counter()
            async with session.get(url) as r:
                await r.read()
            into.append(time.perf_counter() - started)
            await asyncio.sleep(0.01)


async def scrape(url: str) -> dict[str, float]:
    async with aiohttp.ClientSession() as session, session.get(url) as r:
        text = await r.text()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.value and s.name.endswith("_total"):
                labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()) if k != "class")
                out[f"{s.name}{{{labels}}}"] = s.value
    return out


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    tarpit = Tarpit()
    server = await asyncio.start_server(tarpit.hold, "127.0.0.1", 0)
    tarpit_url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    sim_port, gw_port, metrics_port = free_port(), free_port(), free_port()
    sim_url, gw_url = f"http://127.0.0.1:{sim_port}", f"http://127.0.0.1:{gw_port}"
    metrics_url = f"http://127.0.0.1:{metrics_port}"
    sim_argv = [
        *TESTBED, "engine", "--engine", "vllm", "--listen", f"127.0.0.1:{sim_port}",
        "--time-scale", str(args.time_scale), "--seed", "7", "--", *ENGINE_ARGS,
    ]  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "gateway.yaml"
        config.write_text(yaml.safe_dump(GATEWAY_CONFIG))
        gw_argv = [
            sys.executable, __file__, "--serve-gateway", str(config), sim_url,
            str(gw_port), str(metrics_port), str(Path(tmp) / "loop.json"),
        ]  # fmt: skip
        async with (
            process(sim_argv, sim_url + "/health"),
            process(gw_argv, metrics_url + "/healthz") as gateway,
        ):
            await hostile_load(gw_url + "/v1/chat/completions", tarpit_url, 40, 4, args.kinds)
            before = rss_kib(gateway.pid)
            healthz: list[float] = []
            stop = asyncio.Event()
            prober = asyncio.create_task(probe(metrics_url + "/healthz", stop, healthz))
            started = time.perf_counter()
            statuses, failures = await hostile_load(
                gw_url + "/v1/chat/completions",
                tarpit_url,
                args.requests,
                args.concurrency,
                args.kinds,
            )
            seconds = time.perf_counter() - started
            stop.set()
            await prober
            after = rss_kib(gateway.pid)
            metrics = await scrape(metrics_url + "/metrics")
        loop = read_json(Path(tmp) / "loop.json")
    server.close()
    return {
        "requests": args.requests,
        "concurrency": args.concurrency,
        "seconds": round(seconds, 2),
        "rss_mib_before": round(before["VmRSS"] / 1024, 1),
        "rss_mib_after": round(after["VmRSS"] / 1024, 1),
        "rss_mib_peak": round(after["VmHWM"] / 1024, 1),
        "kinds": sorted(set(args.kinds)),
        "worst_stall_ms": round(loop["max"] * 1000, 1),
        "stall_p99_ms": round(loop["p99"] * 1000, 2),
        "loop_wakeups": loop["wakeups"],
        # CPU the gateway spent between two probe wakeups: the stall its own work caused,
        # without the time the OS ran the simulator and this load instead (2 shared cores)
        "worst_stall_cpu_ms": round(loop["busy_max"] * 1000, 1),
        "stall_cpu_p99_ms": round(loop["busy_p99"] * 1000, 2),
        "healthz_worst_ms": round(max(healthz) * 1000, 1),
        "healthz_p50_ms": round(percentile(healthz, 0.5) * 1000, 2),
        "healthz_p99_ms": round(percentile(healthz, 0.99) * 1000, 2),
        "tarpit_connections": tarpit.connections,
        "statuses": dict(sorted(statuses.items())),
        "client_failures": dict(sorted(failures.items())),
        "gateway_metrics": metrics,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2200)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--time-scale", type=float, default=0.02)
    parser.add_argument(
        "--kinds", nargs="+", default=KINDS, choices=sorted(set(KINDS)),
        help="the mix (default: all; `ordinary_stream` alone is the baseline)",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/gateway_hostile.json")
    parser.add_argument("--serve-gateway", nargs=5, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_gateway is not None:
        config, upstream, port, metrics_port, stats = args.serve_gateway
        loop = uvloop.run(serve_gateway(Path(config), upstream, int(port), int(metrics_port)))
        Path(stats).write_text(json.dumps(loop))
        return
    result = asyncio.run(bench(args))
    print(
        f"gateway RSS {result['rss_mib_before']} MiB before, {result['rss_mib_after']} MiB "
        f"after {result['requests']} hostile requests ({result['seconds']} s), peak "
        f"{result['rss_mib_peak']} MiB; worst event-loop stall {result['worst_stall_ms']} ms "
        f"wall, {result['worst_stall_cpu_ms']} ms of the gateway's CPU (p99 "
        f"{result['stall_p99_ms']} / {result['stall_cpu_p99_ms']} ms over "
        f"{result['loop_wakeups']} wakeups; /healthz "
        f"worst {result['healthz_worst_ms']} ms from here); tarpit connections "
        f"{result['tarpit_connections']}"
    )
    print(json.dumps(result, indent=2))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
