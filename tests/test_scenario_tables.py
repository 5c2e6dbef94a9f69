"""examples/scenarios/README.md's generated tables match the committed replay outputs."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent


def tables() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "scenario_tables", ROOT / "hack/scenario_tables.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_tables_are_generated_from_the_committed_outputs() -> None:
    """Fails when an output or the README changed without `hack/scenario_tables.py`."""
    module = tables()
    text = module.README.read_text()
    assert text == module.rewrite(text), "stale: run .venv/bin/python hack/scenario_tables.py"


def test_every_example_with_outputs_has_a_row() -> None:
    module = tables()
    block = module.results()
    for name in module.scenarios():
        summary = json.loads((module.SCENARIOS / name / "summary.json").read_text())
        ratio = summary["goodput"]["ratios"]["guardedVsOracle"]
        assert f"| {name} |" in block and f"| {ratio:.3f} |" in block
    assert set(module.scenarios()) >= {"canary-rollouts", "acceptance-collapse"}


def test_a_hand_edited_number_is_put_back() -> None:
    module = tables()
    text = module.README.read_text()
    number = re.search(r"\| (0\.\d{3}) \|", text)
    assert number is not None
    drifted = text.replace(number.group(0), "| 0.123 |", 1)
    assert drifted != text and module.rewrite(drifted) == text


def test_the_readmes_replay_pictures_are_the_examples_timelines() -> None:
    """docs/replay-*.png are copied from the example outputs by --write-examples."""
    bench = importlib.util.spec_from_file_location("goodput", ROOT / "bench/simulate_goodput.py")
    assert bench and bench.loader
    module = importlib.util.module_from_spec(bench)
    bench.loader.exec_module(module)
    for name, picture in module.DOCS_PICTURES.items():
        timeline = ROOT / "examples/scenarios" / name / "timeline.png"
        assert (ROOT / picture).read_bytes() == timeline.read_bytes(), picture
        assert picture in (ROOT / "README.md").read_text()


def test_the_main_readme_quotes_the_sets_goodput_as_the_outputs_give_it() -> None:
    """README.md's Benchmarks row and its reading quote the set's mean and worst by hand (a
    table row cannot hold marker comments): they must be the outputs' numbers."""
    line = tables().results().splitlines()[-1]
    means = re.findall(r"guarded / oracle mean (\d\.\d{3}), worst (\d\.\d{3})", line)
    [(mean, worst), (rest_mean, rest_worst)] = means
    readme = (ROOT / "README.md").read_text()
    assert f"mean {mean}, worst {worst}" in readme
    assert f"the other eleven mean {rest_mean}, worst {rest_worst}" in readme
    assert f"(mean {rest_mean})" in readme and f"set of twelve ({mean})" in readme
