"""Operator scale on the local cluster: N SpecModels (default 100, 500, 1000), each one engine
pod with one GPU on kwok nodes. Measures the time until every SpecModel is Ready, the operator's
writes per SpecModel at creation and in steady state, and the operator process's RSS and CPU.

Run on demand: .venv/bin/python bench/operator_scale.py [--counts 100,500,1000] [--floor]
[--replicas 2]
Prints a table and writes bench/results/operator_scale.json. Uses a running local cluster
(`make cluster-up`) or starts one.

`--floor` measures what the control plane alone needs: the same children the operator would
apply (`specfleet render`), applied by kubectl in the same batches with no operator running,
timed until every Deployment is available. The operator cannot be faster than that floor.

`--replicas 2` runs two `specfleet run --leader-elect` processes, as the chart does, and adds
the follower's RSS and CPU, and both processes' CPU over the steady minute.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from e2e.cluster import components, harness  # noqa: E402
from e2e.cluster.harness import LocalCluster  # noqa: E402
from e2e.operator_runner import as_process  # noqa: E402
from e2e.readiness import pods_marked_ready  # noqa: E402

from specfleet.api import parse_specmodel  # noqa: E402
from specfleet.render import render  # noqa: E402

GPUS_PER_NODE = 8
STEADY_SECONDS = 60


def specmodel(index: int) -> dict[str, Any]:
    return {
        "apiVersion": "specfleet.dev/v1alpha1",
        "kind": "SpecModel",
        "metadata": {"name": f"m{index:04d}"},
        "spec": {
            "engine": {"name": "vllm"},
            "model": {"source": "meta-llama/Llama-3.1-8B-Instruct"},
            "speculative": {"method": "ngram"},
        },
    }


def writes(metrics_url: str) -> float:
    with urllib.request.urlopen(metrics_url, timeout=10) as response:
        text = response.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("specfleet_api_writes_total{")
    )


def process_usage(pid: int) -> tuple[float, float]:
    """(RSS MiB, CPU seconds) of a process."""
    rss_kib = next(
        int(line.split()[1])
        for line in Path(f"/proc/{pid}/status").read_text().splitlines()
        if line.startswith("VmRSS:")
    )
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return rss_kib / 1024, (int(fields[11]) + int(fields[12])) / ticks


def ready_count(cluster: LocalCluster, namespace: str) -> int:
    """From the server-side table (the CRD's printer columns), not whole SpecModels, which at
    1000 are megabytes to send and parse every poll on the machine being measured."""
    table = cluster.kubectl("get", "sm", "-n", namespace, "--no-headers", "-o", "wide")
    return sum(1 for row in table.splitlines() if " Ready " in f" {row} ")


def create(cluster: LocalCluster, namespace: str, count: int) -> None:
    for start in range(0, count, 100):
        docs = [specmodel(i) for i in range(start, min(count, start + 100))]
        cluster.kubectl(
            "apply", "--server-side", "-n", namespace, "-f", "-", stdin=yaml.safe_dump_all(docs)
        )


def available_count(cluster: LocalCluster, namespace: str) -> int:
    columns = "custom-columns=READY:.status.availableReplicas,WANTED:.spec.replicas"
    table = cluster.kubectl("get", "deployments", "-n", namespace, "--no-headers", "-o", columns)
    return sum(1 for row in table.splitlines() if len(set(row.split())) == 1)


def wait_for(count: int, counted: Any, started: float) -> float:
    """Seconds from `started` until `counted()` reaches `count`."""
    while (done := counted()) < count:
        if time.monotonic() - started > 900:
            raise TimeoutError(f"{done}/{count} after 15 minutes")
        time.sleep(2)
    return time.monotonic() - started


def measure_floor(cluster: LocalCluster, count: int) -> dict[str, Any]:
    """The children of `count` SpecModels applied without the operator, until all available."""
    namespace = f"floor-{count}-{int(time.time())}"
    cluster.kubectl("create", "namespace", namespace)
    started = time.monotonic()
    for start in range(0, count, 100):
        children = [
            manifest
            for index in range(start, min(count, start + 100))
            for manifest in render(parse_specmodel(with_namespace(specmodel(index), namespace)))
        ]
        cluster.kubectl(
            "apply", "--server-side", "-n", namespace, "-f", "-", stdin=yaml.safe_dump_all(children)
        )
    seconds = wait_for(count, lambda: available_count(cluster, namespace), started)
    cluster.kubectl("delete", "namespace", namespace, "--wait=false")
    return {"specmodels": count, "seconds_to_all_available_without_operator": round(seconds, 1)}


def with_namespace(document: dict[str, Any], namespace: str) -> dict[str, Any]:
    return {**document, "metadata": {**document["metadata"], "namespace": namespace}}


def measure(
    cluster: LocalCluster, count: int, metrics_url: str, pid: int, follower: int | None = None
) -> dict[str, Any]:
    """`pid`: the operator (the leader, with --replicas 2); `follower`: the other replica."""
    namespace = f"bench-{count}-{int(time.time())}"
    cluster.kubectl("create", "namespace", namespace)
    before = writes(metrics_url)
    _, cpu_before = process_usage(pid)
    _, follower_before = process_usage(follower) if follower else (0.0, 0.0)
    started = time.monotonic()
    create(cluster, namespace, count)
    seconds = wait_for(count, lambda: ready_count(cluster, namespace), started)
    at_create = writes(metrics_url) - before
    _, cpu_ready = process_usage(pid)
    _, follower_ready = process_usage(follower) if follower else (0.0, 0.0)
    time.sleep(STEADY_SECONDS)
    steady = writes(metrics_url) - before - at_create
    rss, cpu = process_usage(pid)
    cluster.kubectl("delete", "namespace", namespace, "--wait=false")
    result = {
        "specmodels": count,
        "seconds_to_all_ready": round(seconds, 1),
        "writes_per_specmodel_at_create": round(at_create / count, 2),
        "writes_per_minute_steady": round(steady * 60 / STEADY_SECONDS, 1),
        "operator_rss_mib": round(rss, 1),
        "operator_cpu_seconds": round(cpu - cpu_before, 1),
        "operator_steady_cpu_percent": round(100 * (cpu - cpu_ready) / STEADY_SECONDS, 1),
    }
    if follower:
        follower_rss, follower_cpu = process_usage(follower)
        result |= {
            "follower_rss_mib": round(follower_rss, 1),
            "follower_cpu_seconds": round(follower_cpu - follower_before, 1),
            "follower_steady_cpu_percent": round(
                100 * (follower_cpu - follower_ready) / STEADY_SECONDS, 1
            ),
        }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", default="100,500,1000")
    parser.add_argument("--floor", action="store_true", help="the control plane alone")
    parser.add_argument(
        "--replicas", type=int, choices=(1, 2), default=1, help="2: a leader and a follower"
    )
    args = parser.parse_args()
    counts = [int(c) for c in args.counts.split(",")]
    cluster = harness.running() or harness.up()
    nodes = math.ceil(max(counts) / GPUS_PER_NODE) + 4
    cluster.kubectl("apply", "-f", str(components.nodes_manifest(cluster.layout, nodes)))
    cluster.kubectl("apply", "--server-side", "-f", str(ROOT / "crds/specmodel.yaml"))
    # The guard is off: Prometheus would only discover and fail to scrape engine-less pods,
    # using as much CPU as the operator on this machine.
    cluster.stop_prometheus()
    try:
        with pods_marked_ready(cluster):
            time.sleep(5)
            if args.floor:
                results = [measure_floor(cluster, count) for count in counts]
            else:
                results = with_operator(cluster, counts, args.replicas)
    finally:
        cluster.start_prometheus()
    columns = list(results[0])
    print("  ".join(f"{c:>30}" for c in columns))
    for result in results:
        print("  ".join(f"{result[c]:>30}" for c in columns))
    suffix = "_floor" if args.floor else "_2replicas" if args.replicas == 2 else ""
    out = ROOT / f"bench/results/operator_scale{suffix}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(f"wrote {out}")


def with_operator(
    cluster: LocalCluster, counts: list[int], replicas: int = 1
) -> list[dict[str, Any]]:
    log = ROOT / "bench/results/operator_scale.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    arguments = ("--log-level=warning", "--resync-seconds=30")
    if replicas == 1:
        with as_process(cluster.kubeconfig, log, *arguments) as operator:
            return [measure(cluster, count, operator.metrics_url, operator.pid) for count in counts]
    # Two replicas electing a leader, as the chart runs them: the leader acts, the follower
    # watches and indexes everything, ready to take over.
    elect = (*arguments, "--leader-elect", "--lease-name=bench-scale", "--lease-namespace=default")
    with (
        as_process(cluster.kubeconfig, log, *elect, env={"POD_NAME": "scale-0"}) as first,
        as_process(
            cluster.kubeconfig, log.with_suffix(".1.log"), *elect, env={"POD_NAME": "scale-1"}
        ) as second,
    ):
        deadline = time.monotonic() + 60
        while (leading := [p for p in (first, second) if p.total("specfleet_leader") == 1]) == []:
            if time.monotonic() > deadline:
                raise TimeoutError("no leader in 60 s")
            time.sleep(0.5)
        [leader] = leading
        other = second if leader is first else first
        return [
            measure(cluster, count, leader.metrics_url, leader.pid, other.pid) for count in counts
        ]


if __name__ == "__main__":
    main()
