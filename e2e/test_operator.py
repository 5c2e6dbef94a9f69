"""The operator against the real API server, controller-manager, scheduler and kwok GPU nodes:
create → Ready → update → kill-switch flip and release → delete, GitOps safety, failure handling,
and the operator as the chart installs it, with only its RBAC."""

from __future__ import annotations

import contextlib
import copy
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.cluster.harness import Cluster, eventually
from e2e.operator_runner import RunningOperator, as_process, in_process, service_account_kubeconfig
from e2e.readiness import pods_marked_ready

ROOT = Path(__file__).resolve().parent.parent
ACCOUNT = "e2e-specfleet"
"""The chart's ServiceAccount for release `e2e`."""
SPECMODEL: dict[str, Any] = {
    "apiVersion": "specfleet.dev/v1alpha1",
    "kind": "SpecModel",
    "metadata": {"name": "llama"},
    "spec": {
        "engine": {"name": "vllm"},
        "model": {"source": "meta-llama/Llama-3.1-8B-Instruct", "servedName": "llama"},
        "quantization": {"weights": "fp8", "online": True},
        "speculative": {"method": "eagle3", "draftModel": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"},
        "classes": [{"name": "code", "critical": True}, {"name": "chat"}],
        "defaultClass": "chat",
        "pod": {"replicas": 2, "gpu": {"product": "NVIDIA-H100-80GB-HBM3"}},
    },
}


@pytest.fixture(scope="module")
def crd(cluster: Cluster) -> None:
    cluster.install_crd()


@pytest.fixture(scope="module", autouse=True)
def ready_pods(cluster: Cluster) -> Iterator[None]:
    """These tests run no engines, so nothing answers a readiness probe."""
    with pods_marked_ready(cluster):
        yield


@pytest.fixture(scope="module")
def operator(cluster: Cluster, crd: None) -> Iterator[RunningOperator]:
    with in_process(cluster, resync_seconds=5.0) as running:
        yield running


def apply(
    cluster: Cluster, namespace: str, manifest: dict[str, Any], manager: str = "kubectl"
) -> str:
    return cluster.kubectl(
        "apply",
        "--server-side",
        f"--field-manager={manager}",
        "-n",
        namespace,
        "-f",
        "-",
        stdin=yaml.safe_dump(manifest),
    )


def get(cluster: Cluster, namespace: str, kind: str, name: str) -> dict[str, Any]:
    result: dict[str, Any] = cluster.kubectl_json("get", kind, name, "-n", namespace)
    return result


def status(cluster: Cluster, namespace: str, name: str = "llama") -> dict[str, Any]:
    result: dict[str, Any] = get(cluster, namespace, "specmodel", name).get("status", {})
    return result


def condition(status_: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in status_.get("conditions", []) if c["type"] == kind), {})


def wait_phase(
    cluster: Cluster, namespace: str, phase: str, name: str = "llama", timeout: float = 90
) -> None:
    eventually(
        lambda: status(cluster, namespace, name).get("phase") == phase, f"phase {phase}", timeout
    )


def deployment(cluster: Cluster, namespace: str, name: str = "llama") -> dict[str, Any]:
    return get(cluster, namespace, "deployment", name)


def engine_args(cluster: Cluster, namespace: str) -> list[str]:
    containers = deployment(cluster, namespace)["spec"]["template"]["spec"]["containers"]
    args: list[str] = next(c for c in containers if c["name"] == "engine")["args"]
    return args


def settled(cluster: Cluster, namespace: str) -> bool:
    st = status(cluster, namespace)
    return st.get("phase") == "Ready" and condition(st, "Ready").get("status") == "True"


def quiet_writes(operator: RunningOperator, namespace: str, seconds: float) -> float:
    """Writes over `seconds` of nothing happening, after the reconcile in flight has finished
    (its Events follow the status that the caller saw)."""
    time.sleep(2)
    before = operator.writes(namespace)
    time.sleep(seconds)
    return operator.writes(namespace) - before


def test_lifecycle(cluster: Cluster, namespace: str, operator: RunningOperator) -> None:
    apply(cluster, namespace, SPECMODEL)
    wait_phase(cluster, namespace, "Ready")
    pods = cluster.kubectl_json(
        "get", "pods", "-n", namespace, "-l", "app.kubernetes.io/instance=llama"
    )
    assert len(pods["items"]) == 2
    for pod in pods["items"]:
        assert pod["spec"]["nodeName"].startswith("kwok-gpu")
        assert pod["status"]["phase"] == "Running"
    st = status(cluster, namespace)
    assert st["speculation"] == "eagle3/4" and st["speculationActive"] is True
    assert st["activeRevision"] == 1 and st["observedGeneration"] == 1
    table = cluster.kubectl("get", "sm", "-n", namespace)
    header, row = table.splitlines()[:2]
    assert header.split() == [
        "NAME",
        "ENGINE",
        "QUANT",
        "SPEC",
        "CANARY",
        "ACCEPT",
        "SPECULATING",
        "PHASE",
        "AGE",
    ]
    assert row.split()[:4] == ["llama", "vllm", "fp8", "eagle3/4"]
    classes = len(status(cluster, namespace).get("classSpeculation", []))
    assert f"{classes}/{classes}" in row.split()  # every class speculates
    assert max(len(line) for line in table.splitlines()) <= 80

    # Steady state: nothing to change means nothing written, through several resyncs.
    assert quiet_writes(operator, namespace, 12) == 0

    # Update: a new engine config is a new revision, rolled out; the old one stays in history.
    updated = copy.deepcopy(SPECMODEL)
    updated["spec"]["quantization"]["kvCacheDtype"] = "fp8"
    apply(cluster, namespace, updated)
    eventually(lambda: status(cluster, namespace).get("activeRevision") == 2, "revision 2")
    eventually(lambda: settled(cluster, namespace), "revision 2 rolled out", 90)
    assert [r["number"] for r in status(cluster, namespace)["revisions"]] == [1, 2]
    assert "--kv-cache-dtype" in engine_args(cluster, namespace)
    revisions = cluster.kubectl_json("get", "controllerrevisions", "-n", namespace)["items"]
    assert sorted(r["revision"] for r in revisions) == [1, 2]

    # Kill switch by annotation: speculation off with zero unavailable replicas on the way.
    cluster.kubectl("annotate", "sm", "llama", "-n", namespace, "specfleet.dev/kill-switch=engage")
    eventually(lambda: "--speculative-config" not in engine_args(cluster, namespace), "spec off")
    watch_available_during_rollout(cluster, namespace)
    st = status(cluster, namespace)
    assert st["speculationActive"] is False
    assert condition(st, "SpeculationActive")["reason"] == "DisabledByAnnotation"
    assert st["killSwitch"]["state"] == "engaged"
    labels = deployment(cluster, namespace)["spec"]["template"]["metadata"]["labels"]
    assert labels["specfleet.dev/speculation"] == "off"

    cluster.kubectl(
        "annotate",
        "--overwrite",
        "sm",
        "llama",
        "-n",
        namespace,
        "specfleet.dev/kill-switch=release",
    )
    eventually(lambda: "--speculative-config" in engine_args(cluster, namespace), "spec on")
    watch_available_during_rollout(cluster, namespace)
    assert status(cluster, namespace)["speculationActive"] is True
    reasons = {e["reason"] for e in cluster.kubectl_json("get", "events", "-n", namespace)["items"]}
    assert {
        "RevisionCreated",
        "ChildrenApplied",
        "SpeculationDisabled",
        "SpeculationEnabled",
    } <= reasons

    # Delete: ownerReferences let the garbage collector take every child.
    cluster.kubectl("delete", "sm", "llama", "-n", namespace, "--wait=true")
    eventually(
        lambda: (
            not cluster.kubectl_json(
                "get",
                "deploy,svc,cm,pdb,controllerrevisions",
                "-n",
                namespace,
                "-l",
                "app.kubernetes.io/instance=llama",
            )["items"]
        ),
        "children garbage-collected",
    )


def watch_available_during_rollout(cluster: Cluster, namespace: str, timeout: float = 90) -> None:
    """Polls the Deployment until its rollout completes; fails if availability ever dropped."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        dep = deployment(cluster, namespace)
        st = dep.get("status", {})
        assert st.get("availableReplicas", 0) >= dep["spec"]["replicas"], st
        if settled(cluster, namespace) and st.get("updatedReplicas") == dep["spec"]["replicas"]:
            return
        time.sleep(0.2)
    raise TimeoutError("rollout did not complete")


def test_gitops_apply_never_conflicts_or_drifts(
    cluster: Cluster, namespace: str, operator: RunningOperator
) -> None:
    apply(cluster, namespace, SPECMODEL, manager="argocd-controller")
    wait_phase(cluster, namespace, "Ready")
    cluster.kubectl("annotate", "sm", "llama", "-n", namespace, "specfleet.dev/kill-switch=engage")
    eventually(lambda: "--speculative-config" not in engine_args(cluster, namespace), "spec off")
    eventually(lambda: settled(cluster, namespace), "settled after flip", 90)
    generation = deployment(cluster, namespace)["metadata"]["generation"]

    out = apply(cluster, namespace, SPECMODEL, manager="argocd-controller")
    assert "serverside-applied" in out
    diff = cluster.run_kubectl(
        "diff",
        "--server-side",
        "--field-manager=argocd-controller",
        "-n",
        namespace,
        "-f",
        "-",
        stdin=yaml.safe_dump(SPECMODEL),
    )
    assert diff.returncode == 0, diff.stdout + diff.stderr
    time.sleep(6)
    assert deployment(cluster, namespace)["metadata"]["generation"] == generation
    sm = cluster.kubectl_json("get", "specmodel", "llama", "-n", namespace, "--show-managed-fields")
    assert sm["metadata"]["generation"] == 1
    managers = {m["manager"]: m for m in sm["metadata"]["managedFields"]}
    assert managers["specfleet"]["subresource"] == "status"
    assert "f:spec" not in managers["specfleet"]["fieldsV1"]
    assert set(managers["specfleet"]["fieldsV1"]) == {"f:status"}
    assert "finalizers" not in sm["metadata"]


@contextlib.contextmanager
def crd_without_rules(cluster: Cluster) -> Iterator[None]:
    """The CRD as a release without its CEL rules shipped it; what it admitted stays stored
    after an upgrade to the CRD with them, which refuses the same spec up front."""
    crd = yaml.safe_load((ROOT / "crds/specmodel.yaml").read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    schema.pop("x-kubernetes-validations")
    schema["properties"]["spec"] = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    force = ("apply", "--server-side", "--force-conflicts", "-f")
    cluster.kubectl(*force, "-", stdin=yaml.safe_dump(crd))
    try:
        yield
    finally:
        cluster.kubectl(*force, str(ROOT / "crds/specmodel.yaml"))


def test_invalid_spec_past_admission_is_degraded_without_retry_storm(
    cluster: Cluster, namespace: str, operator: RunningOperator
) -> None:
    bad = copy.deepcopy(SPECMODEL)
    bad["spec"]["engine"] = {"name": "tensorrt-llm"}
    bad["spec"]["quantization"] = {
        "weights": "nvfp4",
        "preQuantized": True,
    }  # on H100s: TensorRT-LLM needs Blackwell
    with crd_without_rules(cluster):
        text = yaml.safe_dump(bad)
        eventually(  # the API server takes a moment to switch to a changed CRD's schema
            lambda: (
                cluster.run_kubectl(
                    "apply", "--server-side", "-n", namespace, "-f", "-", stdin=text
                ).returncode
                == 0
            ),
            "the SpecModel to be admitted without the CRD's rules",
        )
    wait_phase(cluster, namespace, "Invalid")
    degraded = condition(status(cluster, namespace), "Degraded")
    assert degraded["reason"] == "InvalidSpec"
    assert "spec.quantization.weights" in degraded["message"] and "Blackwell" in degraded["message"]
    assert quiet_writes(operator, namespace, 8) == 0


def test_unschedulable_gpu_request_says_why(
    cluster: Cluster, namespace: str, operator: RunningOperator
) -> None:
    big = copy.deepcopy(SPECMODEL)
    big["spec"]["pod"] = {"replicas": 1, "gpu": {"count": 16}}
    apply(cluster, namespace, big)
    wait_phase(cluster, namespace, "Degraded")
    degraded = condition(status(cluster, namespace), "Degraded")
    assert degraded["reason"] == "Unschedulable"
    assert "nvidia.com/gpu" in degraded["message"]


def test_restart_resumes_without_writes(
    cluster: Cluster, namespace: str, crd: None, tmp_path: Path
) -> None:
    with in_process(cluster) as first:
        apply(cluster, namespace, SPECMODEL)
        wait_phase(cluster, namespace, "Ready")
        del first
    generation = deployment(cluster, namespace)["metadata"]["generation"]
    with in_process(cluster) as second:
        assert quiet_writes(second, namespace, 8) == 0
    assert deployment(cluster, namespace)["metadata"]["generation"] == generation


def test_operator_as_the_chart_installs_it(
    cluster: Cluster, namespace: str, crd: None, tmp_path: Path
) -> None:
    """The chart's RBAC is enough: the operator runs with nothing but its ServiceAccount."""
    helm = os.environ["HELM"]
    release_ns = f"{namespace}-sys"
    cluster.kubectl("create", "namespace", release_ns)
    try:
        subprocess.run(
            [
                helm,
                "install",
                "e2e",
                str(ROOT / "charts/specfleet"),
                "-n",
                release_ns,
                "--kubeconfig",
                str(cluster.kubeconfig),
                "--skip-crds",
                "--wait=false",
                "--set",
                "watchNamespaces={" + namespace + "}",
                "--set",
                "admissionWebhook.enabled=false",  # no Service network to reach it here
            ],
            check=True,
            capture_output=True,
            text=True,
        )
        kubeconfig = service_account_kubeconfig(
            cluster, release_ns, ACCOUNT, tmp_path / "sa.kubeconfig"
        )
        for verb, resource, subresource in [
            ("list", "specmodels", ""),
            ("patch", "specmodels", "--subresource=status"),
            ("patch", "deployments", ""),
        ]:
            args = ["auth", "can-i", verb, resource, "-n", namespace]
            args += [f"--as=system:serviceaccount:{release_ns}:{ACCOUNT}"]
            args += [subresource] if subresource else []
            assert cluster.kubectl(*args).strip() == "yes", (verb, resource, subresource)
        for verb, resource, where in [
            ("list", "secrets", namespace),
            ("patch", "specmodels", namespace),
            ("create", "deployments", "default"),
            ("list", "nodes", ""),
        ]:
            args = [
                "auth",
                "can-i",
                verb,
                resource,
                f"--as=system:serviceaccount:{release_ns}:{ACCOUNT}",
            ]
            args += ["-n", where] if where else []
            assert cluster.run_kubectl(*args).stdout.strip() == "no", (verb, resource, where)
        with as_process(kubeconfig, tmp_path / "operator.log", f"--namespace={namespace}"):
            apply(cluster, namespace, SPECMODEL)
            wait_phase(cluster, namespace, "Ready")
        assert "Forbidden" not in (tmp_path / "operator.log").read_text()
    finally:
        subprocess.run(
            [
                helm,
                "uninstall",
                "e2e",
                "-n",
                release_ns,
                "--kubeconfig",
                str(cluster.kubeconfig),
            ],
            capture_output=True,
            check=False,
        )
        cluster.kubectl("delete", "namespace", release_ns, "--wait=false")
