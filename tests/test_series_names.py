"""Every series the chart's Grafana dashboard and Prometheus alert rules select is one that
`specfleet.series` names, read through a PromQL parser (promql-parser). Prometheus answers a query
for an unknown series with an empty success, so a misspelt name passes
e2e/test_monitoring.py and draws an empty panel or an alert that never fires.

What each name exports (`_total` for a counter, `_bucket`/`_sum`/`_count` for a histogram) is the
kind its exporter gives it: the gateway's and the operator's own registries, and the real vLLM's
recorded families (tests/data/real-vllm/metrics.json) for the engine's gauge.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterable, Iterator
from typing import Any

import promql_parser
import pytest
import yaml

from conftest import ROOT
from specfleet import series
from specfleet.controller.metrics import REGISTRY as OPERATOR_REGISTRY
from specfleet.gateway.metrics import GatewayMetrics

CHART = ROOT / "charts/specfleet"
DASHBOARD = CHART / "files/grafana-dashboard.json"
RULES = CHART / "files/prometheus-rules.yaml"
ENGINE_FAMILIES = ROOT / "tests/data/real-vllm/metrics.json"

OTHER_EXPORTERS = {
    # Prometheus writes it for each scrape target: the dashboard counts the gateway pods scraped.
    "up",
}
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
# Grafana's range variables, which only stand in a range or subquery's brackets.
GRAFANA_RANGE = re.compile(r"\$\{?(?:__rate_interval|__interval|__range)\}?")
GRAFANA_QUERY = re.compile(r"\s*(label_values|query_result)\((.*)\)\s*", re.DOTALL)

SERIES_NAMES = {v for k, v in vars(series).items() if k.isupper() and isinstance(v, str)}
OWN_FAMILIES = {
    family.name: family.type
    for registry in (GatewayMetrics().registry, OPERATOR_REGISTRY)
    for family in registry.collect()
}
ENGINE_KINDS = {name: f["type"] for name, f in json.loads(ENGINE_FAMILIES.read_text()).items()}


def exported(families: dict[str, str]) -> set[str]:
    """The series names Prometheus stores for the families `series` names, by their kind."""
    return {
        name + suffix
        for name, kind in families.items()
        if name in SERIES_NAMES
        for suffix in SUFFIXES[kind]
    }


RULE_DOCUMENT = yaml.safe_load(RULES.read_text())
RECORDED = {r["record"] for g in RULE_DOCUMENT["groups"] for r in g["rules"] if "record" in r}
"""The rules' own recording rules' names: selectable by the rules and the dashboard too."""
KNOWN = exported(OWN_FAMILIES | ENGINE_KINDS) | OTHER_EXPORTERS | RECORDED


def selected_names(expr: str) -> list[str | None]:
    """The metric name each selector of `expr` names (None: it names none to the letter)."""
    found: list[str | None] = []

    def visit(node: promql_parser.Expr) -> None:
        if not isinstance(node, promql_parser.VectorSelector):
            return
        if node.name:
            found.append(node.name)
            return
        # `{a="b" or c="d"}` holds its alternatives in or_matchers, each a selector of its own.
        for matchers in node.matchers.or_matchers or [node.matchers.matchers]:
            named = [
                m.value
                for m in matchers
                if m.name == "__name__" and m.op == promql_parser.MatchOp.Equal
            ]
            found.append(named[0] if named else None)

    promql_parser.walk(promql_parser.parse(expr), visit)
    return found


def refusals(expr: str) -> list[str]:
    """What in `expr` is not a series `specfleet.series` names (or an allowed exporter's)."""
    try:
        names = selected_names(expr)
    except ValueError as e:
        return [f"{expr!r} does not parse: {e}"]
    out = []
    for name in names:
        if name is None:
            out.append(f"{expr!r} selects series without one literal name: no test can check it")
        elif name not in KNOWN:
            [nearest] = difflib.get_close_matches(name, KNOWN, n=1, cutoff=0)
            out.append(
                f"{expr!r} selects {name!r}, which specfleet.series does not name; "
                f"nearest: {nearest!r}"
            )
    return out


def grafana_promql(text: str) -> str:
    return GRAFANA_RANGE.sub("5m", text)


def variable_promql(query: str) -> str | None:
    """The PromQL a Grafana query variable runs (None: it selects no series)."""
    match = GRAFANA_QUERY.fullmatch(query)
    assert match, f"a Grafana variable query this test cannot read: {query!r}"
    function, args = match.groups()
    if function == "query_result":
        return grafana_promql(args)
    selector, comma, _label = args.rpartition(",")
    return grafana_promql(selector) if comma else None


def dashboard_queries(node: Any, where: str = "") -> Iterator[tuple[str, str]]:
    """Each PromQL query in a Grafana dashboard (panels, annotations, query variables)."""
    if isinstance(node, list):
        for i, item in enumerate(node):
            yield from dashboard_queries(item, f"{where}[{i}]")
    elif isinstance(node, dict):
        if isinstance(node.get("expr"), str):
            yield f"{where}.expr", grafana_promql(node["expr"])
        if node.get("type") == "query" and "query" in node:
            query = node["query"]
            text = query["query"] if isinstance(query, dict) else query
            promql = variable_promql(text)
            if promql is not None:
                yield f"{where}.query", promql
        for key, value in node.items():
            yield from dashboard_queries(value, f"{where}.{key}")


def rule_queries(document: dict[str, Any]) -> Iterator[tuple[str, str]]:
    for group in document["groups"]:
        for rule in group["rules"]:
            yield f"{group['name']}/{rule.get('alert') or rule['record']}", str(rule["expr"])


def chart_queries() -> Iterable[tuple[str, str]]:
    yield from (
        (f"{DASHBOARD.name} {w}", q)
        for w, q in dashboard_queries(json.loads(DASHBOARD.read_text()))
    )
    yield from ((f"{RULES.name} {w}", q) for w, q in rule_queries(RULE_DOCUMENT))


QUERIES = list(chart_queries())


@pytest.mark.parametrize(("where", "expr"), QUERIES, ids=[w for w, _ in QUERIES])
def test_the_chart_selects_only_series_specfleet_names(where: str, expr: str) -> None:
    problems = refusals(expr)
    assert not problems, f"{where}: " + "; ".join(problems)


def test_the_dashboard_and_the_rules_are_the_charts_promql() -> None:
    """Both hold queries, and no other file in the chart has an `expr` to read."""
    assert {where.split(" ")[0] for where, _ in QUERIES} == {DASHBOARD.name, RULES.name}
    holding = {p for p in CHART.rglob("*") if p.is_file() and re.search(r"\bexpr\b", p.read_text())}
    assert holding == {DASHBOARD, RULES}


def test_every_series_specfleet_exports_is_named_in_series() -> None:
    """series.py is the one source of the names: the gateway and the operator export no other."""
    assert set(OWN_FAMILIES) <= SERIES_NAMES, set(OWN_FAMILIES) - SERIES_NAMES


MISSPELT = [
    # (query, the name refused, the nearest known name)
    ("rate(specfleet_request_total[5m])", "specfleet_request_total", "specfleet_requests_total"),
    (
        "histogram_quantile(0.95, sum by (le) (rate(specfleet_ttft_seconds[5m])))",
        "specfleet_ttft_seconds",
        "specfleet_ttft_seconds_sum",
    ),
    (
        "max by (namespace) (specfleet_kill_switch_engaged_total) == 1",
        "specfleet_kill_switch_engaged_total",
        "specfleet_kill_switch_engaged",
    ),
    (
        'increase({__name__="specfleet_rollbacks"}[15m]) > 0',
        "specfleet_rollbacks",
        "specfleet_rollbacks_total",
    ),
    ("max(vllm:kv_cache_usage_percent)", "vllm:kv_cache_usage_percent", "vllm:kv_cache_usage_perc"),
    # Another exporter's series, not on the allow-list.
    (
        "sum(rate(specfleet_reconcile_total[5m])) * on () group_left kube_pod_info",
        "kube_pod_info",
        None,
    ),
]


@pytest.mark.parametrize(("expr", "name", "nearest"), MISSPELT, ids=[e for e, _, _ in MISSPELT])
def test_a_misspelt_series_is_refused(expr: str, name: str, nearest: str | None) -> None:
    [refusal] = refusals(expr)
    assert f"selects {name!r}, which specfleet.series does not name" in refusal
    assert nearest is None or refusal.endswith(f"nearest: {nearest!r}")


@pytest.mark.parametrize("expr", ['count({__name__=~"specfleet_.*"})', '{job="gateway"}'])
def test_a_selector_without_a_literal_name_is_refused(expr: str) -> None:
    assert refusals(expr) == [
        f"{expr!r} selects series without one literal name: no test can check it"
    ]


def test_a_misspelt_series_in_a_dashboard_variable_is_refused() -> None:
    dashboard = {
        "templating": {
            "list": [{"type": "query", "query": "label_values(specfleet_reqests_total, namespace)"}]
        },
        "panels": [{"targets": [{"expr": "rate(specfleet_ttft_seconds_count[$__rate_interval])"}]}],
    }
    queries = dict(dashboard_queries(dashboard))
    assert queries[".panels[0].targets[0].expr"] == "rate(specfleet_ttft_seconds_count[5m])"
    assert refusals(queries[".panels[0].targets[0].expr"]) == []
    [refusal] = refusals(queries[".templating.list[0].query"])
    assert "nearest: 'specfleet_requests_total'" in refusal
