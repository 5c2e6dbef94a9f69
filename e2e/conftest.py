"""Session fixtures for the e2e tests: the cluster (local or given) and a namespace per test."""

from __future__ import annotations

import os
import re
import secrets
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

import pytest

from e2e.cluster import harness
from e2e.cluster.harness import Cluster, LocalCluster, eventually

E2E_DIR = Path(__file__).parent
ROOT = E2E_DIR.parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if E2E_DIR in item.path.parents:
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    """The cluster under test.

    SPECFLEET_E2E_KUBECONFIG set: that cluster, left as it is. Otherwise the local cluster:
    reused (any stopped part restarted) and left running if something else, such as
    `make cluster-up`, started it; else started here and stopped at the end of the session,
    whatever the tests did.
    """
    given = os.environ.get("SPECFLEET_E2E_KUBECONFIG")
    if given:
        yield harness.external(Path(given))
        return
    if harness.any_running():
        yield harness.up()
        return
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield harness.up()
    finally:
        harness.down()


def _interrupt(signum: int, frame: FrameType | None) -> None:
    """SIGTERM ends the session like Ctrl-C does: with the teardown that stops the cluster."""
    raise KeyboardInterrupt


@pytest.fixture(scope="session")
def local_cluster(cluster: Cluster) -> LocalCluster:
    """The local cluster with its Prometheus, Alertmanager and process control."""
    if not isinstance(cluster, LocalCluster):
        pytest.skip(
            "needs the local cluster (Prometheus/Alertmanager control, kwok pod IPs); "
            "SPECFLEET_E2E_KUBECONFIG points the tests at another cluster"
        )
    return cluster


@pytest.fixture
def namespace(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace (with its default ServiceAccount) for one test, deleted after it."""
    slug = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40]
    name = f"e2e-{slug}-{secrets.token_hex(3)}"
    cluster.kubectl("create", "namespace", name)
    eventually(
        lambda: cluster.run_kubectl("get", "serviceaccount", "default", "-n", name).returncode == 0,
        "the namespace's default ServiceAccount",
    )
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found")


@pytest.fixture
def release(cluster: Cluster, namespace: str) -> Iterator[str]:
    """The chart installed for `namespace` (its ServiceAccount, RBAC with the Lease's Role);
    the namespace of the release."""
    cluster.install_crd()
    release_ns = f"{namespace}-sys"
    cluster.kubectl("create", "namespace", release_ns)
    helm = [os.environ["HELM"], "--kubeconfig", str(cluster.kubeconfig), "-n", release_ns]
    try:
        subprocess.run(
            [
                *helm,
                "install",
                "e2e",
                str(ROOT / "charts/specfleet"),
                "--skip-crds",
                "--wait=false",
                "--set",
                "watchNamespaces={" + namespace + "}",
                "--set",
                "admissionWebhook.enabled=false",
            ],
            check=True,
            capture_output=True,
            text=True,
        )
        yield release_ns
    finally:
        subprocess.run([*helm, "uninstall", "e2e"], capture_output=True, check=False)
        cluster.kubectl("delete", "namespace", release_ns, "--wait=false")
