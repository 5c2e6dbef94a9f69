"""The generated SpecModel CRD against a real API server: schema, descriptions, CEL rules."""

from __future__ import annotations

import contextlib
import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.cluster.harness import Cluster, KubectlError, eventually

REPO = Path(__file__).resolve().parents[1]
CRD = REPO / "crds" / "specmodel.yaml"
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))


def load(path: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(path.read_text())
    return loaded


def spec_schema() -> dict[str, Any]:
    (version,) = load(CRD)["spec"]["versions"]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return schema


def one_line(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture(scope="module")
def crd(cluster: Cluster) -> None:
    cluster.install_crd()


def test_explain_shows_the_crd_descriptions(cluster: Cluster, crd: None) -> None:
    descriptions = {
        field: one_line(schema["description"])
        for field, schema in spec_schema()["properties"].items()
    }

    def undescribed() -> list[str]:
        explained = one_line(cluster.run_kubectl("explain", "specmodel.spec").stdout)
        return [field for field, text in descriptions.items() if text not in explained]

    # The API server publishes a changed CRD's OpenAPI schema a moment after accepting it.
    with contextlib.suppress(TimeoutError):
        eventually(lambda: not undescribed(), "kubectl explain to show every description")
    assert undescribed() == []


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda path: path.name)
def test_example_is_accepted_by_the_api_server(
    cluster: Cluster, crd: None, namespace: str, example: Path
) -> None:
    out = cluster.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", str(example))
    assert "created (server dry run)" in out


def test_cel_rule_rejects_a_draft_method_without_a_draft_model(
    cluster: Cluster, crd: None, namespace: str
) -> None:
    specmodel = copy.deepcopy(load(EXAMPLES[0]))
    specmodel["spec"]["speculative"] = {"method": "eagle3"}
    with pytest.raises(KubectlError, match=r"spec\.speculative\.draftModel: Invalid value"):
        cluster.kubectl(
            "apply",
            "--dry-run=server",
            "-n",
            namespace,
            "-f",
            "-",
            stdin=yaml.safe_dump(specmodel),
        )
