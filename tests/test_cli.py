"""The command line: exit codes and messages a user (and a script) relies on."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from conftest import EXAMPLES, specmodel_doc
from specfleet.api.crd import SPECEXPERIMENT, crd_yaml
from specfleet.cli import main


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_crd_prints_the_generated_crd() -> None:
    code, out, _ = run("crd")
    assert code == 0 and out == crd_yaml()
    code, out, _ = run("crd", "--kind", "specexperiment")
    assert code == 0 and out == crd_yaml(SPECEXPERIMENT)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_render_prints_multi_document_manifests(path: Path) -> None:
    code, out, _ = run("render", "-f", str(path))
    assert code == 0
    kinds = [d["kind"] for d in yaml.safe_load_all(out)]
    assert "Deployment" in kinds and "Service" in kinds


def test_render_invalid_exits_2_naming_fields(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(specmodel_doc(speculative={"method": "eagle3"})))
    code, out, err = run("render", "-f", str(bad))
    assert code == 2 and out == ""
    assert "spec.speculative.draftModel: speculative.draftModel is required" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("spec: [unclosed", "bad.yaml"),
        ("- just\n- a list\n", "not a mapping"),
        ("kind: SpecModel\n", "metadata: Field required"),
    ],
)
def test_render_unreadable_input_exits_2(tmp_path: Path, content: str, message: str) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(content)
    code, _, err = run("render", "-f", str(bad))
    assert code == 2
    assert message in err
    assert "Traceback" not in err


def test_render_missing_file_exits_2(tmp_path: Path) -> None:
    code, _, err = run("render", "-f", str(tmp_path / "nope.yaml"))
    assert code == 2 and "nope.yaml" in err


def test_render_with_plan_turns_speculation_off(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text("revision: 3\nspeculation: false\n")
    code, out, _ = run("render", "-f", str(EXAMPLES[0]), "--plan", str(plan))
    assert code == 0
    [deployment] = [d for d in yaml.safe_load_all(out) if d["kind"] == "Deployment"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert labels["specfleet.dev/revision"] == "3"
    assert labels["specfleet.dev/speculation"] == "off"


def test_render_bad_plan_exits_2(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text("revision: 0\n")
    code, _, err = run("render", "-f", str(EXAMPLES[0]), "--plan", str(plan))
    assert code == 2 and "revision" in err
