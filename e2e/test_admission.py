"""The API server itself refuses what `specfleet render` refuses, with the same field and
message, and accepts what render accepts: the CEL rules and schema bounds live in the CRD
generated from the models. The tables are the unit tests' (tests/test_admission_table.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.cluster.harness import Cluster

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
    cluster.kubectl("apply", "--server-side", "-f", str(ROOT / "crds/specmodel.yaml"))
    cluster.kubectl("wait", "--for=condition=Established", "crd/specmodels.specfleet.dev")


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
