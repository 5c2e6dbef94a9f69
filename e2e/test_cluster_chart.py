"""The Helm chart installs on a real API server, and its operator Deployment rolls out."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from e2e.cluster.harness import LocalCluster

CHART = Path(__file__).resolve().parents[1] / "charts" / "specfleet"
RELEASE = "sf-e2e"


def helm(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    binary = os.environ.get("HELM")
    if not binary:
        pytest.skip("HELM is not set: run the e2e tests through `make e2e` (it builds helm)")
    argv = [binary, *args, "--kubeconfig", str(cluster.kubeconfig)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=300)


def test_chart_installs_and_its_operator_becomes_available(
    local_cluster: LocalCluster, namespace: str
) -> None:
    """Needs kwok: the operator image is never pulled, kwok makes its pod Ready."""
    installed = helm(
        local_cluster, "install", RELEASE, str(CHART), "-n", namespace, "--wait", "--timeout=2m"
    )
    try:
        assert installed.returncode == 0, installed.stderr
        (deployment,) = local_cluster.kubectl_json(
            "get", "deployments", "-n", namespace, "-l", f"app.kubernetes.io/instance={RELEASE}"
        )["items"]
        assert deployment["status"]["availableReplicas"] == 1
        local_cluster.kubectl("get", "crd", "specmodels.specfleet.dev")
    finally:
        helm(local_cluster, "uninstall", RELEASE, "-n", namespace, "--wait")
