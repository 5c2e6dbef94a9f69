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


PLAN_EXAMPLE = "e.g. `revision: 2` and `speculation: false`"
ROLLOUT_CONFIG = "{engine: {name: vllm}, model: {source: org/new}, quantization: {}}"


@pytest.mark.parametrize(
    ("content", "problems"),
    [
        ("", [f"(file): holds 0 YAML documents; a plan is one, {PLAN_EXAMPLE}"]),
        (
            "revision: 2\n---\nrevision: 3\n",
            [f"(file): holds 2 YAML documents; a plan is one, {PLAN_EXAMPLE}"],
        ),
        (
            "kind: SpecModel\nspec: {}\n",
            [
                "kind: a SpecModel is not a plan: give it with -f; a plan says what runs, "
                + PLAN_EXAMPLE
            ],
        ),
        (
            "revision: 0\nspeculation: maybe\nreason: Trial\nrollout: {revision: 2, pods: 1}\n",
            [
                "revision: Input should be greater than or equal to 1 (Active revision number)",
                "speculation: Input should be a valid boolean, unable to interpret input "
                "(Run the speculative config, if any)",
                "rollout.engineConfig: required; add it (The new revision's engine config)",
                "reason: unknown field; a plan takes revision, speculation, canary, engineConfig, "
                "rollout, mirror, plain",
            ],
        ),
        (
            "mirror: {experiment: x, baseline: b, sample: {chat: 0.1}, arms: [{name: b, urll: x}]}",
            [
                "mirror.arms[0].url: required; add it (Base URL of the arm's own gateway Service: "
                "`http://` and a loopback address or a Service name "
                "(`<service>.<namespace>.svc[.cluster.local]`), a port, no path)",
                "mirror.arms[0].urll: unknown field; mirror.arms takes name, url",
            ],
        ),
        (
            f"rollout: {{revision: 2, pods: 2, engineConfig: {ROLLOUT_CONFIG}}}\n",
            [
                "rollout.pods: 2 pods would leave none of llama31-70b-awq's 2 replicas to the "
                "fleet; a step takes at most pod.replicas - 1, and a SpecModel with fewer than 2 "
                "replicas has no canary rollout (leave rollout out)"
            ],
        ),
    ],
    ids=[
        "empty",
        "two-documents",
        "a-specmodel",
        "every-field-at-once",
        "nested",
        "rollout-takes-the-fleet",
    ],
)
def test_render_refuses_a_bad_plan_naming_each_field_and_its_fix(
    tmp_path: Path, content: str, problems: list[str]
) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(content)
    code, out, err = run("render", "-f", str(EXAMPLES[0]), "--plan", str(plan))
    assert (code, out) == (2, "")
    assert err.splitlines() == [f"error: {plan} is not a valid serving plan:"] + [
        f"  {problem}" for problem in problems
    ]
