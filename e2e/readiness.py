"""A stand-in readiness probe for tests that run no engines: kwok starts specfleet's pods
Running but not Ready (`specfleet-testbed pods` marks them Ready once their engine answers /health);
without engines, this marks every Running specfleet pod Ready as a kubelet's probe would.

It watches pods and patches from a pool of threads, as every node's kubelet works on its own:
polling every pod and patching one by one made the bench's 1000 pods wait for it."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import urllib3
from kubernetes import client, config, watch

from e2e.cluster.harness import Cluster
from specfleet_testbed.kubelet import ready_patch

SELECTOR = "app.kubernetes.io/managed-by=specfleet"
KUBELETS = 8


@contextlib.contextmanager
def pods_marked_ready(cluster: Cluster) -> Iterator[None]:
    stop = threading.Event()
    thread = threading.Thread(target=_mark, args=(cluster, stop), daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=10)


def _mark(cluster: Cluster, stop: threading.Event) -> None:
    core = client.CoreV1Api(config.new_client_from_config(config_file=str(cluster.kubeconfig)))
    version: str | None = None  # where the last watch ended: resume there, not list every pod
    with ThreadPoolExecutor(KUBELETS) as kubelets:
        while not stop.is_set():
            stream = watch.Watch()
            resume = {"resource_version": version} if version else {}
            try:
                for event in stream.stream(
                    core.list_pod_for_all_namespaces,
                    label_selector=SELECTOR,
                    timeout_seconds=5,
                    deserialize=False,  # plain dicts, cheaper than the client's models
                    **resume,
                ):
                    pod = event["object"]
                    version = pod["metadata"]["resourceVersion"]
                    if event["type"] != "DELETED" and _running_unready(pod):
                        kubelets.submit(_probe_passed, core, pod["metadata"])
                    if stop.is_set():
                        stream.stop()
            # KeyError: the client's undeserialized ERROR event (an expired version) has no
            # `raw_object`; either way, list afresh.
            except (client.ApiException, urllib3.exceptions.HTTPError, KeyError):
                version = None


def _running_unready(pod: dict[str, Any]) -> bool:
    status = pod.get("status", {})
    conditions = {c["type"]: c["status"] for c in status.get("conditions", [])}
    return status.get("phase") == "Running" and conditions.get("Ready") != "True"


def _probe_passed(core: client.CoreV1Api, metadata: dict[str, Any]) -> None:
    with contextlib.suppress(client.ApiException):  # deleted meanwhile
        core.patch_namespaced_pod_status(
            metadata["name"], metadata["namespace"], ready_patch(datetime.now(UTC))
        )
