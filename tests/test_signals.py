"""The per-class signals are data (`specfleet.signals`): every row names what exists, and no
other module writes a signal's name."""

from __future__ import annotations

import ast
import json

import pytest

from conftest import ROOT
from specfleet import signals
from specfleet.api.spec import ClassSlo
from specfleet.api.status import QualityBaseline
from specfleet.api.verdict import ArmRow
from specfleet.signals import QUALITY, Signal
from specfleet.telemetry.model import ClassWindow

NAMES = {
    *(s.name for s in QUALITY),
    signals.ACCEPTANCE_RATE,
    signals.SPEEDUP,
    signals.P95_TTFT,
    signals.P95_TPOT,
    signals.GREEDY_AGREEMENT,
}
DASHBOARD = ROOT / "charts/specfleet/files/grafana-dashboard.json"


def test_no_module_but_the_table_writes_a_signals_name() -> None:
    """A name written twice is a name that can be misspelt once: the judges, reports and
    pictures take each from `specfleet.signals`."""
    found = []
    for path in sorted((ROOT / "operator/specfleet").rglob("*.py")):
        if path == ROOT / "operator/specfleet/signals.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in NAMES:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.value}")
    assert found == []


@pytest.mark.parametrize("signal", QUALITY, ids=lambda s: s.name)
def test_each_row_names_fields_that_exist(signal: Signal) -> None:
    assert signal.slo_field is None or signal.slo_field in ClassSlo.model_fields
    assert signal.arm_field in ArmRow.model_fields
    assert signal.baseline_field in QualityBaseline.model_fields
    assert (signal.unjudged is None) == (not signal.unjudged_key)


def test_the_last_good_value_is_the_fleets_or_the_class_own() -> None:
    baseline = QualityBaseline(error_rate=0.01, truncation_rate={"chat": 0.2})
    assert signals.ERROR_RATE.last_good(baseline, "chat") == 0.01
    assert signals.TRUNCATION_RATE.last_good(baseline, "chat") == 0.2
    assert signals.TRUNCATION_RATE.last_good(baseline, "code") is None
    assert signals.TOOL_CALL_VALIDITY.last_good(baseline, "chat") is None


def test_each_signal_has_its_panel_on_the_dashboard() -> None:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    titles = {p.get("title") for p in panels} | {
        inner.get("title") for p in panels for inner in p.get("panels", [])
    }
    assert {s.dashboard for s in QUALITY} <= titles


def test_a_value_is_its_count_over_its_samples_and_none_without_data() -> None:
    window = ClassWindow(requests=200.0, errors=10.0, choices=190.0, truncated=19.0)
    assert signals.ERROR_RATE.value(window) == 0.05
    assert signals.TRUNCATION_RATE.value(window) == 0.1
    assert signals.TOOL_CALL_VALIDITY.value(window) is None  # no tool call judged
    assert signals.ERROR_RATE.value(ClassWindow(requests=200.0)) is None  # no error series
    # a bad answer is a bad answer whichever way the signal reads
    tools = ClassWindow(tool_calls_valid=90.0, tool_calls_invalid=10.0)
    assert signals.TOOL_CALL_VALIDITY.bad(tools) == 10.0
    assert signals.TRUNCATION_RATE.bad(window) == 19.0
