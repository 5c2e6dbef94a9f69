"""The escape hatches cannot undo the contract: what the operator owns is read off the
renderer's own output, and the engines' flag lists are the ones validation checks against."""

from __future__ import annotations

import json
from typing import Any

import kopf
import pytest

from conftest import ROOT, specmodel_doc
from specfleet.api import InvalidSpecModel, parse_specmodel
from specfleet.api.escape_hatches import owned_flags
from specfleet.api.spec import ENGINE_VERSIONS
from specfleet.controller.admission import admit
from specfleet.render import vllm
from specfleet.render.owned import owned

FLAGS = ROOT / "operator/specfleet/api/flags"


def test_the_owned_list_is_what_the_renderer_emits_today() -> None:
    """`make crd` writes it; a renderer change without it fails here."""
    assert json.loads((FLAGS / "owned.json").read_text()) == owned()


@pytest.mark.parametrize(
    ("engine", "version"), [(e, v) for e, versions in ENGINE_VERSIONS.items() for v in versions]
)
def test_every_flag_the_renderer_emits_is_one_each_known_version_has(
    engine: str, version: str
) -> None:
    known = set((FLAGS / f"{engine}-{version}.txt").read_text().splitlines())
    assert set(owned()[engine]["flags"]) - known == set()
    assert set(owned_flags(engine, version)) <= known


def test_an_owned_switch_is_refused_in_either_direction_each_version_spells() -> None:
    pinned, cpu_build = owned_flags("vllm", "0.33.0"), owned_flags("vllm", "0.32.0")
    assert pinned["--enable-auto-tool-choice"] == pinned["--disable-auto-tool-choice"]
    assert cpu_build["--enable-auto-tool-choice"] == cpu_build["--no-enable-auto-tool-choice"]
    assert "--no-enable-auto-tool-choice" not in pinned  # not a flag of 0.33.0


def test_a_flag_is_checked_against_the_declared_version() -> None:
    args = ["--no-enable-prefix-caching"]
    parse_specmodel(specmodel_doc(engine={"name": "vllm", "version": "0.32.0", "extraArgs": args}))
    [error] = errors_of(engine={"name": "vllm", "extraArgs": args})
    assert "not a flag of vllm 0.33.0; did you mean --enable-prefix-caching?" in error


def errors_of(**spec: Any) -> list[str]:
    with pytest.raises(InvalidSpecModel) as raised:
        parse_specmodel(specmodel_doc(**spec))
    return [str(error) for error in raised.value.errors]


def test_a_value_that_looks_like_a_flag_is_not_one() -> None:
    spec = specmodel_doc(engine={"name": "vllm", "extraArgs": ["--seed", "-1", "--enable-lora"]})
    args = vllm.args(parse_specmodel(spec).engine_config(), "m", speculation=False)
    assert args[-3:] == ["--seed", "-1", "--enable-lora"]


def test_tunables_of_the_speculative_config_pass_through() -> None:
    parse_specmodel(
        specmodel_doc(
            engine={"name": "tensorrt-llm"},
            speculative={
                "method": "eagle3",
                "draftModel": "d",
                "engineOptions": {"eagle3_one_model": False, "acceptance_window": 128},
            },
        )
    )
    parse_specmodel(specmodel_doc(speculative={"method": "ngram", "engineOptions": {"x": 1}}))


@pytest.mark.parametrize(
    "source",
    [
        "RedHatAI/Meta-Llama-3.1-8B-Instruct-FP8",
        "neuralmagic/meta-llama-3.1-8b-instruct-fp8-dynamic",
        "/models/llama-fp8",
    ],
)
def test_a_checkpoint_whose_name_says_its_format_needs_no_declaration(source: str) -> None:
    parse_specmodel(specmodel_doc(model={"source": source}, quantization={"weights": "fp8"}))


def test_declaring_a_checkpoint_pre_quantized_rolls_no_pods() -> None:
    declared = specmodel_doc(quantization={"weights": "fp8", "preQuantized": True})
    named = specmodel_doc(model={"source": "org/model-fp8"}, quantization={"weights": "fp8"})
    assert (
        parse_specmodel(declared).engine_config().canonical()["quantization"]
        == (parse_specmodel(named).engine_config().canonical()["quantization"])
    )


def test_gpt_oss_is_mxfp4_by_its_name() -> None:
    parse_specmodel(
        specmodel_doc(model={"source": "openai/gpt-oss-20b"}, quantization={"weights": "mxfp4"})
    )


def test_the_webhook_refuses_with_every_error_on_a_line_of_its_own() -> None:
    body = kopf.Body(
        specmodel_doc(
            engine={"name": "vllm", "extraArgs": ["--port", "1"]},
            quantization={"weights": "awq"},
        )
    )
    with pytest.raises(kopf.AdmissionError) as raised:
        admit(body=body)
    lines = str(raised.value).splitlines()
    assert [line.split(":", 1)[0] for line in lines] == [
        "spec.quantization.weights",
        "spec.engine.extraArgs[0]",
    ]
    assert raised.value.code == 422


def test_the_webhook_admits_a_valid_specmodel() -> None:
    admit(body=kopf.Body(specmodel_doc()))
