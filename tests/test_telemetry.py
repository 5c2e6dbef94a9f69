"""The telemetry reader's contract that needs no Prometheus: no data is blind, never zero."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from specfleet.telemetry.model import ClassWindow
from specfleet.telemetry.reader import QUERIES, QUERIES_PER_TICK, Target, TelemetryReader


def test_unreachable_prometheus_is_blind_not_zero() -> None:
    reader = TelemetryReader("http://127.0.0.1:9")
    observation = reader.read([Target("ns", "m", 60, 1, True)], datetime.now(UTC))[("ns", "m")]
    assert observation.blind is not None and "Prometheus" in observation.blind
    assert observation.classes == {}


def test_one_query_set_per_window_length() -> None:
    templates = {template.format(w="60s") for template, _, _ in QUERIES.values()}
    assert len(templates) == 19
    group = "sum by (namespace, specmodel, revision, speculation, pool, class"
    assert all(group in t for t in templates)


def test_ratios_come_from_counter_increases() -> None:
    window = ClassWindow(
        requests=100,
        errors=2,
        draft_tokens=400,
        accepted_tokens=300,
        steps=100,
        tool_calls_valid=9,
        tool_calls_invalid=1,
        choices=120,
        truncated=6,
    )
    assert window.acceptance_rate == 0.75
    assert window.mean_acceptance_length == 4.0
    assert window.tool_call_validity == 0.9
    assert window.error_rate == 0.02
    assert window.truncation_rate == 0.05
    assert ClassWindow(requests=0).error_rate is None
    assert ClassWindow(choices=0, truncated=0).truncation_rate is None
    assert ClassWindow().acceptance_rate is None


def test_a_trial_canary_is_read_beside_the_fleet_with_the_same_queries() -> None:
    def series(speculation: str, value: float) -> dict[str, Any]:
        labels = {"namespace": "ns", "specmodel": "m", "class": "code", "revision": "1"}
        return {"metric": {**labels, "speculation": speculation}, "value": [0, str(value)]}

    reader = TelemetryReader("http://127.0.0.1:9")
    answers = {"specfleet_requests_total": [series("off", 200.0), series("on", 100.0)]}

    def query(text: str, params: dict[str, str]) -> list[dict[str, Any]]:
        return next((rows for metric, rows in answers.items() if metric in text), [])

    reader._prometheus.custom_query = query
    target = Target("ns", "m", 60, 1, False)  # the fleet without speculation, as planned
    observation = reader.read([target], datetime.now(UTC))[("ns", "m")]
    assert observation.classes["code"].requests == 200.0 and not observation.speculation
    canary = observation.canary
    assert canary is not None and canary.speculation and canary.revision == 1
    assert canary.classes["code"].requests == 100.0
    # nothing extra asked: the query set and the unjudged checks' one
    assert reader.queries == QUERIES_PER_TICK == 20
    alone = reader.read([Target("ns", "other", 60, 1, False)], datetime.now(UTC))
    assert alone[("ns", "other")].canary is None


def test_a_rollout_canary_is_read_by_its_revision_beside_the_control() -> None:
    def series(revision: str, value: float) -> dict[str, Any]:
        labels = {"namespace": "ns", "specmodel": "m", "class": "code", "speculation": "on"}
        return {"metric": {**labels, "revision": revision}, "value": [0, str(value)]}

    reader = TelemetryReader("http://127.0.0.1:9")
    rows = [series("1", 300.0), series("2", 100.0), series("3", 7.0)]
    reader._prometheus.custom_query = lambda text, params: rows if "requests" in text else []
    target = Target("ns", "m", 60, 4, True, canary=(2, True))
    control = Target("ns", "m", 60, 1, True, canary=(2, True))
    assert reader.read([target], datetime.now(UTC))[("ns", "m")].classes == {}
    observation = reader.read([control], datetime.now(UTC))[("ns", "m")]
    assert observation.classes["code"].requests == 300.0
    assert observation.canary is not None and observation.canary.revision == 2
    assert observation.canary.classes["code"].requests == 100.0


def test_unjudged_quality_checks_are_read_by_kind_and_reason() -> None:
    labels = {"namespace": "ns", "specmodel": "m", "class": "code", "revision": "1"}

    def row(kind: str, reason: str, value: str) -> dict[str, Any]:
        metric = {**labels, "speculation": "on", "kind": kind, "reason": reason}
        return {"metric": metric, "value": [0, value]}

    rows = [
        row("tool_call", "remote_ref", "3"),
        row("tool_call", "unsatisfiable", "2"),
        row("tool_call", "budget", "0"),  # no increase: left out
        row("structured_output", "pattern", "NaN"),
        row("structured_output", "too_deep", "1"),
    ]
    reader = TelemetryReader("http://127.0.0.1:9")
    asked: list[str] = []

    def query(text: str, params: dict[str, str]) -> list[dict[str, Any]]:
        asked.append(text)
        return rows if "specfleet_quality_unjudged_total" in text else []

    reader._prometheus.custom_query = query
    observation = reader.read([Target("ns", "m", 60, 1, True)], datetime.now(UTC))[("ns", "m")]
    window = observation.classes["code"]
    assert window.tool_calls_unjudged == {"remote_ref": 3.0, "unsatisfiable": 2.0}
    assert window.structured_unjudged == {"too_deep": 1.0}
    assert window.tool_call_validity is None  # unjudged checks are no samples
    assert sum("specfleet_quality_unjudged_total" in q for q in asked) == 1


def test_truncation_is_read_from_the_finish_reasons_by_revision() -> None:
    def row(revision: str, reason: str, value: float) -> dict[str, Any]:
        labels = {"namespace": "ns", "specmodel": "m", "class": "chat", "speculation": "on"}
        metric = {**labels, "revision": revision, "reason": reason}
        return {"metric": metric, "value": [0, str(value)]}

    by_reason = [row("1", "length", 2.0), row("1", "stop", 98.0), row("2", "length", 30.0)]
    totals = [row("1", "", 100.0), row("2", "", 100.0)]

    def query(text: str, params: dict[str, str]) -> list[dict[str, Any]]:
        if "specfleet_finish_reasons_total" not in text:
            return []
        return by_reason if "reason)" in text else totals

    reader = TelemetryReader("http://127.0.0.1:9")
    reader._prometheus.custom_query = query
    control = Target("ns", "m", 60, 1, True, canary=(2, True))
    observation = reader.read([control], datetime.now(UTC))[("ns", "m")]
    assert observation.classes["chat"].truncation_rate == 0.02
    assert observation.canary is not None
    assert observation.canary.classes["chat"].truncation_rate == 0.3


def test_the_requests_sent_to_the_plain_pool_are_read_apart_from_the_fleets() -> None:
    """One answer carries both pools: the fleet's classes hold its own engines' requests only
    (routed ones would read as speculation that drafts nothing), `plain` the routed ones; a
    series without the pool label (an older gateway's) is the fleet's."""
    fleet = {"namespace": "ns", "specmodel": "m", "revision": "1", "speculation": "on"}

    def row(klass: str, value: float, pool: str | None) -> dict[str, Any]:
        metric = {**fleet, "class": klass, **({"pool": pool} if pool else {})}
        return {"metric": metric, "value": [0, str(value)]}

    answers = [row("code", 30, "fleet"), row("chat", 12, "plain"), row("tools", 5, None)]

    def query(text: str, params: dict[str, str]) -> list[dict[str, Any]]:
        return answers if "specfleet_requests_total" in text else []

    reader = TelemetryReader("http://127.0.0.1:9")
    reader._prometheus.custom_query = query
    [observation] = reader.read([Target("ns", "m", 60, 1, True)], datetime.now(UTC)).values()
    assert {k: w.requests for k, w in observation.classes.items()} == {"code": 30, "tools": 5}
    assert {k: w.requests for k, w in observation.plain.items()} == {"chat": 12}
    assert reader.queries == QUERIES_PER_TICK
