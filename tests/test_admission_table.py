"""The admission table against `specfleet render`: every invalid SpecModel is refused up front
with its field and the fix, every valid one that used to be refused is accepted. The same tables
run against the real API server in e2e/test_admission.py."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from conftest import INVALID_CASES, ROOT, merge, specmodel_doc
from specfleet.api import InvalidSpecModel, parse_specmodel
from specfleet.api.crd import crd
from specfleet.api.hardware import product_pattern
from specfleet.cli import main
from specfleet.refusal import EXIT_INVALID

WRONGLY_REFUSED = yaml.safe_load((ROOT / "tests/data/invalid/wrongly-refused.yaml").read_text())
CARELESS = yaml.safe_load((ROOT / "tests/data/invalid/careless.yaml").read_text())


def case_doc(case: dict[str, Any]) -> dict[str, Any]:
    doc = specmodel_doc(**case.get("spec", {}))
    return merge(doc, {"metadata": case.get("metadata", {})})


def render(tmp_path: Path, document: Any) -> Any:
    manifest = tmp_path / "specmodel.yaml"
    manifest.write_text(document if isinstance(document, str) else yaml.safe_dump(document))
    return CliRunner().invoke(main, ["render", "-f", str(manifest)])


@pytest.mark.parametrize("case", INVALID_CASES, ids=lambda c: c["name"])
def test_render_refuses_with_the_field_and_the_fix(case: dict[str, Any], tmp_path: Path) -> None:
    result = render(tmp_path, case_doc(case))
    assert result.exit_code == EXIT_INVALID, result.output
    lines = [line.strip() for line in result.output.splitlines()]
    named = [line for line in lines if line.startswith(f"{case['path']}: ")]
    assert named, f"no error at {case['path']}: {lines}"
    assert any(case["message"] in line for line in named), named


@pytest.mark.parametrize("case", CARELESS, ids=lambda c: c["name"])
def test_render_prints_every_error_of_a_careless_specmodel_exactly(
    case: dict[str, Any], tmp_path: Path
) -> None:
    result = render(tmp_path, case_doc(case))
    assert result.exit_code == EXIT_INVALID, result.output
    printed = [line.strip() for line in result.output.splitlines()[1:]]
    assert printed == [f"{e['path']}: {e['message']}" for e in case["errors"]]


def test_the_tables_hold_at_least_sixty_careless_or_hostile_specmodels() -> None:
    assert len(INVALID_CASES) + len(CARELESS) >= 60


@pytest.mark.parametrize("case", WRONGLY_REFUSED, ids=lambda c: c["name"])
def test_render_accepts_what_it_used_to_refuse(case: dict[str, Any], tmp_path: Path) -> None:
    result = render(tmp_path, case_doc(case))
    assert result.exit_code == 0, result.output
    assert "kind: Deployment" in result.output


def test_every_cel_rule_of_the_crd_has_a_case_that_breaks_it() -> None:
    def rules(node: Any) -> Iterator[str]:
        if isinstance(node, dict):
            yield from (rule["message"] for rule in node.get("x-kubernetes-validations", []))
            for value in node.values():
                yield from rules(value)
        elif isinstance(node, list):
            for value in node:
                yield from rules(value)

    broken = set()
    for case in INVALID_CASES + CARELESS:
        with pytest.raises(InvalidSpecModel) as raised:
            parse_specmodel(case_doc(case))
        broken |= {error.message for error in raised.value.errors}
    unbroken = {rule for rule in rules(crd()) if not any(m.startswith(rule) for m in broken)}
    assert unbroken == set()


def test_an_integer_past_int64_in_a_free_form_field_is_named_not_a_crash() -> None:
    doc = specmodel_doc(speculative={"method": "ngram", "engineOptions": {"x": [2**64]}})
    with pytest.raises(InvalidSpecModel) as raised:
        parse_specmodel(doc)
    [error] = raised.value.errors
    assert error.path == "spec.speculative.engineOptions.x[0]"
    assert "beyond int64" in error.message


def test_the_tables_have_distinct_names() -> None:
    names = [case["name"] for case in INVALID_CASES + WRONGLY_REFUSED + CARELESS]
    assert len(names) == len(set(names))


def test_a_spaced_product_is_blackwell_but_not_a_label_value() -> None:
    """nvidia-smi prints `NVIDIA GeForce RTX 5090`; the node label says NVIDIA-GeForce-RTX-5090.
    The FP4 rule knows both; the node selector takes only the label's form."""
    doc = specmodel_doc(
        engine={"name": "tensorrt-llm"},
        quantization={"weights": "nvfp4", "preQuantized": True},
        pod={"gpu": {"product": "NVIDIA GeForce RTX 5090"}},
    )
    with pytest.raises(InvalidSpecModel) as raised:
        parse_specmodel(doc)
    assert [e.path for e in raised.value.errors] == ["spec.pod.gpu.product"]


@pytest.mark.parametrize(
    ("product", "architecture"),
    [
        ("NVIDIA GeForce RTX 5090", "Blackwell"),
        ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "Blackwell"),
        ("NVIDIA-GB10", "Blackwell"),
        ("NVIDIA-GH200-480GB", "Hopper"),
        ("NVIDIA-H20", "Hopper"),
        ("NVIDIA-L40S", "Ada"),
        ("NVIDIA-RTX-6000-Ada-Generation", "Ada"),
        ("NVIDIA-A10G", "Ampere"),
        ("NVIDIA-RTX-A6000", "Ampere"),
        ("NVIDIA-GeForce-RTX-3090", "Ampere"),
        ("Quadro-RTX-8000", "pre-Ampere"),
        ("NVIDIA-GeForce-RTX-2080-Ti", "pre-Ampere"),
    ],
)
def test_product_names_map_to_one_architecture(product: str, architecture: str) -> None:
    names = ["pre-Ampere", "Ampere", "Ada", "Hopper", "Blackwell"]
    matching = [name for name in names if re.search(product_pattern([name]), product)]
    assert matching == [architecture]


def test_a_yaml_bomb_is_refused_quickly(tmp_path: Path) -> None:
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for level in range(1, 10):
        aliases = ", ".join([f"*a{level - 1}"] * 9)
        lines.append(f"a{level}: &a{level} [{aliases}]")
    started = time.perf_counter()
    result = render(tmp_path, "\n".join(lines) + "\n")
    elapsed = time.perf_counter() - started
    assert result.exit_code == EXIT_INVALID, result.output
    assert "aliases" in result.output and "expanded" in result.output
    assert elapsed < 2, f"took {elapsed:.1f} s"


def test_an_alias_inside_itself_is_refused(tmp_path: Path) -> None:
    result = render(tmp_path, "spec: &s {loop: *s}\n")
    assert result.exit_code == EXIT_INVALID
    assert "contains it" in result.output


def test_a_file_over_the_api_servers_limit_is_refused(tmp_path: Path) -> None:
    result = render(tmp_path, "# " + "x" * (3 * 1024 * 1024) + "\n")
    assert result.exit_code == EXIT_INVALID
    assert "the API server's limit" in result.output


def test_plain_anchors_and_aliases_still_work(tmp_path: Path) -> None:
    text = (
        "apiVersion: specfleet.dev/v1alpha1\nkind: SpecModel\nmetadata: {name: m}\n"
        "spec:\n  engine: {name: vllm}\n  model: {source: &m org/model, servedName: *m}\n"
    )
    result = render(tmp_path, text)
    assert result.exit_code == 0, result.output
    assert "org/model" in result.output


def test_the_readme_counts_the_tables_as_they_are() -> None:
    readme = (ROOT / "README.md").read_text()
    refused = len(INVALID_CASES)
    assert f"{refused} of {refused}; and {len(CARELESS)} careless or hostile ones" in readme
    assert f"{len(WRONGLY_REFUSED)} valid FP4 placements accepted" in readme
