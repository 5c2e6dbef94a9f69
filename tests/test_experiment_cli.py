"""`specfleet experiment`: the simulated four arms of the example, the report, bad input."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from PIL import Image

from conftest import experiment_doc
from specfleet.api import parse_specmodel
from specfleet.api.validation import parse_specexperiment
from specfleet.api.verdict import ArmName, ExperimentVerdict, Outcome
from specfleet.cli import main
from specfleet.experiment.arms import arm_document, default_arms
from specfleet.experiment.basis import BASIS, Source, basis_json
from specfleet.experiment.cli import verdict_json
from specfleet.experiment.report import markdown
from specfleet.experiment.simulation import basis, load_experiment, run
from specfleet.experiment.workloads import InvalidArms, render_arms
from specfleet.yamlio import InputError

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples/experiments"
SPECMODEL = EXAMPLE / "four-arms.specmodel.yaml"
SCENARIO = EXAMPLE / "four-arms.yaml"


@pytest.fixture(scope="module")
def verdict() -> ExperimentVerdict:
    return run(load_experiment(SPECMODEL, SCENARIO))


def test_the_example_excludes_broken_tool_calls_and_recommends_speculation(
    verdict: ExperimentVerdict,
) -> None:
    assert (verdict.outcome, verdict.recommendation) == (Outcome.RECOMMENDED, "speculative")
    tools = {(e.arm, e.signal) for e in verdict.exclusions if e.class_name == "tools"}
    assert tools == {("quantized", "toolCallValidity"), ("both", "toolCallValidity")}
    rows = {row.arm: row for row in verdict.overall}
    assert rows["quantized"].tool_call_validity == pytest.approx(0.80, abs=0.02)
    assert rows["baseline"].tool_call_validity == pytest.approx(0.99, abs=0.01)
    # every arm served the very same requests
    assert len({row.requests for row in verdict.overall}) == 1
    # the baseline decodes without drafting and speculation makes decoding faster
    code = {row.arm: row for row in verdict.classes[0].rows}
    assert code["baseline"].acceptance_rate is None and code["speculative"].acceptance_rate
    assert code["speculative"].tpot.p95_seconds < code["baseline"].tpot.p95_seconds  # type: ignore[union-attr]


def test_committed_example_outputs_are_current(verdict: ExperimentVerdict) -> None:
    """Regenerate with the command at the top of examples/experiments/four-arms.yaml."""
    stands_on = basis(load_experiment(SPECMODEL, SCENARIO))
    assert (EXAMPLE / "four-arms/verdict.json").read_text() == verdict_json(verdict)
    assert (EXAMPLE / "four-arms" / BASIS).read_text() == basis_json(stands_on)
    assert (EXAMPLE / "four-arms/report.md").read_text() == markdown(verdict, stands_on)
    # the picture under docs/ is the example's, and its Markdown with it
    assert (ROOT / "docs/experiment-report.md").read_text() == markdown(verdict, stands_on)
    assert (ROOT / "docs/experiment-report.png").read_bytes() == (
        EXAMPLE / "four-arms/report.png"
    ).read_bytes()


def test_the_simulated_basis_says_the_throughput_is_a_model_and_the_price_is_usd() -> None:
    stands_on = basis(load_experiment(SPECMODEL, SCENARIO))
    assert stands_on.sources() == {Source.MODEL}
    assert (stands_on.currency, stands_on.price_source) == ("USD", "four-arms.yaml, gpu_hour_price")
    assert stands_on.slos["code"].max_p95_tpot_seconds == 0.015


def test_the_arms_are_overlays_of_the_spec() -> None:
    document = yaml.safe_load(SPECMODEL.read_text())
    arms = {arm.name: arm_document(document, arm)["spec"] for arm in default_arms()}
    assert "quantization" in arms[ArmName.QUANTIZED]
    assert "speculative" not in arms[ArmName.QUANTIZED]
    assert "quantization" not in arms[ArmName.SPECULATIVE]
    assert {"quantization", "speculative"} & set(arms[ArmName.BASELINE]) == set()
    assert arms[ArmName.BOTH] == document["spec"]


def test_the_report_reads_like_a_design_review(verdict: ExperimentVerdict) -> None:
    text = markdown(verdict)
    assert "**recommended: speculative.**" in text
    assert "## Overall" in text and "## Class `tools`" in text
    overall = text.split("## Overall")[1].split("## Class")[0]
    rows = [line.split("|")[1].strip() for line in overall.splitlines() if line.startswith("| ")]
    assert rows == ["arm", "---", "baseline", "quantized", "speculative", "both"]
    assert "- quantized, tools: tool-call validity 0.8" in text
    assert "(`toolCallValidity`)" in text
    assert "**recommended: speculative.** speculative is recommended because the rule" in text


def test_report_command_writes_the_table_and_the_plot(
    verdict: ExperimentVerdict, tmp_path: Path
) -> None:
    path = tmp_path / "verdict.json"
    path.write_text(verdict_json(verdict))
    args = ["experiment", "report", "--verdict", str(path), "--out", str(tmp_path / "out")]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    text = (tmp_path / "out/report.md").read_text()
    assert text == markdown(verdict)
    assert "Throughput at SLO (every arm's): not recorded" in text
    assert "It names no currency" in text
    assert Image.open(tmp_path / "out/report.png").size[0] > 500
    # the basis simulate writes beside the verdict is read, and --currency overrides its own
    stands_on = basis(load_experiment(SPECMODEL, SCENARIO))
    (tmp_path / BASIS).write_text(basis_json(stands_on))
    result = CliRunner().invoke(main, [*args, "--currency", "EUR"])
    assert result.exit_code == 0, result.output
    text = (tmp_path / "out/report.md").read_text()
    assert text == markdown(verdict, stands_on.model_copy(update={"currency": "EUR"}))
    assert "computed by the simulated fleet's model" in text and "4 EUR per GPU hour" in text


def test_report_command_names_the_file_and_field_of_bad_input(
    verdict: ExperimentVerdict, tmp_path: Path
) -> None:
    data = json.loads(verdict_json(verdict))
    data["overall"][1]["costPerAcceptedAnswer"] = "cheap"
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    result = CliRunner().invoke(
        main, ["experiment", "report", "--verdict", str(path), "--out", str(tmp_path)]
    )
    assert result.exit_code == 2
    assert str(path) in result.output and "overall.1.costPerAcceptedAnswer" in result.output
    path.write_text("{not json")
    result = CliRunner().invoke(
        main, ["experiment", "report", "--verdict", str(path), "--out", str(tmp_path)]
    )
    assert result.exit_code == 2 and str(path) in result.output


def test_report_command_reads_a_saved_specexperiment_and_says_when_it_has_no_verdict(
    verdict: ExperimentVerdict, tmp_path: Path
) -> None:
    saved = {
        "apiVersion": "specfleet.dev/v1alpha1",
        "kind": "SpecExperiment",
        "metadata": {"name": "x", "namespace": "ns"},
        "spec": {"specModelRef": {"name": "m"}, "gpuHourPrice": 4.0},
        "status": {"phase": "Running", "verdict": json.loads(verdict_json(verdict))},
    }
    path = tmp_path / "x.yaml"
    path.write_text(yaml.safe_dump(saved))
    out = tmp_path / "out"
    args = ["experiment", "report", "--verdict", str(path), "--out", str(out)]
    result = CliRunner().invoke(main, [*args, "--specmodel", str(SPECMODEL)])
    assert result.exit_code == 0, result.output
    text = (out / "report.md").read_text()
    # no capacity phase: every arm's throughput is its own at concurrency one on the sample
    assert "Throughput at SLO (every arm's): measured on the sample at concurrency one" in text
    assert "Price: 4 per GPU hour (SpecExperiment x, spec.gpuHourPrice)" in text
    assert "SLOs: code p95 TPOT <= 15 ms" in text
    saved["status"]["capacity"] = {
        "startedAt": "2026-01-01T00:00:00Z",
        "arms": [
            {"name": "speculative", "throughputAtSlo": 3.5, "concurrency": 16},
            {"name": "both", "failed": "OOMKilled"},
        ],
    }
    path.write_text(yaml.safe_dump(saved))
    result = CliRunner().invoke(main, [*args, "--currency", "USD"])
    assert result.exit_code == 0, result.output
    text = (out / "report.md").read_text()
    assert "speculative: load test (at concurrency 16)" in text
    assert "both: concurrency one (its load test failed: OOMKilled)" in text
    assert "4 USD per GPU hour" in text and "SLOs: not known here" in text
    del saved["status"]["verdict"]
    path.write_text(yaml.safe_dump(saved))
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2
    assert "status.verdict: none yet (phase Running)" in result.output
    result = CliRunner().invoke(main, ["experiment", "report", "--out", str(out)])
    assert result.exit_code == 2 and "NAME or --verdict" in result.output


def test_simulate_command_refuses_a_scenario_without_arms_and_a_spec_without_speculation(
    tmp_path: Path,
) -> None:
    scenario = yaml.safe_load(SCENARIO.read_text())
    scenario["arms"]["quantized"]["tpot_factor"] = 0
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(scenario))
    args = ["experiment", "simulate", "--specmodel", str(SPECMODEL), "--out", str(tmp_path)]
    result = CliRunner().invoke(main, [*args, "--scenario", str(path)])
    assert result.exit_code == 2
    assert str(path) in result.output and "arms.quantized.tpot_factor" in result.output
    document = yaml.safe_load(SPECMODEL.read_text())
    del document["spec"]["speculative"]
    plain = tmp_path / "plain.yaml"
    plain.write_text(yaml.safe_dump(document))
    result = CliRunner().invoke(
        main,
        [
            "experiment",
            "simulate",
            "--specmodel",
            str(plain),
            "--scenario",
            str(SCENARIO),
            "--out",
            str(tmp_path),
        ],
    )
    assert result.exit_code == 2 and "spec.speculative" in result.output


def prequantized(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    """The example on a pre-quantized FP8 checkpoint: its arms without quantization need an
    unquantized source."""
    document = yaml.safe_load(SPECMODEL.read_text())
    document["spec"]["model"]["source"] = "RedHatAI/Meta-Llama-3.1-8B-Instruct-FP8"
    del document["spec"]["quantization"]["online"]
    path = tmp_path / "prequantized.yaml"
    path.write_text(yaml.safe_dump(document))
    return path, document


def test_simulate_refuses_the_arms_the_operator_refuses_with_its_messages(tmp_path: Path) -> None:
    path, document = prequantized(tmp_path)
    with pytest.raises(InvalidArms) as live:
        render_arms(parse_specmodel(document), parse_specexperiment(experiment_doc()))
    with pytest.raises(InputError) as simulated:
        load_experiment(path, SCENARIO)
    assert simulated.value.problems == [str(e) for e in live.value.errors]
    assert {e.path for e in live.value.errors} == {"spec.unquantizedSource"}


def test_simulate_serves_the_unquantized_source_where_the_operator_would(tmp_path: Path) -> None:
    path, document = prequantized(tmp_path)
    args = ["experiment", "simulate", "--specmodel", str(path), "--scenario", str(SCENARIO)]
    refused = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "refused")])
    assert refused.exit_code == 2 and "spec.unquantizedSource: arm baseline" in refused.output
    source = "meta-llama/Llama-3.1-8B-Instruct"
    experiment = load_experiment(path, SCENARIO, unquantized_source=source)
    baseline = experiment.worlds[ArmName.BASELINE].changes[0].specmodel
    both = experiment.worlds[ArmName.BOTH].changes[0].specmodel
    assert (baseline.spec.model.source, both.spec.model.source) == (
        source,
        document["spec"]["model"]["source"],
    )
    ran = CliRunner().invoke(
        main, [*args, "--unquantized-source", source, "--out", str(tmp_path / "ran")]
    )
    assert ran.exit_code == 0, ran.output
