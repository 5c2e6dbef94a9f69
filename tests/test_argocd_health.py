"""The Argo CD health check, executed as Lua 5.1 (Argo CD runs gopher-lua, a Lua 5.1), over the
status fixtures listed in health_test.yaml, the way Argo CD tests its own checks."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from argocd_lua import SCRIPT, health
from conftest import ROOT, specmodel_doc
from specfleet.api import SpecModelStatus, parse_specmodel
from specfleet.api.status import KillSwitchStatus
from specfleet.tick.observed import Observed
from specfleet.tick.plan import plan
from specfleet.tick.status import next_status

FILES = ROOT / "charts/specfleet/files"
CASES = yaml.safe_load((FILES / "argocd-health/health_test.yaml").read_text())["tests"]


@pytest.mark.parametrize("case", CASES, ids=lambda c: Path(c["inputPath"]).stem)
def test_health(case: dict[str, Any]) -> None:
    obj = yaml.safe_load((FILES / "argocd-health" / case["inputPath"]).read_text())
    expected = case["healthStatus"]
    actual = health(obj)
    assert actual["status"] == expected["status"]
    assert actual["message"].startswith(expected["message"])


def test_kill_switch_can_be_reported_healthy() -> None:
    obj = yaml.safe_load((FILES / "argocd-health/testdata/kill_switch_engaged.yaml").read_text())
    relaxed = SCRIPT.replace(
        "local killSwitchIsDegraded = true", "local killSwitchIsDegraded = false"
    )
    assert health(obj, relaxed)["status"] == "Healthy"


def test_every_fixture_is_listed() -> None:
    listed = {Path(c["inputPath"]).name for c in CASES}
    assert listed == {p.name for p in (FILES / "argocd-health/testdata").glob("*.yaml")}


def test_statuses_the_controller_writes_map_as_documented() -> None:
    now = datetime(2026, 11, 21, tzinfo=UTC)
    doc = specmodel_doc(speculative={"method": "ngram"})
    sm = parse_specmodel(doc)
    engaged = SpecModelStatus(kill_switch=KillSwitchStatus(state="engaged", source="guard"))
    status = next_status(sm, plan(sm, engaged, now), Observed(), engaged, now)
    doc["status"] = status.to_wire()
    assert health(doc)["status"] == "Degraded"
    assert "KillSwitchEngaged" in health(doc)["message"]
