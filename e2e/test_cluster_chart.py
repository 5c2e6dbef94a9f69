"""The Helm chart installs on a real API server, its operator Deployment rolls out, and the
API server grants its ServiceAccount what the operator needs and no Secret beyond the named."""

from __future__ import annotations

import json
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


def allowed(cluster: LocalCluster, user: str, attributes: dict[str, str]) -> bool:
    """The API server's RBAC verdict, asked for an explicit API group (a resource type the
    cluster does not serve, such as PodMonitor here, is not resolvable by `kubectl auth can-i`)."""
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {"user": user, "resourceAttributes": attributes},
    }
    answer = cluster.kubectl("create", "-o", "json", "-f", "-", stdin=json.dumps(review))
    return bool(json.loads(answer)["status"].get("allowed"))


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
        assert deployment["status"]["availableReplicas"] == 2  # a leader and a follower
        local_cluster.kubectl("get", "crd", "specmodels.specfleet.dev")
        account = f"system:serviceaccount:{namespace}:{RELEASE}-specfleet"
        for expected, verb, group, resource, name in [
            (True, "get", "", "secrets", "specfleet-alerts"),
            (False, "get", "", "secrets", "db-password"),
            (False, "list", "", "secrets", ""),
            (True, "create", "monitoring.coreos.com", "podmonitors", ""),
        ]:
            attributes = {"namespace": "default", "verb": verb, "group": group}
            attributes |= {"resource": resource, "name": name}
            assert allowed(local_cluster, account, attributes) is expected, attributes
        for expected, verb, where in [  # the leader election's Lease, only in its namespace
            (True, "get", namespace),
            (True, "create", namespace),
            (True, "update", namespace),
            (False, "delete", namespace),
            (False, "list", namespace),
            (False, "update", "default"),
        ]:
            attributes = {"namespace": where, "verb": verb, "group": "coordination.k8s.io"}
            attributes |= {"resource": "leases", "name": ""}
            assert allowed(local_cluster, account, attributes) is expected, attributes
    finally:
        helm(local_cluster, "uninstall", RELEASE, "-n", namespace, "--wait")
