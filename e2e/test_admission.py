"""The API server itself refuses what `specfleet render` refuses, with the same field and
message: the CEL rules and schema bounds live in the CRD generated from the models."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.cluster.harness import Cluster

ROOT = Path(__file__).resolve().parent.parent
CASES = yaml.safe_load((ROOT / "tests/data/invalid_specmodels.yaml").read_text())
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


@pytest.fixture(scope="module")
def crd(cluster: Cluster) -> None:
    cluster.kubectl("apply", "--server-side", "-f", str(ROOT / "crds/specmodel.yaml"))
    cluster.kubectl("wait", "--for=condition=Established", "crd/specmodels.specfleet.dev")


def test_the_valid_base_is_accepted(cluster: Cluster, crd: None, namespace: str) -> None:
    cluster.kubectl(
        "apply", "--dry-run=server", "-n", namespace, "-f", "-", stdin=yaml.safe_dump(BASE)
    )


@pytest.mark.parametrize("case", CASES, ids=lambda c: c["name"])
def test_api_server_rejects_with_the_field_and_message(
    cluster: Cluster, crd: None, namespace: str, case: dict[str, Any]
) -> None:
    manifest = merged(BASE, {"spec": case["spec"]})
    result = cluster.run_kubectl(
        "apply", "--dry-run=server", "-n", namespace, "-f", "-", stdin=yaml.safe_dump(manifest)
    )
    assert result.returncode != 0, f"accepted: {case['name']}"
    assert case["path"] in result.stderr, result.stderr
    assert case["message"] in result.stderr, result.stderr


def test_api_server_rejects_a_name_too_long_for_the_names_derived_from_it(
    cluster: Cluster, crd: None, namespace: str
) -> None:
    fits = merged(BASE, {"metadata": {"name": "m" * 52}})
    cluster.kubectl(
        "apply", "--dry-run=server", "-n", namespace, "-f", "-", stdin=yaml.safe_dump(fits)
    )
    too_long = merged(BASE, {"metadata": {"name": "m" * 53}})
    result = cluster.run_kubectl(
        "apply", "--dry-run=server", "-n", namespace, "-f", "-", stdin=yaml.safe_dump(too_long)
    )
    assert result.returncode != 0, "accepted a 53-character name"
    assert "metadata.name" in result.stderr and "52" in result.stderr, result.stderr


def test_api_server_refuses_a_name_a_canary_takes(
    cluster: Cluster, crd: None, namespace: str
) -> None:
    taken = merged(BASE, {"metadata": {"name": "x-canary"}})
    result = cluster.run_kubectl(
        "apply", "--dry-run=server", "-n", namespace, "-f", "-", stdin=yaml.safe_dump(taken)
    )
    assert result.returncode != 0, "accepted a name ending in -canary"
    assert "metadata.name" in result.stderr, result.stderr
    assert "must not end in '-canary'" in result.stderr, result.stderr
