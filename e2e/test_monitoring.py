"""The chart's monitoring assets against the real Prometheus: the Grafana dashboard's PromQL
parses and evaluates, and the PrometheusRule's rules pass promtool and load."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import httpx
import pytest
import yaml

from e2e.cluster.harness import LocalCluster, eventually

FILES = Path(__file__).resolve().parent.parent / "charts/specfleet/files"
DASHBOARD = json.loads((FILES / "grafana-dashboard.json").read_text())
VARIABLES = {"$namespace": "ns", "$specmodel": "m", "$__rate_interval": "1m", "${datasource}": ""}


def dashboard_queries() -> list[str]:
    exprs = [t["expr"] for panel in DASHBOARD["panels"] for t in panel["targets"]]
    exprs += [a["expr"] for a in DASHBOARD["annotations"]["list"]]
    out = []
    for expr in exprs:
        for name, value in VARIABLES.items():
            expr = expr.replace(name, value)
        out.append(expr)
    return out


@pytest.mark.parametrize("query", dashboard_queries())
def test_dashboard_promql_evaluates(local_cluster: LocalCluster, query: str) -> None:
    response = httpx.get(
        f"{local_cluster.prometheus_url}/api/v1/query", params={"query": query}, timeout=10
    )
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "success"


def test_dashboard_covers_what_the_issue_asks() -> None:
    titles = " ".join(p["title"].lower() for p in DASHBOARD["panels"])
    for needed in (
        "acceptance rate",
        "acceptance length",
        "time to first token",
        "time per output token",
        "tool-call validity",
        "truncation",
        "canary rollout",
        "kill switch",
        "class state",
    ):
        assert needed in titles
    assert {a["name"] for a in DASHBOARD["annotations"]["list"]} == {"Kill switch", "Revision"}


def test_prometheus_rules_pass_promtool_and_load(local_cluster: LocalCluster) -> None:
    rules = FILES / "prometheus-rules.yaml"
    promtool = local_cluster.layout.bin_dir / "promtool"
    check = subprocess.run(
        [str(promtool), "check", "rules", str(rules)], capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout + check.stderr
    target = local_cluster.rules_dir / "specfleet.yaml"
    target.write_text(rules.read_text())
    try:
        local_cluster.reload_prometheus()
        expected = {r["alert"] for r in yaml.safe_load(rules.read_text())["groups"][0]["rules"]}

        def loaded() -> bool:
            data = httpx.get(f"{local_cluster.prometheus_url}/api/v1/rules", timeout=10).json()[
                "data"
            ]
            names = {
                r["name"] for g in data["groups"] for r in g["rules"] if r.get("health") == "ok"
            }
            return expected <= names

        eventually(loaded, "specfleet rules loaded and healthy")
    finally:
        target.unlink()
        local_cluster.reload_prometheus()
