"""The SpecModel API: parsing, defaults, and every cross-field rule with its field-named error."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from conftest import EXAMPLES, INVALID_CASES, specmodel_doc
from specfleet.api import InvalidSpecModel, parse_specmodel
from specfleet.api.spec import DEFAULT_DRAFT_COST


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_is_valid(path: Any) -> None:
    specmodel = parse_specmodel(yaml.safe_load(path.read_text()))
    assert specmodel.spec.default_class in {c.name for c in specmodel.spec.classes}


@pytest.mark.parametrize("case", INVALID_CASES, ids=lambda c: c["name"])
def test_invalid_spec_names_field_and_fix(case: dict[str, Any]) -> None:
    with pytest.raises(InvalidSpecModel) as raised:
        parse_specmodel(specmodel_doc(**case["spec"]))
    matching = [e for e in raised.value.errors if e.path == case["path"]]
    assert matching, f"no error at {case['path']}: {raised.value.errors}"
    assert any(case["message"] in e.message for e in matching), matching


def test_valid_base_spec_passes_every_rule() -> None:
    for case in INVALID_CASES:
        assert case["path"].startswith("spec.")
    parse_specmodel(specmodel_doc())


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("x-canary", "must not end in '-canary'"),
        ("m" * 53, "at most 52 characters"),
    ],
)
def test_a_name_that_would_collide_or_not_fit_is_refused(name: str, message: str) -> None:
    doc = specmodel_doc()
    doc["metadata"]["name"] = name
    with pytest.raises(InvalidSpecModel) as raised:
        parse_specmodel(doc)
    [error] = raised.value.errors
    assert error.path == "metadata.name" and message in error.message
    doc["metadata"]["name"] = "x-canary-2"  # the suffix only at the end
    assert parse_specmodel(doc).metadata.name == "x-canary-2"


def test_unknown_field_is_named_with_a_hint() -> None:
    with pytest.raises(InvalidSpecModel) as raised:
        parse_specmodel(specmodel_doc(speculative={"method": "ngram", "num_tokens": 3}))
    [error] = raised.value.errors
    assert error.path == "spec.speculative.num_tokens"
    assert "camelCase" in error.message


def test_all_errors_reported_together() -> None:
    with pytest.raises(InvalidSpecModel) as raised:
        parse_specmodel(
            specmodel_doc(
                engine={"name": "tensorrt-llm"},
                speculative={"method": "eagle"},
                classes=[{"name": "a"}],
            )
        )
    paths = {e.path for e in raised.value.errors}
    assert paths == {"spec.speculative.method", "spec.speculative.draftModel", "spec.defaultClass"}


def test_defaults_fill_in_a_minimal_spec() -> None:
    spec = parse_specmodel(specmodel_doc()).spec
    assert spec.quantization.weights == "none"
    assert spec.quantization.kv_cache_dtype == "auto"
    assert [c.name for c in spec.classes] == ["default"]
    assert spec.guard.mode == "auto"
    assert spec.guard.consecutive_breaches == 3
    assert spec.pod.replicas == 1
    assert spec.pod.gpu.resource_name == "nvidia.com/gpu"


@pytest.mark.parametrize(
    ("product", "ok"),
    [
        ("NVIDIA-H100-80GB-HBM3", False),
        ("NVIDIA-A100-SXM4-80GB", False),
        ("NVIDIA-B200", True),
        ("NVIDIA-GB200", True),
        (None, True),
    ],
)
def test_fp4_weights_need_blackwell(product: str | None, ok: bool) -> None:
    pod = {"gpu": {"product": product}} if product else {}
    doc = specmodel_doc(quantization={"weights": "nvfp4"}, pod=pod)
    if ok:
        parse_specmodel(doc)
        return
    with pytest.raises(InvalidSpecModel) as raised:
        parse_specmodel(doc)
    assert raised.value.errors[0].path == "spec.quantization.weights"
    assert "Blackwell" in raised.value.errors[0].message


def test_fp4_rule_reads_the_node_selector_too() -> None:
    doc = specmodel_doc(
        quantization={"weights": "mxfp4"},
        pod={"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H200"}},
    )
    with pytest.raises(InvalidSpecModel, match="NVIDIA-H200"):
        parse_specmodel(doc)


def test_draft_cost_defaults_by_method_and_can_be_set() -> None:
    spec = parse_specmodel(specmodel_doc(speculative={"method": "ngram"})).spec.speculative
    assert spec is not None
    assert spec.effective_draft_cost() == DEFAULT_DRAFT_COST["ngram"]
    spec = parse_specmodel(
        specmodel_doc(speculative={"method": "ngram", "draftCost": 0.2})
    ).spec.speculative
    assert spec is not None
    assert spec.effective_draft_cost() == 0.2


def test_wire_round_trip_is_lossless() -> None:
    for path in EXAMPLES:
        specmodel = parse_specmodel(yaml.safe_load(path.read_text()))
        again = parse_specmodel(specmodel.to_wire())
        assert again == specmodel
