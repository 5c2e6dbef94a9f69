"""`specfleet simulate` on the command line: the files it writes and how it refuses bad input."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner, Result
from PIL import Image

from specfleet.cli import main

ROOT = Path(__file__).resolve().parent.parent
LLAMA = ROOT / "examples/llama-3.1-8b-eagle3-fp8.yaml"
ACTIONS = {
    "kill_switch_engaged",
    "kill_switch_released",
    "trial_started",
    "trial_failed",
    "rolled_back",
    "revision_promoted",
    "quality_breach",
    "metrics_blind",
    "metrics_restored",
    "alert",
    "flapping",
    "class_breach",
    "class_recovered",
}
SHORT_COLLAPSE = {
    "duration_s": 900,
    "seed": 3,
    "traffic_rps": 8,
    "classes": {
        "code": {"share": 0.5, "acceptance": [[0, 0.8], [300, 0.2]], "output_tokens": 256},
        "chat": {"share": 0.5, "acceptance": 0.6, "output_tokens": 400, "tool_call_rate": 0.3},
    },
}


def simulate(tmp_path: Path, scenario: object, specmodel: Path = LLAMA, *extra: str) -> Result:
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(scenario))
    args = ["simulate", "--specmodel", str(specmodel), "--scenario", str(path)]
    return CliRunner().invoke(main, [*args, "--out", str(tmp_path / "out"), *extra])


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Result]:
    tmp = tmp_path_factory.mktemp("simulate")
    result = simulate(tmp, SHORT_COLLAPSE)
    assert result.exit_code == 0, result.output
    return tmp / "out", result


def test_decisions_json_schema(written: tuple[Path, Result]) -> None:
    out, _ = written
    decisions = json.loads((out / "decisions.json").read_text())
    assert isinstance(decisions, list) and decisions
    for decision in decisions:
        assert isinstance(decision["t"], int | float) and decision["t"] >= 0
        assert decision["action"] in ACTIONS
        assert decision["reason"] and decision["reason"][0].isupper()
        assert isinstance(decision["message"], str) and decision["message"]
        assert isinstance(decision["evidence"], dict)
        assert decision["evidence"]["windowSeconds"] == 60
        assert isinstance(decision["revision"], int)
        assert "lastGood" not in decision  # renamed: it always meant the rollback target
        assert decision["rollbackTarget"] is None or isinstance(decision["rollbackTarget"], int)
    assert [d["t"] for d in decisions] == sorted(d["t"] for d in decisions)
    engaged = next(d for d in decisions if d["action"] == "kill_switch_engaged")
    assert engaged["evidence"]["classes"]["code"]["acceptanceRate"] < 0.5


def test_summary_json_and_printed_summary(written: tuple[Path, Result]) -> None:
    out, result = written
    summary = json.loads((out / "summary.json").read_text())
    assert summary["seed"] == 3 and summary["tickSeconds"] == 15
    assert summary["detectionLatencySeconds"] and summary["maxDetectionLatencySeconds"] <= 90
    goodput = summary["goodput"]
    assert set(goodput) >= {"definition", "guarded", "always_on", "always_off", "oracle", "ratios"}
    assert goodput["ratios"]["guardedVsAlwaysOn"] > 1
    assert "kill_switch_engaged" in result.output and "latency" in result.output
    assert "guarded / oracle" in result.output


def test_timeline_is_a_non_trivial_png(written: tuple[Path, Result]) -> None:
    path = written[0] / "timeline.png"
    png = path.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", png[16:24])
    assert width >= 600 and height >= 400
    assert 10_000 < len(png) < 200_000
    image = Image.open(path).convert("RGB")
    colours = image.getcolors(maxcolors=1 << 16) or []
    assert len(colours) > 20  # lines, bands and markers, not a blank canvas
    band = image.getpixel((width // 2, height // 6))  # the kill switch's red band mid-run
    assert band[0] > band[1] and band[0] > band[2]


def test_tick_option_changes_the_evaluation_interval(tmp_path: Path) -> None:
    result = simulate(tmp_path, SHORT_COLLAPSE, LLAMA, "--tick", "30", "--no-plot")
    assert result.exit_code == 0, result.output
    decisions = json.loads((tmp_path / "out/decisions.json").read_text())
    assert all(d["t"] % 30 == 0 for d in decisions)
    assert not (tmp_path / "out/timeline.png").exists()


def refused(result: Result, *fragments: str) -> None:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in result.output


def test_bad_scenario_exits_2_naming_the_field(tmp_path: Path) -> None:
    bad = {**SHORT_COLLAPSE, "classes": {"code": {"share": 1.0, "acceptance": [[0, 1.5]]}}}
    refused(simulate(tmp_path, bad), "classes.code.acceptance[0]")
    refused(simulate(tmp_path, {**SHORT_COLLAPSE, "duration_s": -1}), "duration_s")
    refused(simulate(tmp_path, "not a mapping"), "<root>")


def test_scenario_class_unknown_to_the_specmodel_exits_2(tmp_path: Path) -> None:
    bad = {**SHORT_COLLAPSE, "classes": {"poetry": {"share": 1.0, "acceptance": 0.5}}}
    refused(simulate(tmp_path, bad), "classes.poetry", "code, tools, json, chat")


def test_rollout_that_breaks_the_specmodel_exits_2(tmp_path: Path) -> None:
    bad = {**SHORT_COLLAPSE, "rollouts": [{"t": 100, "spec": {"quantization": {"method": "awq"}}}]}
    refused(simulate(tmp_path, bad), "rollouts[0].spec", "spec.quantization.method")


def test_bad_specmodel_exits_2_naming_the_field(tmp_path: Path) -> None:
    document = yaml.safe_load(LLAMA.read_text())
    document["spec"]["guard"]["intervalSecs"] = 10
    specmodel = tmp_path / "sm.yaml"
    specmodel.write_text(yaml.safe_dump(document))
    refused(simulate(tmp_path, SHORT_COLLAPSE, specmodel), "spec.guard.intervalSecs")
    refused(simulate(tmp_path, SHORT_COLLAPSE, tmp_path / "missing.yaml"), "missing.yaml")


def test_a_yaml_bomb_for_a_specmodel_exits_2(tmp_path: Path) -> None:
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{n}: &a{n} [{', '.join([f'*a{n - 1}'] * 9)}]" for n in range(1, 10)]
    specmodel = tmp_path / "bomb.yaml"
    specmodel.write_text("\n".join(lines) + "\n")
    refused(simulate(tmp_path, SHORT_COLLAPSE, specmodel), "aliases")


def test_the_cli_imports_without_matplotlib() -> None:
    code = "import sys, specfleet.cli; sys.exit('matplotlib' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
