"""The API server itself refuses what `specfleet render` refuses, with the same field and
message, and accepts what render accepts: the CEL rules and schema bounds live in the CRD
generated from the models. The tables are the unit tests' (tests/test_admission_table.py)."""

from __future__ import annotations

import base64
import json
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.cluster.harness import Cluster, eventually
from e2e.operator_runner import as_process, free_port
from specfleet.controller.admission import HANDLER_ID

ROOT = Path(__file__).resolve().parent.parent
TABLES = ROOT / "tests/data/invalid"
INVALID = [
    case
    for case in yaml.safe_load((TABLES / "specmodels.yaml").read_text())
    if not case.get("renderOnly")
]
WRONGLY_REFUSED = yaml.safe_load((TABLES / "wrongly-refused.yaml").read_text())
BASE: dict[str, Any] = {
    "apiVersion": "specfleet.dev/v1alpha1",
    "kind": "SpecModel",
    "metadata": {"name": "m"},
    "spec": {"engine": {"name": "vllm"}, "model": {"source": "org/model"}},
}


def merged(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in patch.items():
        out[key] = (
            merged(out[key], value)
            if isinstance(value, dict) and isinstance(out.get(key), dict)
            else value
        )
    return out


def manifest(case: dict[str, Any]) -> str:
    patch = {"metadata": case.get("metadata", {}), "spec": case.get("spec", {})}
    return yaml.safe_dump(merged(BASE, patch))


@pytest.fixture(scope="module")
def crd(cluster: Cluster) -> None:
    cluster.install_crd()


def dry_run(cluster: Cluster, namespace: str, text: str) -> Any:
    return cluster.run_kubectl("apply", "--dry-run=server", "-n", namespace, "-f", "-", stdin=text)


def test_the_valid_base_is_accepted(cluster: Cluster, crd: None, namespace: str) -> None:
    result = dry_run(cluster, namespace, yaml.safe_dump(BASE))
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("case", INVALID, ids=lambda c: c["name"])
def test_api_server_rejects_with_the_field_and_message(
    cluster: Cluster, crd: None, namespace: str, case: dict[str, Any]
) -> None:
    expected = {**case, **case.get("apiServer", {})}
    result = dry_run(cluster, namespace, manifest(case))
    assert result.returncode != 0, f"accepted: {case['name']}"
    assert expected["path"] in result.stderr, result.stderr
    assert expected["message"] in result.stderr, result.stderr


@pytest.mark.parametrize("case", WRONGLY_REFUSED, ids=lambda c: c["name"])
def test_api_server_accepts_what_render_accepts(
    cluster: Cluster, crd: None, namespace: str, case: dict[str, Any]
) -> None:
    result = dry_run(cluster, namespace, manifest(case))
    assert result.returncode == 0, result.stderr


def test_api_server_rejects_a_name_too_long_for_the_names_derived_from_it(
    cluster: Cluster, crd: None, namespace: str
) -> None:
    fits = dry_run(cluster, namespace, manifest({"metadata": {"name": "m" * 52}}))
    assert fits.returncode == 0, fits.stderr
    too_long = dry_run(cluster, namespace, manifest({"metadata": {"name": "m" * 53}}))
    assert too_long.returncode != 0, "accepted a 53-character name"
    assert "metadata.name" in too_long.stderr and "52" in too_long.stderr, too_long.stderr


def test_api_server_refuses_a_name_a_canary_takes(
    cluster: Cluster, crd: None, namespace: str
) -> None:
    result = dry_run(cluster, namespace, manifest({"metadata": {"name": "x-canary"}}))
    assert result.returncode != 0, "accepted a name ending in -canary"
    assert "metadata.name" in result.stderr, result.stderr
    assert "must not end in '-canary'" in result.stderr, result.stderr


CARELESS = yaml.safe_load((TABLES / "careless.yaml").read_text())


@pytest.fixture(scope="module")
def webhooked(
    cluster: Cluster, crd: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """A namespace whose SpecModels the operator's admission webhook checks: `specfleet run`
    serving it on loopback, registered as the chart registers it (the local cluster has no
    Service network, so by URL)."""
    workdir = tmp_path_factory.mktemp("webhook")
    key, cert = workdir / "tls.key", workdir / "tls.crt"
    openssl = ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"]
    openssl += ["-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"]
    subprocess.run(
        [*openssl, "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True
    )
    namespace = f"e2e-webhook-{secrets.token_hex(3)}"
    cluster.kubectl("create", "namespace", namespace)
    port = free_port()
    config = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": f"{namespace}.specfleet.dev"},
        "webhooks": [
            {
                "name": "specmodels.specfleet.dev",
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
                "failurePolicy": "Fail",
                "timeoutSeconds": 10,
                "rules": [
                    {
                        "apiGroups": ["specfleet.dev"],
                        "apiVersions": ["v1alpha1"],
                        "operations": ["CREATE", "UPDATE"],
                        "resources": ["specmodels"],
                    }
                ],
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                "clientConfig": {
                    "url": f"https://127.0.0.1:{port}/{HANDLER_ID}",
                    "caBundle": base64.b64encode(cert.read_bytes()).decode(),
                },
            }
        ],
    }
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(config))
    args = [f"--namespace={namespace}", "--bind-address=127.0.0.1", f"--webhook-port={port}"]
    args += [f"--webhook-cert={cert}", f"--webhook-key={key}"]
    try:
        with as_process(cluster.kubeconfig, workdir / "operator.log", *args):
            port_refused = manifest({"spec": {"engine": {"extraArgs": ["--port", "1"]}}})
            eventually(
                lambda: "--port" in dry_run(cluster, namespace, port_refused).stderr,
                "the webhook's first answer",
            )
            yield namespace
    finally:
        cluster.run_kubectl("delete", "validatingwebhookconfiguration", config["metadata"]["name"])
        cluster.run_kubectl("delete", "namespace", namespace, "--wait=false")


@pytest.mark.parametrize("case", CARELESS, ids=lambda c: c["name"])
def test_api_server_with_the_webhook_refuses_a_careless_specmodel(
    cluster: Cluster, webhooked: str, case: dict[str, Any]
) -> None:
    """Every error render prints; where a field's type is wrong, the API server's schema stops
    the request before CEL and the webhook see it (one round it cannot skip), so there the
    type errors alone."""
    result = dry_run(cluster, webhooked, manifest(case))
    assert result.returncode != 0, f"accepted: {case['name']}"
    if "apiServer" in case:
        for path in case["apiServer"]["paths"]:
            assert path in result.stderr, result.stderr
        return
    for error in case["errors"]:
        assert error["path"] in result.stderr, result.stderr
        assert error["message"] in result.stderr, result.stderr


def test_the_webhook_admits_a_valid_specmodel(cluster: Cluster, webhooked: str) -> None:
    result = dry_run(cluster, webhooked, yaml.safe_dump(BASE))
    assert result.returncode == 0, result.stderr
