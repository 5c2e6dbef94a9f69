"""A SpecExperiment on the local cluster: the four arms come up as pods of their own, the fleet's
gateway mirrors the real `openai` client's traffic to them, Prometheus scrapes every gateway, the
operator measures the arms, load-tests each (its capacity Job runs the real guidellm on the
mirrored prompts, through the stand-in kubelet) and concludes: the quantized arms, which break
tool calls, lose."""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from openai import OpenAI

from e2e.cluster.harness import LocalCluster, eventually
from e2e.fleet import guidellm, simulated_pods
from e2e.operator_runner import RunningOperator, in_process
from e2e.test_cluster import prometheus_query
from e2e.test_guard import apply, deployments, scenario, specmodel, status
from e2e.traffic import serving

ROOT = Path(__file__).resolve().parent.parent
ARMS = ("baseline", "quantized", "speculative", "both")
PROBES = 30
MIRROR_BUDGET_MS = 5.0
"""What mirroring every request to four arms may add to the fleet gateway's own TTFT: the
gateway's p99 budget (README, Benchmarks)."""


@pytest.fixture(scope="module")
def operator(local_cluster: LocalCluster) -> Iterator[RunningOperator]:
    for crd in ("specmodel", "specexperiment"):
        local_cluster.install_crd(crd)
    with in_process(local_cluster, prometheus_url=local_cluster.prometheus_url) as running:
        yield running


def shop() -> dict[str, Any]:
    """Served quantized (online FP8) with n-gram speculation: the `both` arm. No quality SLO on
    the fleet: the experiment, not the guard, is to find what quantization does to tool calls."""
    document = specmodel(
        "shop",
        quantization={"weights": "fp8", "online": True},
        speculative={"method": "ngram", "numSpeculativeTokens": 4},
        pod={"replicas": 1},
    )
    document["spec"]["classes"] = [
        {"name": "code", "slo": {"maxP95TpotSeconds": 0.5}},
        {"name": "chat", "slo": {"maxP95TpotSeconds": 0.5}},
    ]
    return document


def quantization_breaks_tool_calls() -> dict[str, Any]:
    return scenario(
        [[0, 0.85]],
        rps=6,
        chat_tools=0.6,
        rollouts=[
            {
                "t": 0,
                "spec": {},
                "match_args": ["--quantization fp8"],
                "effects": {"tool_call_validity": 0.5},
            }
        ],
    )


def experiment(min_requests: int) -> dict[str, Any]:
    return {
        "apiVersion": "specfleet.dev/v1alpha1",
        "kind": "SpecExperiment",
        "metadata": {"name": "exp"},
        "spec": {
            "specModelRef": {"name": "shop"},
            "sample": {"share": 1.0},
            "minRequestsPerClass": min_requests,
            "gpuHourPrice": 4.0,
            "capacity": {"maxConcurrency": 2, "steps": 1},
        },
    }


def experiment_status(cluster: LocalCluster, namespace: str) -> dict[str, Any]:
    found = cluster.kubectl_json("get", "specexperiment", "exp", "-n", namespace)
    result: dict[str, Any] = found.get("status", {})
    return result


def test_four_arms_on_the_same_traffic_load_tested_and_the_quantized_ones_lose(
    local_cluster: LocalCluster, namespace: str, operator: RunningOperator, tmp_path: Path
) -> None:
    apply(local_cluster, namespace, shop())
    load_tests = ("--guidellm", guidellm())
    with simulated_pods(
        local_cluster, namespace, quantization_breaks_tool_calls(), tmp_path, load_tests
    ) as fleet:
        traffic = fleet.traffic_in_background("shop", "shop", 900)
        eventually(
            lambda: status(local_cluster, namespace, "shop").get("activeRevision") == 1, "served"
        )
        unmirrored = _gateway_added_ttft_ms(local_cluster, namespace)
        apply(local_cluster, namespace, experiment(min_requests=40))
        eventually(
            lambda: {f"exp-{arm}" for arm in ARMS} <= deployments(local_cluster, namespace),
            "the four arms' Deployments",
        )
        eventually(
            lambda: experiment_status(local_cluster, namespace).get("phase") == "Running",
            "every arm ready",
            timeout_s=180,
        )
        eventually(
            lambda: _mirrored(local_cluster, namespace) > 0, "the fleet mirrors to the arms", 120
        )
        mirrored = _gateway_added_ttft_ms(local_cluster, namespace)
        eventually(
            lambda: experiment_status(local_cluster, namespace).get("phase") == "Capacity",
            "the sample complete",
            timeout_s=300,
        )
        eventually(
            lambda: experiment_status(local_cluster, namespace).get("phase") == "Concluded",
            "every arm's load test",
            timeout_s=600,
        )
        report = traffic.result(stop=True)
    final = experiment_status(local_cluster, namespace)
    print(f"fleet gateway's added TTFT: {unmirrored:.2f} ms unmirrored, {mirrored:.2f} mirrored")
    assert mirrored < unmirrored + MIRROR_BUDGET_MS, (unmirrored, mirrored)
    _assert_load_tested(final)
    verdict = final["verdict"]
    assert verdict["outcome"] == "recommended", verdict["reason"]
    assert verdict["recommendation"] in ("speculative", "baseline")
    assert final["leadingArm"] == verdict["recommendation"]
    lost = {(e["arm"], e["signal"]) for e in verdict["exclusions"]}
    assert {("quantized", "toolCallValidity"), ("both", "toolCallValidity")} <= lost, lost
    assert yaml.safe_load(final["recommendedPatch"])["spec"]["quantization"] is None
    # the arms' engines scraped with their experiment and arm: memory headroom per arm
    assert all(0 <= row["kvCacheHeadroom"] <= 1 for row in verdict["overall"]), verdict["overall"]
    assert all(r["requests"] >= 40 for r in final["progress"]["requests"]), final["progress"]
    # mirroring never reached the clients: every request of theirs was answered
    assert sum(report.failed.values()) == 0, report.errors[:5]
    assert min(report.ok.values()) >= 40  # each arm saw 40 of each class: all mirrored
    eventually(
        lambda: not {f"exp-{arm}" for arm in ARMS} & deployments(local_cluster, namespace),
        "the arms retired",
    )
    shown = local_cluster.kubectl("get", "specexperiment", "exp", "-n", namespace)
    assert verdict["recommendation"] in shown and "100" in shown
    _report(local_cluster, namespace, tmp_path / "report", verdict)


def _assert_load_tested(final: dict[str, Any]) -> None:
    """Each arm's throughput at SLO is its load test's: guidellm at concurrency 2 on the
    sample of mirrored prompts, both classes in it."""
    conditions = {c["type"]: c for c in final["conditions"]}
    assert conditions["CapacityMeasured"]["status"] == "True", conditions["CapacityMeasured"]
    capacity = final["capacity"]
    assert capacity["classes"] == ["chat", "code"] and capacity["requests"] >= 80, capacity
    tested = {arm["name"]: arm for arm in capacity["arms"]}
    assert set(tested) == set(ARMS), tested
    assert all(arm["throughputAtSlo"] > 0 and arm["concurrency"] == 2 for arm in tested.values())
    overall = {row["arm"]: row for row in final["verdict"]["overall"]}
    for name, arm in tested.items():
        assert overall[name]["throughputAtSlo"] == arm["throughputAtSlo"], (name, overall[name])


def _gateway_added_ttft_ms(cluster: LocalCluster, namespace: str) -> float:
    """What the fleet's gateway adds to a streamed answer's first token: the median, over pairs
    of the `openai` client's requests asked in turn, of the TTFT through the fleet pod's gateway
    minus the TTFT straight to its engine (each pair sees the same moment's contention)."""
    eventually(lambda: _fleet_pod_ip(cluster, namespace), "the fleet's pod Ready")
    ip = _fleet_pod_ip(cluster, namespace)
    gateway, engine = (
        OpenAI(base_url=f"http://{ip}:{port}/v1", api_key="-") for port in (8080, 8000)
    )
    added = [_ttft(gateway) - _ttft(engine) for _ in range(PROBES)]
    return 1000 * statistics.median(added)


def _fleet_pod_ip(cluster: LocalCluster, namespace: str) -> str | None:
    fleet = "app.kubernetes.io/instance=shop"
    pods = cluster.kubectl_json("get", "pods", "-n", namespace, "-l", fleet)["items"]
    return next((p["status"]["podIP"] for p in pods if serving(p)), None)


def _ttft(client: OpenAI) -> float:
    started = time.perf_counter()
    stream = client.chat.completions.create(
        model="shop",
        messages=[{"role": "user", "content": "ping"}],
        max_tokens=4,
        stream=True,
        extra_headers={"x-specfleet-class": "chat"},
    )
    with stream:
        next(iter(stream))
        return time.perf_counter() - started


def _mirrored(cluster: LocalCluster, namespace: str) -> float:
    rows = prometheus_query(cluster, f'sum(specfleet_mirror_sent_total{{namespace="{namespace}"}})')
    return float(rows[0]["value"][1]) if rows else 0.0


def _report(cluster: LocalCluster, namespace: str, out: Path, verdict: dict[str, Any]) -> None:
    """`specfleet experiment report NAME` reads the verdict from the cluster."""
    argv = [str(Path(sys.executable).parent / "specfleet"), "experiment", "report", "exp"]
    env = {"KUBECONFIG": str(cluster.kubeconfig), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [*argv, "-n", namespace, "--out", str(out)], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    table = (out / "report.md").read_text()
    assert f"**recommended: {verdict['recommendation']}.**" in table
    assert (out / "report.png").stat().st_size > 10_000
