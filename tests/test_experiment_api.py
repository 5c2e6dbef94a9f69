"""The SpecExperiment API: its CRD's names and columns, validation naming field and fix, and the
arms as overlays of the SpecModel's spec."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from conftest import ROOT, experiment_doc
from specfleet.api.crd import SPECEXPERIMENT, crd
from specfleet.api.experiment import ArmOverlay, SpecExperimentSpec
from specfleet.api.validation import InvalidSpecExperiment, parse_specexperiment
from specfleet.api.verdict import ArmName
from specfleet.experiment.arms import arms_of, overlay_spec

EXAMPLE = ROOT / "examples/experiments/specexperiment.yaml"


def errors(document: dict[str, Any]) -> list[str]:
    with pytest.raises(InvalidSpecExperiment) as raised:
        parse_specexperiment(document)
    return [str(e) for e in raised.value.errors]


def test_crd_names_columns_and_status_subresource() -> None:
    spec = crd(SPECEXPERIMENT)["spec"]
    assert spec["names"]["shortNames"] == ["sx"]
    assert spec["names"]["plural"] == "specexperiments"
    [version] = spec["versions"]
    assert version["subresources"] == {"status": {}}
    columns = [c["name"] for c in version["additionalPrinterColumns"]]
    assert columns == ["SpecModel", "Phase", "Leading arm", "Progress", "Age"]


def test_the_example_is_valid() -> None:
    experiment = parse_specexperiment(yaml.safe_load(EXAMPLE.read_text()))
    assert experiment.spec.sample.of("tools") == 0.2
    assert experiment.spec.sample.of("chat") == 0.05


def test_defaults() -> None:
    spec = parse_specexperiment(experiment_doc()).spec
    assert (spec.sample.share, spec.replicas, spec.arms, spec.capacity) == (0.05, 1, [], None)


@pytest.mark.parametrize(
    ("spec", "field", "fix"),
    [
        ({"minRequestsPerClass": None}, "spec", "durationSeconds, minRequestsPerClass"),
        ({"arms": [{"name": "baseline"}]}, "spec.arms", "list all four"),
        ({"sample": {"share": 0}}, "spec.sample.share", "greater than 0"),
        ({"sample": {"classes": {"tools": 1.5}}}, "spec.sample.classes.tools", "less than"),
        ({"arms": [{"name": "fp8"}]}, "spec.arms[0].name", "baseline"),
        ({"gpuHourPrice": None}, "spec.gpuHourPrice", "required"),
    ],
)
def test_invalid_experiments_name_the_field_and_fix(
    spec: dict[str, Any], field: str, fix: str
) -> None:
    document = experiment_doc(**spec)
    document["spec"] = {k: v for k, v in document["spec"].items() if v is not None}
    found = errors(document)
    assert any(e.startswith(f"{field}:") and fix in e for e in found), found


def test_names_past_40_characters_are_refused_for_the_arm_names() -> None:
    document = experiment_doc()
    document["metadata"]["name"] = "x" * 41
    assert errors(document) == ["metadata.name: at most 40 characters; shorten it"]
    document["metadata"]["name"] = "Llama.arms"
    assert "DNS-1035" in errors(document)[0]


def test_default_arms_are_the_four_overlays_with_the_unquantized_source_once() -> None:
    spec = SpecExperimentSpec.model_validate(experiment_doc(unquantizedSource="org/bf16")["spec"])
    overlays = {arm.name: arm.overlay for arm in arms_of(spec)}
    assert list(overlays) == list(ArmName)
    assert overlays[ArmName.BOTH] == ArmOverlay(quantization=True, speculative=True)
    assert overlays[ArmName.QUANTIZED] == ArmOverlay(quantization=True, speculative=False)
    assert overlays[ArmName.SPECULATIVE] == ArmOverlay(
        quantization=False, speculative=True, model_source="org/bf16"
    )
    assert overlays[ArmName.BASELINE] == ArmOverlay(
        quantization=False, speculative=False, model_source="org/bf16"
    )


def test_an_overlay_drops_what_it_turns_off_and_keeps_the_rest() -> None:
    spec = {
        "model": {"source": "org/fp8"},
        "quantization": {"weights": "fp8"},
        "speculative": {"method": "ngram"},
    }
    baseline = overlay_spec(
        spec, ArmOverlay(quantization=False, speculative=False, model_source="b")
    )
    assert baseline == {"model": {"source": "b"}}
    assert overlay_spec(spec, ArmOverlay()) == spec
    assert spec["model"]["source"] == "org/fp8"
