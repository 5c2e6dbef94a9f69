"""A stand-in readiness probe for tests that run no engines: kwok starts specfleet's pods
Running but not Ready (`specfleet sim pods` marks them Ready once their engine answers /health);
without engines, this marks every Running specfleet pod Ready as a kubelet's probe would."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from datetime import UTC, datetime

from kubernetes import client, config

from e2e.cluster.harness import Cluster
from specfleet.sim.pods import ready_patch

SELECTOR = "app.kubernetes.io/managed-by=specfleet"


@contextlib.contextmanager
def pods_marked_ready(cluster: Cluster, period_s: float = 1.0) -> Iterator[None]:
    stop = threading.Event()
    thread = threading.Thread(target=_mark, args=(cluster, stop, period_s), daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=10)


def _mark(cluster: Cluster, stop: threading.Event, period_s: float) -> None:
    core = client.CoreV1Api(config.new_client_from_config(config_file=str(cluster.kubeconfig)))
    while not stop.is_set():
        with contextlib.suppress(client.ApiException):
            for pod in core.list_pod_for_all_namespaces(label_selector=SELECTOR).items:
                conditions = {c.type: c.status for c in pod.status.conditions or []}
                if pod.status.phase == "Running" and conditions.get("Ready") != "True":
                    with contextlib.suppress(client.ApiException):
                        core.patch_namespaced_pod_status(
                            pod.metadata.name,
                            pod.metadata.namespace,
                            ready_patch(datetime.now(UTC)),
                        )
        stop.wait(period_s)
