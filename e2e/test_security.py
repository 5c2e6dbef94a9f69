"""The security examples against the real API server: the admission policy refuses SpecModels
that would run an unlisted image or the model repository's code, and the NetworkPolicy that
admits only the gateway's ports is a valid object."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.cluster.harness import Cluster, eventually

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples/security"
POLICY, BINDING = yaml.safe_load_all((EXAMPLES / "engine-admission-policy.yaml").read_text())


def specmodel(**spec: Any) -> str:
    body = {"engine": {"name": "vllm"}, "model": {"source": "org/model"}} | spec
    return yaml.safe_dump(
        {"apiVersion": "specfleet.dev/v1alpha1", "kind": "SpecModel", "metadata": {"name": "m"}}
        | {"spec": body}
    )


@pytest.fixture
def policy(cluster: Cluster, namespace: str) -> Iterator[None]:
    """The example policy, bound to this test's namespace only."""
    cluster.install_crd()
    name = f"{POLICY['metadata']['name']}-{namespace}"
    policy = {**POLICY, "metadata": {"name": name}}
    selector = {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
    binding = {
        **BINDING,
        "metadata": {"name": name},
        "spec": {
            **BINDING["spec"],
            "policyName": name,
            "matchResources": {"namespaceSelector": selector},
        },
    }
    cluster.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all([policy, binding]))
    yield
    cluster.run_kubectl(
        "delete", "validatingadmissionpolicybinding,validatingadmissionpolicy", name
    )


def dry_run(cluster: Cluster, namespace: str, manifest: str) -> Any:
    return cluster.run_kubectl(
        "apply", "--dry-run=server", "-n", namespace, "-f", "-", stdin=manifest
    )


def test_admission_policy_refuses_unlisted_images_and_remote_code(
    cluster: Cluster, namespace: str, policy: None
) -> None:
    unlisted = specmodel(engine={"name": "vllm", "image": "docker.io/someone/miner:latest"})
    eventually(
        lambda: "is not from an allowed registry" in dry_run(cluster, namespace, unlisted).stderr,
        "the policy refuses an unlisted engine image",
    )
    for manifest, message in [
        (specmodel(model={"source": "org/model", "trustRemoteCode": True}), "trustRemoteCode"),
        (
            specmodel(engine={"name": "vllm", "extraArgs": ["--trust-remote-code"]}),
            "--trust-remote-code",
        ),
    ]:
        refused = dry_run(cluster, namespace, manifest)
        assert refused.returncode != 0 and message in refused.stderr, refused.stderr
    for manifest in [
        specmodel(),
        specmodel(engine={"name": "vllm", "image": "registry.example.com/inference/vllm:0.33"}),
        specmodel(
            engine={"name": "tensorrt-llm", "image": "nvcr.io/nvidia/tensorrt-llm/release:1.2.1"}
        ),
    ]:
        accepted = dry_run(cluster, namespace, manifest)
        assert accepted.returncode == 0, accepted.stderr


def test_gateway_only_network_policy_is_valid(cluster: Cluster, namespace: str) -> None:
    manifest = yaml.safe_load((EXAMPLES / "gateway-only-networkpolicy.yaml").read_text())
    manifest["metadata"]["namespace"] = namespace
    done = dry_run(cluster, namespace, yaml.safe_dump(manifest))
    assert done.returncode == 0, done.stderr
