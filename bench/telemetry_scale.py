"""Telemetry reader cost per guard tick against the real Prometheus, for 1, 100 and 1000
SpecModels x 4 classes: PromQL queries per tick and wall time per tick.

A synthetic exporter serves the gateway metric families with the labels Prometheus would add
(namespace, specmodel, revision, speculation) for every SpecModel; a Prometheus of its own
(the e2e harness's binary) scrapes it. Run on demand:
    .venv/bin/python bench/telemetry_scale.py
Prints a table and writes bench/results/telemetry_scale.json.
"""

from __future__ import annotations

import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from e2e.cluster import harness  # noqa: E402
from e2e.operator_runner import free_port  # noqa: E402

from specfleet.telemetry.reader import Target, TelemetryReader  # noqa: E402

SIZES = (1, 100, 1000)
CLASSES = ("code", "chat", "tools", "json")
LABELS = ["namespace", "specmodel", "revision", "speculation", "class"]
TICKS = 10


def registry_for(count: int) -> CollectorRegistry:
    registry = CollectorRegistry()
    counters = {
        name: Counter(name, name, LABELS, registry=registry)
        for name in (
            "specfleet_requests",
            "specfleet_spec_draft_tokens",
            "specfleet_spec_accepted_tokens",
            "specfleet_spec_steps",
            "specfleet_output_tokens",
        )
    }
    histograms = {
        name: Histogram(name, name, LABELS, registry=registry, buckets=(0.01, 0.05, 0.1, 0.5, 1, 5))
        for name in ("specfleet_ttft_seconds", "specfleet_tpot_seconds")
    }
    rng = random.Random(1)
    for index in range(count):
        for klass in CLASSES:
            labels = ("bench", f"m{index:04d}", "1", "on", klass)
            for counter in counters.values():
                counter.labels(*labels).inc(rng.randint(100, 1000))
            for histogram in histograms.values():
                histogram.labels(*labels).observe(rng.random())
    return registry


def serve(registry: CollectorRegistry) -> tuple[ThreadingHTTPServer, int]:
    body = generate_latest(registry)  # the counters stand still: render them once

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, server.server_address[1]


def run_size(prometheus_bin: Path, count: int) -> dict[str, float]:
    server, exporter_port = serve(registry_for(count))
    workdir = Path(tempfile.mkdtemp(prefix="telemetry-bench-"))
    port = free_port()
    (workdir / "prometheus.yml").write_text(
        "global: {scrape_interval: 5s, scrape_timeout: 5s}\n"
        "scrape_configs:\n"
        "  - job_name: gateways\n"
        "    honor_labels: true\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{exporter_port}']}}]\n"
    )
    prometheus = subprocess.Popen(
        [
            str(prometheus_bin),
            f"--config.file={workdir / 'prometheus.yml'}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for_samples(url, count)
        reader = TelemetryReader(url)
        targets = [Target("bench", f"m{i:04d}", 60, 1, True) for i in range(count)]
        times = []
        for _ in range(TICKS):
            started = time.perf_counter()
            observations = reader.read(targets, datetime.now(UTC))
            times.append(time.perf_counter() - started)
        assert len(observations) == count and all(
            len(o.classes) == 4 for o in observations.values()
        )
        return {
            "specmodels": count,
            "classes": count * len(CLASSES),
            "queries_per_tick": reader.queries / TICKS,
            "tick_seconds_median": round(statistics.median(times), 4),
            "tick_seconds_max": round(max(times), 4),
        }
    finally:
        prometheus.terminate()
        prometheus.wait(20)
        server.shutdown()
        shutil.rmtree(workdir, ignore_errors=True)


def wait_for_samples(url: str, count: int) -> None:
    """Until two scrapes exist, so increase() has something to work with."""
    query = 'count(count_over_time(specfleet_requests_total{class="code"}[1m]) >= 2)'
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            result = httpx.get(f"{url}/api/v1/query", params={"query": query}, timeout=5).json()
            if result["data"]["result"] and float(result["data"]["result"][0]["value"][1]) >= count:
                return
        except (httpx.HTTPError, ValueError, KeyError):
            pass
        time.sleep(1)
    raise TimeoutError("Prometheus never scraped the exporter twice")


def main() -> None:
    prometheus_bin = harness._install() / "prometheus"
    results = [run_size(prometheus_bin, count) for count in SIZES]
    columns = list(results[0])
    print("  ".join(f"{c:>22}" for c in columns))
    for result in results:
        print("  ".join(f"{result[c]:>22}" for c in columns))
    out = ROOT / "bench/results/telemetry_scale.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
