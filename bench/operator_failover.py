"""Operator failover on the local cluster: two `specfleet run --leader-elect` processes with the
chart's timings (15 s lease, 10 s renew deadline, 2 s retry) and a few SpecModels; the leader is
killed (SIGKILL) and the time until the follower's first reconcile is measured. Each round
starts a fresh replica in place of the killed one, so the next round kills the other.

Run on demand: .venv/bin/python bench/operator_failover.py [--rounds 5]
Prints each round and writes bench/results/operator_failover.json. Uses a running local
cluster (`make cluster-up`) or starts one.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from e2e.cluster import harness  # noqa: E402
from e2e.cluster.harness import LocalCluster, eventually  # noqa: E402
from e2e.operator_runner import OperatorProcess, as_process  # noqa: E402
from e2e.readiness import pods_marked_ready  # noqa: E402

NAMESPACE = "bench-failover"
LEASE = "bench-failover-leader"
SPECMODELS = 5
RECONCILES = "specfleet_reconcile_total"


def specmodel(index: int) -> dict[str, Any]:
    return {
        "apiVersion": "specfleet.dev/v1alpha1",
        "kind": "SpecModel",
        "metadata": {"name": f"m{index}", "namespace": NAMESPACE},
        "spec": {
            "engine": {"name": "vllm"},
            "model": {"source": "meta-llama/Llama-3.1-8B-Instruct"},
            "speculative": {"method": "ngram"},
        },
    }


def holder(cluster: LocalCluster) -> str | None:
    found = cluster.run_kubectl("get", "lease", LEASE, "-n", NAMESPACE, "-o", "json")
    if found.returncode != 0:
        return None
    name: str | None = json.loads(found.stdout)["spec"].get("holderIdentity")
    return name


def rounds(cluster: LocalCluster, count: int, log_dir: Path) -> list[dict[str, float]]:
    args = [f"--namespace={NAMESPACE}", "--leader-elect", f"--lease-name={LEASE}"]
    args += [f"--lease-namespace={NAMESPACE}", "--log-level=info"]
    results = []
    with ExitStack() as stack:
        running: dict[str, tuple[ExitStack, OperatorProcess]] = {}

        def start(name: str) -> None:
            own = ExitStack()
            log = log_dir / f"{name}.log"
            process = own.enter_context(
                as_process(cluster.kubeconfig, log, *args, env={"POD_NAME": name})
            )
            running[name] = (own, process)
            stack.callback(own.close)

        start("replica-0")
        start("replica-1")
        for n in range(count):
            leader, seconds = kill_the_leader(cluster, {k: p for k, (_, p) in running.items()})
            results.append({"round": n + 1, "killed_to_first_reconcile_s": round(seconds, 2)})
            print(results[-1], flush=True)
            running.pop(leader)[0].close()
            start(f"replica-{n + 2}")
    return results


def kill_the_leader(
    cluster: LocalCluster, running: dict[str, OperatorProcess]
) -> tuple[str, float]:
    """Kills the leader at a random moment between renewals; who it was, and the seconds until
    the follower's first reconcile."""
    eventually(lambda: holder(cluster) in running, "a leader", 60)
    leader = holder(cluster)
    assert leader is not None
    [follower] = [running[name] for name in running if name != leader]
    eventually(lambda: running[leader].total(RECONCILES) > 0, "the leader reconciles")
    time.sleep(random.uniform(2, 6))
    before = follower.total(RECONCILES)
    os.kill(running[leader].pid, signal.SIGKILL)
    killed = time.monotonic()
    eventually(lambda: follower.total(RECONCILES) > before, "the follower's first reconcile", 60)
    seconds = time.monotonic() - killed
    eventually(lambda: holder(cluster) not in (None, leader), "the Lease moved")
    return leader, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    cluster = harness.running() or harness.up()
    cluster.install_crd()
    cluster.run_kubectl("create", "namespace", NAMESPACE)
    out_dir = ROOT / "bench/results"
    out_dir.mkdir(parents=True, exist_ok=True)
    manifests = "\n---\n".join(json.dumps(specmodel(i)) for i in range(SPECMODELS))
    try:
        with pods_marked_ready(cluster):
            cluster.kubectl("apply", "--server-side", "-f", "-", stdin=manifests)
            results = rounds(cluster, args.rounds, out_dir)
    finally:
        cluster.run_kubectl("delete", "namespace", NAMESPACE, "--wait=false")
    times = [r["killed_to_first_reconcile_s"] for r in results]
    summary = {
        "timings": {"lease_s": 15, "renew_deadline_s": 10, "retry_s": 2},
        "rounds": results,
        "min_s": min(times),
        "median_s": statistics.median(times),
        "max_s": max(times),
    }
    print(json.dumps(summary, indent=2))
    (out_dir / "operator_failover.json").write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
