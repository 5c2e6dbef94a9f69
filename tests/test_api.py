"""The SpecModel API: parsing, defaults, and every cross-field rule with its field-named error."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from conftest import EXAMPLES, specmodel_doc
from specfleet.api import InvalidSpecModel, parse_specmodel
from specfleet.api.spec import DEFAULT_DRAFT_COST


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_is_valid(path: Any) -> None:
    specmodel = parse_specmodel(yaml.safe_load(path.read_text()))
    assert specmodel.spec.default_class in {c.name for c in specmodel.spec.classes}


def test_valid_base_spec_passes_every_rule() -> None:
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
    ("engine", "weights", "product", "ok"),
    [
        ("vllm", "nvfp4", "NVIDIA-H100-80GB-HBM3", True),
        ("vllm", "nvfp4", "Tesla-V100-SXM2-32GB", False),
        ("vllm", "mxfp4", "NVIDIA-A100-SXM4-80GB", True),
        ("tensorrt-llm", "nvfp4", "NVIDIA-H100-80GB-HBM3", False),
        ("tensorrt-llm", "nvfp4", "NVIDIA-B200", True),
        ("tensorrt-llm", "mxfp4", "NVIDIA-H100-80GB-HBM3", True),
        ("tensorrt-llm", "mxfp4", "NVIDIA-L40S", False),
        ("tensorrt-llm", "nvfp4", None, True),
    ],
)
def test_fp4_weights_need_a_gpu_the_engine_serves_them_on(
    engine: str, weights: str, product: str | None, ok: bool
) -> None:
    pod = {"gpu": {"product": product}} if product else {}
    doc = specmodel_doc(
        engine={"name": engine}, quantization={"weights": weights, "preQuantized": True}, pod=pod
    )
    if ok:
        parse_specmodel(doc)
        return
    with pytest.raises(InvalidSpecModel) as raised:
        parse_specmodel(doc)
    [error] = raised.value.errors
    assert error.path == "spec.quantization.weights"
    assert f"{weights} on {engine} needs" in error.message


def test_the_gpu_product_wins_over_the_node_selector() -> None:
    doc = specmodel_doc(
        engine={"name": "tensorrt-llm"},
        quantization={"weights": "nvfp4", "preQuantized": True},
        pod={
            "gpu": {"product": "NVIDIA-B200"},
            "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H200"},
        },
    )
    parse_specmodel(doc)
    doc["spec"]["pod"]["gpu"] = {}
    with pytest.raises(InvalidSpecModel, match="needs a Blackwell GPU"):
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
