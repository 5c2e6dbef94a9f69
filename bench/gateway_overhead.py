"""What the gateway sidecar costs: the same streaming load against the engine simulator,
directly and through `specfleet gateway`, at several concurrencies.

Reports, per concurrency:
- added TTFT p50 / p99 (client-side time to the first content chunk, gateway minus direct);
- added latency per streamed chunk p50 / p99: the simulator stamps every chunk with
  CLOCK_MONOTONIC when it writes it (`x_sent_ns`, shared by all processes on the host), the
  client subtracts it on arrival, so each chunk's one-way latency is measured, not inferred;
- gateway CPU seconds per 1000 streamed tokens (/proc/<pid>/stat of the gateway process);
- throughput (output tokens/s from the simulator's own counter) and the ratio at the top
  concurrency.

With `--routed`, the routed hop too: a second gateway routes every request's class to a plain
pool (`plainPool`, a simulator without speculation on another loopback port), as it does for a
class the guard switched off, and its added latency is measured against that plain simulator
directly (`routed_added_*`).

Processes: simulator and gateway are subprocesses, the load generator (aiohttp) runs here.
Run: `.venv/bin/python bench/gateway_overhead.py` (about 1.5 minutes; `--routed` doubles it);
writes bench/results/gateway_overhead.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import re
import signal
import socket
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml

ROOT = Path(__file__).resolve().parent.parent
SENT_STAMP = re.compile(rb'"x_sent_ns":(\d+)')
ARRIVED_STAMP = re.compile(rb'"x_arrived_ns":(\d+)')
MARKERS = itertools.count()
"""Each prompt's own marker, which bench/loopback.py finds on the wire."""
ENTRY = [sys.executable, "-c", "from specfleet.cli import main; main()"]
K = 3
ENGINE_ARGS = [
    "meta-llama/Llama-3.1-8B-Instruct",
    "--served-model-name",
    "llama",
    "--max-num-seqs",
    "256",
    "--speculative-config",
    json.dumps({"method": "eagle3", "model": "d/eagle3", "num_speculative_tokens": K}),
    "--per-request-spec-decode-metrics",
    "summary",
]
GATEWAY_CONFIG = {
    "specmodel": "bench",
    "engine": "vllm",
    "servedName": "llama",
    "classes": [
        {"name": "code", "match": {"headers": {"x-team": "code"}}},
        {"name": "tools", "match": {"hasTools": True}},
        {"name": "chat"},
    ],
    "defaultClass": "chat",
    "numSpeculativeTokens": K,
}
TICKS = os.sysconf("SC_CLK_TCK")


# ------------------------------------------------------------------ simulator subprocess


PLAIN_ENGINE_ARGS = [*ENGINE_ARGS[:5]]
"""The plain pool's engine: the same model, no speculative config."""


async def serve_sim(port: int, time_scale: float, plain: bool = False) -> None:
    """The simulator, with every chunk stamped with its send time and its request's arrival at
    the engine (when its stream began)."""
    from specfleet_testbed.engine import server as sim_server
    from specfleet_testbed.engine.args import parse_vllm

    original_init, original_send = sim_server._ChunkWriter.__init__, sim_server._ChunkWriter.send

    def arrived(self: Any, *args: Any) -> None:
        original_init(self, *args)
        self.x_arrived_ns = time.monotonic_ns()

    async def stamped(self: Any, chunk: dict[str, Any], trailing_space: bool = False) -> None:
        chunk["x_sent_ns"], chunk["x_arrived_ns"] = time.monotonic_ns(), self.x_arrived_ns
        await original_send(self, chunk, trailing_space)

    sim_server._ChunkWriter.__init__ = arrived  # type: ignore[method-assign]
    sim_server._ChunkWriter.send = stamped  # type: ignore[method-assign]
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    options = sim_server.SimOptions(time_scale=time_scale, seed=1)
    engine = parse_vllm(PLAIN_ENGINE_ARGS if plain else ENGINE_ARGS, env={})
    async with sim_server.serve(engine, options, port=port):
        await stop.wait()


# ----------------------------------------------------------------------------- load


@dataclass
class Run:
    ttft: list[float] = field(default_factory=list)
    path_ttft: list[float] = field(default_factory=list)
    """TTFT without the engine's own time: the request's way to the engine and the first
    token's way back. What a proxy adds to it is its own, whatever the engine's step phase."""
    chunk_latency: list[float] = field(default_factory=list)
    requests: int = 0
    errors: int = 0
    max_tokens: int = 128

    def merge(self, other: Run) -> None:
        self.ttft += other.ttft
        self.path_ttft += other.path_ttft
        self.chunk_latency += other.chunk_latency
        self.requests += other.requests
        self.errors += other.errors


async def one_stream(session: aiohttp.ClientSession, url: str, max_tokens: int, run: Run) -> None:
    body = {
        "model": "llama",
        "messages": [
            {"role": "user", "content": f"Tell me about speculative decoding. #r{next(MARKERS)}#"}
        ],
        "max_tokens": max_tokens,
        "stream": True,
    }
    started, started_ns = time.perf_counter(), time.monotonic_ns()
    first = True
    async with session.post(url + "/v1/chat/completions", json=body) as response:
        if response.status != 200:
            run.errors += 1
            await response.read()
            return
        async for line in response.content:
            if not line.startswith(b"data: {"):
                continue
            arrived = time.monotonic_ns()
            # Byte scans, not json.loads: the client must stay cheap or it measures itself.
            stamp = SENT_STAMP.search(line)
            if stamp:
                run.chunk_latency.append((arrived - int(stamp[1])) / 1e9)
            if first and b'"content":"' in line and b'"content":""' not in line:
                run.ttft.append(time.perf_counter() - started)
                engine = ARRIVED_STAMP.search(line)
                if stamp and engine:
                    way_there, way_back = int(engine[1]) - started_ns, arrived - int(stamp[1])
                    run.path_ttft.append((way_there + way_back) / 1e9)
                first = False
    run.requests += 1


async def load(url: str, concurrency: int, duration: float, max_tokens: int) -> Run:
    run = Run(max_tokens=max_tokens)
    deadline = time.perf_counter() + duration
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def worker() -> None:
            while time.perf_counter() < deadline:
                await one_stream(session, url, max_tokens, run)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return run


# ------------------------------------------------------------------------ measuring


def tree(pid: int) -> list[int]:
    """The process and its descendants (a proxy may run workers)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
    return out


def cpu_seconds(pid: int) -> float:
    """utime + stime of the process and its descendants, all threads."""
    return sum(cpu_split(pid))


def cpu_split(pid: int) -> tuple[float, float]:
    """(utime, stime) of the process and its descendants, all threads: its own work and the
    kernel's on its behalf (socket calls, mostly)."""
    user = system = 0
    for p in tree(pid):
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            user += int(fields[11])
            system += int(fields[12])
    return user / TICKS, system / TICKS


def rss_mib(pid: int) -> float:
    """Resident memory of the process and its descendants."""
    total = 0
    for p in tree(pid):
        with contextlib.suppress(OSError):
            found = re.search(r"VmRSS:\s+(\d+) kB", Path(f"/proc/{p}/status").read_text())
            total += int(found[1]) if found else 0
    return round(total / 1024, 1)


async def generated_tokens(sim_url: str) -> float:
    async with aiohttp.ClientSession() as session, session.get(sim_url + "/metrics") as r:
        text = await r.text()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vllm:generation_tokens_total")
    )


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


@dataclass
class Sample:
    """One mode's pooled observations over its rounds."""

    run: Run = field(default_factory=Run)
    seconds: float = 0.0
    tokens: float = 0.0
    gateway_cpu_s: float = 0.0
    gateway_user_cpu_s: float = 0.0
    simulator_cpu_s: float = 0.0
    client_cpu_s: float = 0.0
    gateway_rss_mib: float = 0.0


@dataclass
class Measured:
    seconds: float
    requests: int
    errors: int
    tokens: float
    tokens_per_s: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    path_ttft_p50_ms: float
    path_ttft_p99_ms: float
    chunk_p50_ms: float
    chunk_p99_ms: float
    chunks: int
    gateway_cpu_s: float
    simulator_cpu_s: float
    client_cpu_s: float
    gateway_rss_mib: float
    gateway_user_cpu_s: float = 0.0

    @classmethod
    def of(cls, sample: Sample) -> Measured:
        run = sample.run
        return cls(
            seconds=round(sample.seconds, 2),
            requests=run.requests,
            errors=run.errors,
            tokens=sample.tokens,
            tokens_per_s=round(sample.tokens / sample.seconds, 1),
            ttft_p50_ms=pct(run.ttft, 50) * 1e3,
            ttft_p99_ms=pct(run.ttft, 99) * 1e3,
            path_ttft_p50_ms=pct(run.path_ttft, 50) * 1e3,
            path_ttft_p99_ms=pct(run.path_ttft, 99) * 1e3,
            chunk_p50_ms=pct(run.chunk_latency, 50) * 1e3,
            chunk_p99_ms=pct(run.chunk_latency, 99) * 1e3,
            chunks=len(run.chunk_latency),
            gateway_cpu_s=round(sample.gateway_cpu_s, 3),
            gateway_user_cpu_s=round(sample.gateway_user_cpu_s, 3),
            simulator_cpu_s=round(sample.simulator_cpu_s, 3),
            client_cpu_s=round(sample.client_cpu_s, 3),
            gateway_rss_mib=sample.gateway_rss_mib,
        )


async def measure_round(mode: Mode, concurrency: int, seconds: float, into: Sample) -> None:
    """One timed run, added to `into` (warm the pool first: the first requests connect)."""
    max_tokens = into.run.max_tokens
    await load(mode.url, concurrency, min(0.5, seconds / 4), max_tokens)
    tokens0, t0 = await generated_tokens(mode.sim_url), time.time()
    gateway0 = cpu_split(mode.gateway_pid) if mode.gateway_pid else (0.0, 0.0)
    sim0, self0 = cpu_seconds(mode.sim_pid), time.process_time()
    run = await load(mode.url, concurrency, seconds, max_tokens)
    into.seconds += time.time() - t0
    if mode.gateway_pid:
        (user0, system0), (user1, system1) = gateway0, cpu_split(mode.gateway_pid)
        into.gateway_cpu_s += user1 + system1 - user0 - system0
        into.gateway_user_cpu_s += user1 - user0
        into.gateway_rss_mib = rss_mib(mode.gateway_pid)
    into.simulator_cpu_s += cpu_seconds(mode.sim_pid) - sim0
    into.client_cpu_s += time.process_time() - self0
    into.tokens += await generated_tokens(mode.sim_url) - tokens0
    into.run.merge(run)


def line(m: Measured) -> str:
    return (
        f"{m.tokens_per_s:>9.0f} tok/s  "
        f"TTFT p50 {m.ttft_p50_ms:7.2f} p99 {m.ttft_p99_ms:7.2f} ms  "
        f"chunk p50 {m.chunk_p50_ms:6.3f} p99 {m.chunk_p99_ms:6.3f} ms  "
        f"CPU s: gateway {m.gateway_cpu_s:5.2f} sim {m.simulator_cpu_s:5.2f} "
        f"client {m.client_cpu_s:5.2f}  errors {m.errors}"
    )


# ---------------------------------------------------------------------- orchestration


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def wait_for(url: str) -> None:
    async with aiohttp.ClientSession() as session:
        for _ in range(300):
            with contextlib.suppress(aiohttp.ClientError):
                async with session.get(url) as r:
                    if r.status == 200:
                        return
            await asyncio.sleep(0.05)
    raise RuntimeError(f"{url} did not come up")


@contextlib.asynccontextmanager
async def process(
    argv: list[str], ready_url: str, env: dict[str, str] | None = None
) -> AsyncIterator[asyncio.subprocess.Process]:
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL, env=env
    )
    try:
        await wait_for(ready_url)
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except TimeoutError:
            proc.kill()
            await proc.wait()


def pin(gateways: set[int], others: tuple[int, ...]) -> None:
    """The gateways on the last CPU, simulators and load generator on the others: a sidecar has
    CPU of its own in a pod, and sharing one core three ways measures the scheduler, not the
    gateway. Every mode runs the simulator and the client on the same CPUs."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return
    for gateway in gateways:
        os.sched_setaffinity(gateway, {cpus[-1]})
    for pid in others:
        os.sched_setaffinity(pid, set(cpus[:-1]))


def added(through: Measured, direct: Measured, prefix: str = "") -> dict[str, float]:
    """What going through a gateway added to the TTFT and per-chunk latency percentiles."""
    return {
        f"{prefix}added_{name}_ms": round(
            getattr(through, f"{name}_ms") - getattr(direct, f"{name}_ms"), 3
        )
        for name in ("ttft_p50", "ttft_p99", "chunk_p50", "chunk_p99")
    }


def summarize(levels: dict[int, dict[str, Measured]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for c, modes in levels.items():
        direct, gateway = modes["direct"], modes["gateway"]
        out[str(c)] = {
            **added(gateway, direct),
            "gateway_cpu_s_per_1000_tokens": round(
                gateway.gateway_cpu_s / max(gateway.tokens, 1) * 1000, 4
            ),
            "throughput_ratio": round(gateway.tokens_per_s / max(direct.tokens_per_s, 1e-9), 4),
            **{mode: asdict(m) for mode, m in modes.items()},
        }
        if "routed" in modes:
            out[str(c)] |= added(modes["routed"], modes["plain"], "routed_")
    return out


@dataclass(frozen=True)
class Mode:
    """Where the load goes (`url`), whose gateway process it runs through (None: no gateway)
    and which simulator serves it."""

    name: str
    url: str
    sim_url: str
    sim_pid: int
    gateway_pid: int | None


@contextlib.asynccontextmanager
async def gateway(
    upstream: str, config: dict[str, Any], tmp: Path
) -> AsyncIterator[tuple[str, str, int]]:
    """A gateway process: its URL, its metrics URL and its pid."""
    port, metrics_port = free_port(), free_port()
    path = tmp / f"gateway-{port}.yaml"
    path.write_text(yaml.safe_dump(config))
    argv = [*ENTRY, "gateway", "--upstream", upstream, "--config", str(path)]
    argv += ["--listen", f"127.0.0.1:{port}", "--metrics-listen", f"127.0.0.1:{metrics_port}"]
    metrics_url = f"http://127.0.0.1:{metrics_port}"
    async with process([*argv, "--log-level", "WARNING"], metrics_url + "/healthz") as proc:
        yield f"http://127.0.0.1:{port}", metrics_url, proc.pid


@contextlib.asynccontextmanager
async def simulator(time_scale: float, plain: bool = False) -> AsyncIterator[tuple[str, int]]:
    """A simulator process (`plain`: a plain pool's engine, no speculation): URL and pid."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [sys.executable, __file__, "--serve-sim", str(port), "--time-scale", str(time_scale)]
    async with process([*argv, *(["--plain"] if plain else [])], url + "/health") as proc:
        yield url, proc.pid


async def start_modes(args: argparse.Namespace, stack: contextlib.AsyncExitStack) -> list[Mode]:
    """Direct and through a gateway; with --routed, the plain pool's simulator directly and
    through a gateway that routes every class there."""
    tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
    sim_url, sim_pid = await stack.enter_async_context(simulator(args.time_scale))
    gw_url, _, gw_pid = await stack.enter_async_context(gateway(sim_url, GATEWAY_CONFIG, tmp))
    modes = [Mode("direct", sim_url, sim_url, sim_pid, None)]
    modes.append(Mode("gateway", gw_url, sim_url, sim_pid, gw_pid))
    if args.routed:
        plain_url, plain_pid = await stack.enter_async_context(simulator(args.time_scale, True))
        classes = [c["name"] for c in GATEWAY_CONFIG["classes"]]
        routing = GATEWAY_CONFIG | {"plainPool": {"url": plain_url, "classes": classes}}
        routed_url, _, routed_pid = await stack.enter_async_context(gateway(sim_url, routing, tmp))
        modes.append(Mode("plain", plain_url, plain_url, plain_pid, None))
        modes.append(Mode("routed", routed_url, plain_url, plain_pid, routed_pid))
    if args.pin:
        gateways = {m.gateway_pid for m in modes if m.gateway_pid is not None}
        pin(gateways, others=(*{m.sim_pid for m in modes}, os.getpid()))
    return modes


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    async with contextlib.AsyncExitStack() as stack:
        modes = await start_modes(args, stack)
        levels: dict[int, dict[str, Measured]] = {}
        for c in args.concurrency:
            samples = {m.name: Sample(run=Run(max_tokens=args.max_tokens)) for m in modes}
            # Alternate the modes so drift on a shared machine hits them alike.
            for _ in range(args.rounds):
                for m in modes:
                    seconds = args.duration / args.rounds
                    await measure_round(m, c, seconds, samples[m.name])
            levels[c] = {mode: Measured.of(sample) for mode, sample in samples.items()}
            for mode, measured in levels[c].items():
                print(f"c={c:<3} {mode:<8} {line(measured)}", flush=True)
    return {
        "settings": {
            "time_scale": args.time_scale,
            "duration_s": args.duration,
            "rounds": args.rounds,
            "gateway_pinned_to_own_cpu": args.pin,
            "routed": args.routed,
            "load_average": os.getloadavg(),
            "max_tokens": args.max_tokens,
            "cpus": os.cpu_count(),
            "engine": "specfleet-testbed engine (vLLM 0.33.0 wire format), eagle3 k=3",
        },
        "levels": summarize(levels),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--time-scale", type=float, default=0.5)
    parser.add_argument("--duration", type=float, default=8.0, help="seconds per mode and level")
    parser.add_argument("--rounds", type=int, default=2, help="direct/gateway alternations")
    parser.add_argument(
        "--no-pin", dest="pin", action="store_false", help="do not give the gateway its own CPU"
    )
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--routed", action="store_true", help="measure the routed hop too")
    parser.add_argument("--plain", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/gateway_overhead.json")
    parser.add_argument("--serve-sim", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_sim is not None:
        asyncio.run(serve_sim(args.serve_sim, args.time_scale, args.plain))
        return
    result = asyncio.run(bench(args))
    print()
    for c, level in result["levels"].items():
        print(
            f"c={c:<3} added TTFT p50 {level['added_ttft_p50_ms']:+.3f} ms, "
            f"p99 {level['added_ttft_p99_ms']:+.3f} ms; per chunk p50 "
            f"{level['added_chunk_p50_ms']:+.3f} ms, p99 {level['added_chunk_p99_ms']:+.3f} ms; "
            f"gateway CPU {level['gateway_cpu_s_per_1000_tokens']:.4f} s / 1000 tokens; "
            f"throughput ratio {level['throughput_ratio']:.4f}"
        )
        if "routed_added_ttft_p50_ms" in level:
            print(
                f"c={c:<3} routed hop: added TTFT p50 {level['routed_added_ttft_p50_ms']:+.3f} "
                f"ms, p99 {level['routed_added_ttft_p99_ms']:+.3f} ms; per chunk p50 "
                f"{level['routed_added_chunk_p50_ms']:+.3f} ms, p99 "
                f"{level['routed_added_chunk_p99_ms']:+.3f} ms"
            )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
