"""Examples are copied: every SpecModel under examples/ must be safe to run as it stands."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from conftest import ROOT
from specfleet.api import parse_specmodel
from specfleet.api.model import SpecModel

SPECMODELS = sorted(
    path
    for path in (ROOT / "examples").rglob("*.yaml")
    if any(doc and doc.get("kind") == "SpecModel" for doc in yaml.safe_load_all(path.read_text()))
)
CPUS_PER_GPU = 4
GIB_PER_GPU = 32


def example(path: Path) -> SpecModel:
    [doc] = [d for d in yaml.safe_load_all(path.read_text()) if d.get("kind") == "SpecModel"]
    return parse_specmodel(doc)


def test_the_examples_are_found() -> None:
    names = {path.name for path in SPECMODELS}
    assert {"llama-3.1-70b-awq-draft.yaml", "four-arms.specmodel.yaml"} <= names
    assert "bad-quantization.specmodel.yaml" in names


@pytest.mark.parametrize("path", SPECMODELS, ids=lambda p: str(p.relative_to(ROOT / "examples")))
def test_every_example_requests_host_cpu_and_memory_for_its_gpus(path: Path) -> None:
    """Without requests an 8-GPU node packs engines onto CPUs and memory they then fight for;
    the floor (4 CPUs, 32Gi a GPU) is what a tensor-parallel worker and its share of the
    checkpoint need while loading."""
    specmodel = example(path)
    pod = specmodel.spec.pod
    requests = (pod.resources or {}).get("requests", {})
    assert {"cpu", "memory"} <= set(requests), f"{path.name}: pod.resources.requests"
    gpus = pod.gpu.count or specmodel.spec.model.tensor_parallel_size
    assert int(requests["cpu"]) >= CPUS_PER_GPU * gpus
    assert int(requests["memory"].removesuffix("Gi")) >= GIB_PER_GPU * gpus
