"""Per-class truth on the local cluster: gateways in front of simulated engines, scraped by the
real Prometheus through Kubernetes discovery, read back by the telemetry reader."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from e2e.cluster.harness import LocalCluster, eventually
from e2e.fleet import simulated_pods
from e2e.operator_runner import RunningOperator, in_process
from specfleet.guard.speedup import expected_tokens_per_step
from specfleet.telemetry.reader import QUERIES_PER_TICK, Target, TelemetryReader

ROOT = Path(__file__).resolve().parent.parent
WINDOW = 15
K = 4
COLLAPSE_AT = 45
SCENARIO: dict[str, Any] = {
    "duration_s": 600,
    "traffic_rps": [[0, 8]],
    "classes": {
        "code": {"share": 0.5, "acceptance": [[0, 0.8], [COLLAPSE_AT, 0.2]], "output_tokens": 48},
        "chat": {"share": 0.5, "acceptance": [[0, 0.6]], "output_tokens": 48},
    },
}
SPECMODEL: dict[str, Any] = {
    "apiVersion": "specfleet.dev/v1alpha1",
    "kind": "SpecModel",
    "metadata": {"name": "tele"},
    "spec": {
        "engine": {"name": "vllm"},
        "model": {"source": "meta-llama/Llama-3.1-8B-Instruct", "servedName": "tele"},
        "speculative": {"method": "eagle3", "draftModel": "d", "numSpeculativeTokens": K},
        "classes": [{"name": "code"}, {"name": "chat"}],
        "defaultClass": "chat",
        "guard": {"mode": "on", "windowSeconds": WINDOW},
        "pod": {"replicas": 2},
    },
}


@pytest.fixture(scope="module")
def operator(local_cluster: LocalCluster) -> Iterator[RunningOperator]:
    local_cluster.install_crd()
    with in_process(local_cluster) as running:
        yield running


def rate(alpha: float) -> float:
    """What engines report as acceptance rate (accepted / drafted tokens) when each draft
    position is accepted with probability alpha, as the scenario scripts it."""
    return (expected_tokens_per_step(alpha, K) - 1) / K


def prometheus(cluster: LocalCluster, query: str) -> float:
    response = httpx.get(
        f"{cluster.prometheus_url}/api/v1/query", params={"query": query}, timeout=10
    )
    result = response.json()["data"]["result"]
    return float(result[0]["value"][1]) if result else float("nan")


def read(reader: TelemetryReader, namespace: str) -> Any:
    target = Target(namespace, "tele", WINDOW, revision=1, speculation=True)
    return reader.read([target], datetime.now(UTC))[(namespace, "tele")]


def test_per_class_acceptance_follows_the_scenario_and_sums_to_the_engine_counters(
    local_cluster: LocalCluster, namespace: str, operator: RunningOperator, tmp_path: Path
) -> None:
    local_cluster.kubectl(
        "apply", "--server-side", "-n", namespace, "-f", "-", stdin=yaml.safe_dump(SPECMODEL)
    )
    with simulated_pods(local_cluster, namespace, SCENARIO, tmp_path) as fleet:
        wait_for_gateways(local_cluster, namespace)
        reader = TelemetryReader(str(local_cluster.prometheus_url))
        traffic = fleet.traffic_in_background("tele", "tele", COLLAPSE_AT + 2 * WINDOW + 10)
        time.sleep(max(0.0, COLLAPSE_AT - 5 - fleet.scenario_time()))
        before = read(reader, namespace)
        assert before.classes["code"].acceptance_rate == pytest.approx(rate(0.8), abs=0.06)
        assert before.classes["chat"].acceptance_rate == pytest.approx(rate(0.6), abs=0.06)
        assert before.classes["code"].mean_acceptance_length == pytest.approx(
            expected_tokens_per_step(0.8, K), abs=0.25
        )
        assert before.classes["code"].requests >= 30
        code = before.classes["code"]
        # in flight for at least its decode: 47 tokens after the first, at the mean TPOT
        assert code.request_seconds / code.requests >= 0.8 * 47 * code.mean_tpot_seconds
        # half the clients stream (Traffic), and only a stream has a TPOT
        assert code.tpot_samples is not None
        assert 0.2 * code.requests <= code.tpot_samples <= 0.8 * code.requests
        time.sleep(max(0.0, COLLAPSE_AT + 2 * WINDOW - fleet.scenario_time()))
        after = read(reader, namespace)
        assert after.classes["code"].acceptance_rate == pytest.approx(rate(0.2), abs=0.06)
        assert after.classes["chat"].acceptance_rate == pytest.approx(rate(0.6), abs=0.06)
        assert reader.queries == 2 * QUERIES_PER_TICK  # two ticks, one fixed batch each
        report = traffic.result()
        assert sum(report.failed.values()) == 0, report.errors[:5]
        assert_gateway_sums_equal_engine_counters(local_cluster, namespace)


def wait_for_gateways(cluster: LocalCluster, namespace: str) -> None:
    query = f'count(up{{namespace="{namespace}", job="specfleet-gateway"}} == 1)'
    eventually(lambda: prometheus(cluster, query) == 2, "both gateways scraped", 90)


def assert_gateway_sums_equal_engine_counters(cluster: LocalCluster, namespace: str) -> None:
    pairs = [
        ("specfleet_spec_draft_tokens_total", "vllm:spec_decode_num_draft_tokens_total"),
        ("specfleet_spec_accepted_tokens_total", "vllm:spec_decode_num_accepted_tokens_total"),
        ("specfleet_spec_steps_total", "vllm:spec_decode_num_drafts_total"),
    ]
    time.sleep(3)  # a final scrape after the last request
    for gateway, engine in pairs:
        per_class = prometheus(
            cluster, f'sum(sum by (class) ({gateway}{{namespace="{namespace}"}}))'
        )
        engine_total = prometheus(cluster, f'sum({engine}{{namespace="{namespace}"}})')
        assert per_class > 0
        assert per_class == engine_total, (gateway, per_class, engine_total)
