"""Proof that the e2e cluster is real: scheduling, GC, RBAC, Prometheus, Alertmanager."""

from __future__ import annotations

import ipaddress
import json
import secrets
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from e2e.cluster.harness import Cluster, KubectlError, LocalCluster, eventually

GPU = "nvidia.com/gpu"
METRICS_PORT = 9400


def deployment(name: str, gpus: int) -> str:
    return json.dumps(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": name},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"app": name}},
                "template": {
                    "metadata": {"labels": {"app": name}},
                    "spec": {"containers": [engine_container(gpus)]},
                },
            },
        }
    )


def pod(
    name: str,
    gpus: int,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
) -> str:
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "labels": labels or {}, "annotations": annotations or {}},
            "spec": {"containers": [engine_container(gpus)]},
        }
    )


def engine_container(gpus: int) -> dict[str, Any]:
    """No image is ever pulled: kwok plays the kubelet."""
    return {
        "name": "engine",
        "image": "registry.invalid/engine:e2e",
        "resources": {"limits": {GPU: str(gpus)}},
    }


def test_gpu_nodes_are_ready(local_cluster: LocalCluster) -> None:
    nodes = local_cluster.kubectl_json("get", "nodes", "-l", "type=kwok")["items"]
    assert len(nodes) == local_cluster.nodes  # 4 unless SPECFLEET_E2E_NODES says otherwise
    for node in nodes:
        ready = {c["type"]: c["status"] for c in node["status"]["conditions"]}["Ready"]
        assert ready == "True", node["metadata"]["name"]
        assert node["status"]["capacity"][GPU] == "8"
    products = {node["metadata"]["labels"]["nvidia.com/gpu.product"] for node in nodes}
    assert "NVIDIA-H100-80GB-HBM3" in products


def test_gpu_deployment_schedules_and_is_garbage_collected(
    local_cluster: LocalCluster, namespace: str
) -> None:
    kubectl = local_cluster.kubectl
    kubectl("apply", "-n", namespace, "-f", "-", stdin=deployment("engine", gpus=1))
    kubectl(
        "wait", "-n", namespace, "--for=condition=Available", "deployment/engine", "--timeout=60s"
    )
    (engine_pod,) = local_cluster.kubectl_json("get", "pods", "-n", namespace, "-l", "app=engine")[
        "items"
    ]
    assert engine_pod["spec"]["nodeName"].startswith("kwok-gpu-")
    assert ipaddress.ip_address(engine_pod["status"]["podIP"]) in ipaddress.ip_network(
        "127.0.0.0/8"
    )

    kubectl("delete", "-n", namespace, "deployment/engine")
    eventually(
        lambda: (
            not local_cluster.kubectl_json(
                "get", "replicasets,pods", "-n", namespace, "-l", "app=engine"
            )["items"]
        ),
        "the ReplicaSet and its pods to be garbage-collected",
    )


def test_too_many_gpus_stay_pending(local_cluster: LocalCluster, namespace: str) -> None:
    local_cluster.kubectl("apply", "-n", namespace, "-f", "-", stdin=pod("greedy", gpus=9))

    def failed_scheduling() -> list[str]:
        events = local_cluster.kubectl_json(
            "get",
            "events",
            "-n",
            namespace,
            "--field-selector=reason=FailedScheduling,involvedObject.name=greedy",
        )["items"]
        return [e["message"] for e in events if GPU in e["message"]]

    eventually(failed_scheduling, "a FailedScheduling event naming nvidia.com/gpu")
    phase = local_cluster.kubectl(
        "get", "pod", "greedy", "-n", namespace, "-o", "jsonpath={.status.phase}"
    )
    assert phase == "Pending"


def test_rbac_forbids_a_service_account_without_bindings(cluster: Cluster, namespace: str) -> None:
    cluster.kubectl("create", "serviceaccount", "nobody", "-n", namespace)
    who = f"--as=system:serviceaccount:{namespace}:nobody"
    can_i = cluster.run_kubectl("auth", "can-i", "list", "pods", "-n", namespace, who)
    assert (can_i.returncode, can_i.stdout.strip()) == (1, "no")
    with pytest.raises(KubectlError, match=r"(?i)forbidden"):
        cluster.kubectl("get", "pods", "-n", namespace, who)
    assert cluster.kubectl("auth", "can-i", "list", "pods", "-n", namespace).strip() == "yes"


@contextmanager
def metrics_server(host: str, port: int, body: bytes) -> Iterator[None]:
    """Serves `body` on http://host:port/metrics until the block ends."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/metrics" else 404)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()


def prometheus_query(cluster: LocalCluster, promql: str) -> list[dict[str, Any]]:
    response = httpx.get(f"{cluster.prometheus_url}/api/v1/query", params={"query": promql})
    response.raise_for_status()
    result: list[dict[str, Any]] = response.json()["data"]["result"]
    return result


def test_prometheus_scrapes_an_annotated_pod_on_its_pod_ip(
    local_cluster: LocalCluster, namespace: str
) -> None:
    labels = {
        "app.kubernetes.io/instance": "demo",
        "specfleet.dev/revision": "3",
        "specfleet.dev/speculation": "on",
    }
    annotations = {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(METRICS_PORT),
        "prometheus.io/path": "/metrics",
    }
    local_cluster.kubectl(
        "apply", "-n", namespace, "-f", "-", stdin=pod("scraped", 1, labels, annotations)
    )
    local_cluster.kubectl(
        "wait", "-n", namespace, "--for=condition=Ready", "pod/scraped", "--timeout=60s"
    )
    pod_ip = local_cluster.kubectl(
        "get", "pod", "scraped", "-n", namespace, "-o", "jsonpath={.status.podIP}"
    )

    with metrics_server(pod_ip, METRICS_PORT, b"specfleet_e2e_probe 1\n"):
        selector = f'up{{namespace="{namespace}",pod="scraped"}} == 1'
        eventually(
            lambda: prometheus_query(local_cluster, selector),
            "Prometheus to scrape the pod",
            timeout_s=90,
        )

    (series,) = prometheus_query(local_cluster, f'up{{namespace="{namespace}"}}')
    assert series["metric"]["instance"] == f"{pod_ip}:{METRICS_PORT}"
    assert {k: series["metric"][k] for k in ("specmodel", "revision", "speculation")} == {
        "specmodel": "demo",
        "revision": "3",
        "speculation": "on",
    }
    targets = httpx.get(f"{local_cluster.prometheus_url}/api/v1/targets").json()["data"]
    assert any(
        t["labels"].get("pod") == "scraped" and t["labels"]["namespace"] == namespace
        for t in targets["activeTargets"]
    )


def notified(cluster: LocalCluster, test_id: str) -> bool:
    return any(
        alert["labels"].get("test_id") == test_id
        for notification in cluster.webhook_alerts()
        for alert in notification.get("alerts", [])
    )


def test_alertmanager_delivers_to_the_webhook(local_cluster: LocalCluster) -> None:
    test_id = secrets.token_hex(4)
    alert = {
        "labels": {"alertname": "SpecfleetE2EPosted", "test_id": test_id},
        "annotations": {"summary": "posted by test_cluster.py"},
    }
    response = httpx.post(f"{local_cluster.alertmanager_url}/api/v2/alerts", json=[alert])
    response.raise_for_status()
    eventually(lambda: notified(local_cluster, test_id), "the webhook to receive the alert")


def test_prometheus_rules_fire_through_alertmanager(local_cluster: LocalCluster) -> None:
    test_id = secrets.token_hex(4)
    rule_file = local_cluster.rules_dir / f"e2e-{test_id}.yml"
    rule_file.write_text(
        f"groups:\n"
        f"  - name: e2e-{test_id}\n"
        f"    rules:\n"
        f"      - alert: SpecfleetE2EAlwaysFiring\n"
        f"        expr: vector(1)\n"
        f"        labels: {{test_id: '{test_id}'}}\n"
    )
    try:
        local_cluster.reload_prometheus()
        eventually(lambda: notified(local_cluster, test_id), "the rule's alert at the webhook")
    finally:
        rule_file.unlink()
        local_cluster.reload_prometheus()


def test_prometheus_stops_and_starts_on_the_same_port(local_cluster: LocalCluster) -> None:
    url = f"{local_cluster.prometheus_url}/-/ready"
    local_cluster.stop_prometheus()
    try:
        with pytest.raises(httpx.ConnectError):
            httpx.get(url)
    finally:
        local_cluster.start_prometheus()
    assert httpx.get(url).status_code == 200
