"""Alerts: which fire for a status, their wire format, and background delivery over real HTTP."""

from __future__ import annotations

import json
import logging
import operator
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import promql_parser
import pytest
import yaml

from conftest import ROOT, specmodel_doc
from specfleet import series
from specfleet.alerts.model import Alert, firing
from specfleet.alerts.receivers import Alertmanager, Webhook, redacted, slack_message
from specfleet.alerts.sender import AlertSender, transient
from specfleet.api import Condition, Decision, SpecModelStatus, parse_specmodel
from specfleet.api.status import DecisionReason, KillSwitchStatus
from specfleet.controller.metrics import KILL_SWITCH_SOURCES, REGISTRY, record_kill_switch
from specfleet.tick.status import Observed
from specfleet.tick.step import GuardTick, step

NOW = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)
ENGAGE = Decision(
    time=NOW.isoformat(),
    action="kill_switch_engaged",
    reason="SpeculationNotPaying",
    message="Speculation off: speedup 0.8",
    evidence={"speedup": 0.8, "classes": {"code": {"acceptanceRate": 0.2}}},
)


def engaged_status() -> SpecModelStatus:
    return SpecModelStatus(
        kill_switch=KillSwitchStatus(
            state="engaged", source="guard", reason="Speculation off: speedup 0.8"
        ),
        decisions=[ENGAGE],
    )


def test_engaged_kill_switch_fires_with_the_numbers() -> None:
    [alert] = firing("ns", "m", engaged_status(), NOW)
    assert alert.name == "SpecfleetKillSwitchEngaged"
    assert alert.labels() == {
        "alertname": "SpecfleetKillSwitchEngaged",
        "namespace": "ns",
        "specmodel": "m",
        "severity": "warning",
        "source": "specfleet",
    }
    assert json.loads(alert.annotations()["evidence"])["classes"]["code"]["acceptanceRate"] == 0.2
    assert alert.starts_at == NOW.isoformat()


def test_a_trial_keeps_the_kill_switch_alert_firing_until_release() -> None:
    trial = engaged_status().model_copy(
        update={"kill_switch": KillSwitchStatus(state="trial", source="guard")}
    )
    assert [a.name for a in firing("ns", "m", trial, NOW)] == ["SpecfleetKillSwitchEngaged"]
    released = trial.model_copy(
        update={"kill_switch": KillSwitchStatus(state="released", source="guard")}
    )
    assert firing("ns", "m", released, NOW) == []


def test_annotation_kill_switch_does_not_alert() -> None:
    status = SpecModelStatus(kill_switch=KillSwitchStatus(state="engaged", source="annotation"))
    assert firing("ns", "m", status, NOW) == []


def test_a_guard_switch_kept_while_the_spec_declares_no_speculation_does_not_alert() -> None:
    """The guard's switch is kept for when speculation is declared again, but holds nothing
    meanwhile; the guard (k = 0) never releases it, so an alert would fire for good."""
    kept = SpecModelStatus(kill_switch=KillSwitchStatus(state="engaged", source="guard"))
    specmodel = parse_specmodel(specmodel_doc(speculative=None))
    status = step(specmodel, kept, Observed(), GuardTick(None), {}, NOW).status
    assert status.kill_switch and status.kill_switch.engaged and status.speculation == "none"
    assert firing("ns", "m", status, NOW) == []


RULES = yaml.safe_load((ROOT / "charts/specfleet/files/prometheus-rules.yaml").read_text())
Series = list[tuple[dict[str, str], float]]
COMPARISONS: dict[str, Callable[[float, float], bool]] = {
    "==": operator.eq,
    "!=": operator.ne,
    ">": operator.gt,
    "<": operator.lt,
    ">=": operator.ge,
    "<=": operator.le,
}


def instant(expr: promql_parser.Expr, samples: Series) -> Series:
    """What `expr` gives over `samples` (name included in the labels): the PromQL the rule
    is written in (a selector, `max by`, a comparison with a number). Anything else fails the
    test rather than be read wrong."""
    if isinstance(expr, promql_parser.ParenExpr):
        return instant(expr.expr, samples)
    if isinstance(expr, promql_parser.VectorSelector):
        matchers = [(m.name, m.op, m.value) for m in expr.matchers.matchers]
        assert not expr.matchers.or_matchers and all(
            op in (promql_parser.MatchOp.Equal, promql_parser.MatchOp.NotEqual)
            for _, op, _ in matchers
        ), expr
        return [
            (labels, value)
            for labels, value in samples
            if labels["__name__"] == expr.name
            and all(
                (labels.get(name, "") == want) == (op == promql_parser.MatchOp.Equal)
                for name, op, want in matchers
            )
        ]
    if isinstance(expr, promql_parser.AggregateExpr):
        assert str(expr.op) == "max" and expr.modifier, expr
        assert expr.modifier.type == promql_parser.AggModifierType.By, expr
        groups: dict[tuple[str, ...], float] = {}
        for labels, value in instant(expr.expr, samples):
            key = tuple(labels.get(name, "") for name in expr.modifier.labels)
            groups[key] = max(groups.get(key, value), value)
        return [(dict(zip(expr.modifier.labels, k, strict=True)), v) for k, v in groups.items()]
    if isinstance(expr, promql_parser.BinaryExpr):
        assert isinstance(expr.rhs, promql_parser.NumberLiteral) and not expr.modifier, expr
        compare = COMPARISONS[str(expr.op)]
        return [(labels, v) for labels, v in instant(expr.lhs, samples) if compare(v, expr.rhs.val)]
    raise AssertionError(f"PromQL this test does not evaluate: {expr.prettify()}")


def rule_fires(alertname: str, namespace: str, specmodel: str) -> bool:
    """Whether the chart's rule finds the SpecModel in the operator's series now (its `for:`
    aside: the test asks what it watches, not for how long)."""
    [rule] = [r for g in RULES["groups"] for r in g["rules"] if r.get("alert") == alertname]
    samples = [
        ({"__name__": s.name, **s.labels}, s.value)
        for family in REGISTRY.collect()
        for s in family.samples
    ]
    found = instant(promql_parser.parse(rule["expr"]), samples)
    return any(
        labels.get("namespace") == namespace and labels.get("specmodel") == specmodel
        for labels, _ in found
    )


HELD = [
    ("guard", "engaged", "eagle3/4", True),
    ("guard", "trial", "eagle3/4", True),  # speculation on a canary only: the fleet is without
    ("guard", "released", "eagle3/4", False),
    ("annotation", "engaged", "eagle3/4", False),  # a human's override: intended
    ("spec", "engaged", "eagle3/4", False),
    ("annotation", "released", "eagle3/4", False),
    ("guard", "engaged", "none", False),  # the spec declares none: nothing is switched off
    ("", "engaged", "eagle3/4", False),
]


@pytest.mark.parametrize(("source", "state", "speculation", "alerts"), HELD)
def test_the_charts_kill_switch_rule_and_the_operators_alert_agree(
    source: str, state: str, speculation: str, alerts: bool
) -> None:
    """SpecfleetKillSwitchEngagedLong (Prometheus, on the exported gauge) watches what
    SpecfleetKillSwitchEngaged (the operator's own) fires for: the guard's switch alone."""
    namespace = f"agree-{source or 'none'}-{state}-{speculation.replace('/', '-')}"
    status = SpecModelStatus(
        speculation=speculation,
        kill_switch=KillSwitchStatus(state=state, source=source),
        decisions=[ENGAGE],
    )
    record_kill_switch(namespace, "m", status)
    operator_alerts = "SpecfleetKillSwitchEngaged" in {
        a.name for a in firing(namespace, "m", status, NOW)
    }
    assert operator_alerts == alerts
    assert rule_fires("SpecfleetKillSwitchEngagedLong", namespace, "m") == alerts
    # The gauge still says who holds speculation off, a human too (the dashboard shows it).
    held = {
        s.labels["source"]: s.value
        for family in REGISTRY.collect()
        for s in family.samples
        if s.name == series.KILL_SWITCH_ENGAGED and s.labels["namespace"] == namespace
    }
    assert held == {k: float(k == status.speculation_held_off_by) for k in KILL_SWITCH_SOURCES}


def test_conditions_fire_and_one_shots_expire() -> None:
    status = SpecModelStatus(
        conditions=[
            Condition(
                type="RolledBack", status="True", reason="RolledBackToLastGood", message="rev 2 bad"
            ),
            Condition(type="MetricsBlind", status="False", reason="MetricsFlowing"),
        ],
        decisions=[
            Decision(
                time=NOW.isoformat(), action="alert", reason="SpeculationNotPaying", message="m"
            )
        ],
    )
    names = {a.name for a in firing("ns", "m", status, NOW)}
    assert names == {"SpecfleetRolledBack", "SpecfleetSpeculationNotPaying"}
    later = {a.name for a in firing("ns", "m", status, NOW + timedelta(hours=1))}
    assert later == {"SpecfleetRolledBack"}


def test_a_decision_reason_this_operator_lacks_still_reads() -> None:
    """Decision.reason is a string in the API: a status another version wrote still parses (a
    DecisionReason only where the operator writes one)."""
    wire = {"time": NOW.isoformat(), "action": "alert", "reason": "SomethingNewer", "message": "m"}
    status = SpecModelStatus.model_validate({"decisions": [wire]})
    [alert] = firing("ns", "m", status, NOW)
    assert alert.name == "SpecfleetSomethingNewer"
    assert "SomethingNewer" not in set(DecisionReason)


def class_breach(name: str, signal: str) -> Decision:
    return Decision(
        time=NOW.isoformat(),
        action="class_breach",
        reason="ClassBreach",
        message=f"Class {name} breaches {signal}",
        evidence={"class": name, "signal": signal, "value": 0.02, "limit": 0.3, "samples": 40},
    )


def test_a_class_breach_fires_once_per_class_with_its_class_and_signal() -> None:
    breaches = [class_breach("prose", "acceptanceRate"), class_breach("chat", "p95TpotSeconds")]
    status = SpecModelStatus(decisions=breaches)
    alerts = firing("ns", "m", status, NOW)
    assert [(a.labels()["class"], a.labels()["signal"]) for a in alerts] == [
        ("prose", "acceptanceRate"),
        ("chat", "p95TpotSeconds"),
    ]
    assert {a.name for a in alerts} == {"SpecfleetClassBreach"} and len(
        {a.key for a in alerts}
    ) == 2
    assert alerts[0].ends_at == (NOW + timedelta(seconds=900)).isoformat()
    assert json.loads(alerts[0].annotations()["evidence"])["samples"] == 40
    assert firing("ns", "m", status, NOW + timedelta(hours=1)) == []


def test_slack_message_is_text_first() -> None:
    alert = Alert(
        "SpecfleetRolledBack", "ns", "m", "warning", "rev 2 bad", {"toolCallValidity": 0.85}
    )
    message = slack_message(alert, resolved=False)
    assert message["text"].startswith("[FIRING] SpecfleetRolledBack ns/m: rev 2 bad")
    assert "0.85" in message["text"]
    assert slack_message(alert, resolved=True)["text"].startswith("[RESOLVED]")


class Recorder(BaseHTTPRequestHandler):
    received: list[tuple[str, Any]] = []
    failures_left = 0

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if Recorder.failures_left > 0:
            Recorder.failures_left -= 1
            self.send_response(503)
            self.end_headers()
            return
        Recorder.received.append((self.path, body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    Recorder.received, Recorder.failures_left = [], 0
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def wait_for(count: int) -> None:
    deadline = time.monotonic() + 10
    while len(Recorder.received) < count and time.monotonic() < deadline:
        time.sleep(0.02)


def test_alertmanager_v2_firing_resent_and_resolved(server: str) -> None:
    sender = AlertSender(resend_seconds=0.2)
    receiver = Alertmanager(server, httpx.Client())
    alert = firing("ns", "m", engaged_status(), NOW)
    sender.update(("ns", "m"), alert, [receiver])
    wait_for(1)
    path, body = Recorder.received[0]
    assert path == "/api/v2/alerts"
    assert body[0]["labels"]["alertname"] == "SpecfleetKillSwitchEngaged"
    assert "endsAt" not in body[0]
    sender.update(("ns", "m"), alert, [receiver])  # not due yet: no resend
    time.sleep(0.3)
    sender.update(("ns", "m"), alert, [receiver])  # due: resent while firing
    wait_for(2)
    sender.update(("ns", "m"), [], [receiver])  # cleared: resolved
    wait_for(3)
    assert len(Recorder.received) == 3
    assert "endsAt" in Recorder.received[2][1][0]
    sender.close()


def test_delivery_retries_with_backoff_then_succeeds(server: str) -> None:
    Recorder.failures_left = 2
    sender = AlertSender(backoff_seconds=0.01)
    sender.update(
        ("ns", "m"),
        firing("ns", "m", engaged_status(), NOW),
        [Webhook(server + "/hook", httpx.Client())],
    )
    wait_for(1)
    assert Recorder.received and Recorder.received[0][1]["text"].startswith("[FIRING]")
    sender.close()


def test_unreachable_receiver_is_counted_not_raised() -> None:
    before = (
        REGISTRY.get_sample_value(
            "specfleet_alert_deliveries_total", {"receiver": "alertmanager", "result": "failed"}
        )
        or 0.0
    )
    sender = AlertSender(backoff_seconds=0.01)
    dead = Alertmanager("http://127.0.0.1:9", httpx.Client())
    started = time.monotonic()
    sender.update(("ns", "m"), firing("ns", "m", engaged_status(), NOW), [dead])
    assert time.monotonic() - started < 0.1  # never blocks the caller
    sender.close(timeout=30)
    after = REGISTRY.get_sample_value(
        "specfleet_alert_deliveries_total", {"receiver": "alertmanager", "result": "failed"}
    )
    assert after == before + 1


TOKEN = "T0/B0/s3cr3t-t0ken"


def test_a_webhook_url_never_reaches_the_logs(
    server: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    Recorder.failures_left = 4  # every attempt of the first delivery fails
    sender = AlertSender(resend_seconds=0.0, backoff_seconds=0.01)
    alerts = firing("ns", "m", engaged_status(), NOW)
    hooks = [
        Webhook(f"{server}/hook/{TOKEN}", httpx.Client()),
        Webhook("http://user:s3cr3t@127.0.0.1:9/hook", httpx.Client()),
    ]
    sender.update(("ns", "m"), alerts, hooks)
    sender.update(("ns", "m"), alerts, hooks)  # resent: this one succeeds
    wait_for(1)
    sender.close(timeout=30)
    assert Recorder.received[0][0] == f"/hook/{TOKEN}"
    assert "alert delivery to webhook http://127.0.0.1/… failed: HTTP 503" in caplog.messages
    assert "alert delivery to webhook http://127.0.0.1/… failed: ConnectError" in caplog.messages
    assert caplog.records and not [r for r in caplog.records if "s3cr3t" in r.getMessage()]


def test_a_secret_with_a_trailing_newline_delivers_and_a_bad_url_stops_nothing(
    server: str, caplog: pytest.LogCaptureFixture
) -> None:
    sender = AlertSender(backoff_seconds=0.01)
    alerts = firing("ns", "m", engaged_status(), NOW)
    sender.update(("ns", "bad"), alerts, [Webhook(f"http://h/{TOKEN}\x00", httpx.Client())])
    sender.update(("ns", "m"), alerts, [Webhook(f"{server}/hook\n", httpx.Client())])
    wait_for(1)
    sender.close(timeout=30)
    assert [path for path, _ in Recorder.received] == ["/hook"]
    assert "alert delivery to webhook http://h/… failed: InvalidURL" in caplog.messages
    assert not [m for m in caplog.messages if "s3cr3t" in m]


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("https://hooks.slack.com/services/T0/B0/tok", "https://hooks.slack.com/…"),
        ("https://u:p@am.example:9093/x?token=t", "https://am.example/…"),
        ("hunter2", "<not a URL>"),
        ("http://[::1/x", "<not a URL>"),
    ],
)
def test_redacted_keeps_scheme_and_host_only(url: str, shown: str) -> None:
    assert redacted(url) == shown


def test_a_replica_that_does_not_lead_sends_nothing_and_sends_all_again_once_it_leads(
    server: str,
) -> None:
    leading = False
    sender = AlertSender(resend_seconds=600, may_send=lambda: leading)
    receiver = Alertmanager(server, httpx.Client())
    alert = firing("ns", "m", engaged_status(), NOW)
    sender.update(("ns", "m"), alert, [receiver])
    time.sleep(0.3)
    assert Recorder.received == []
    leading = True
    sender.update(("ns", "m"), alert, [receiver])  # not due, unchanged: nothing new to send
    sender.forget_all()  # a new term: what the last leader sent is unknown
    sender.update(("ns", "m"), alert, [receiver])
    wait_for(1)
    time.sleep(0.2)
    assert len(Recorder.received) == 1
    assert Recorder.received[0][1][0]["labels"]["alertname"] == "SpecfleetKillSwitchEngaged"
    sender.close()


def failed(sender: AlertSender) -> None:
    """Until every attempt of the delivery under way has failed."""
    deadline = time.monotonic() + 10
    while (Recorder.failures_left or not sender._failed) and time.monotonic() < deadline:
        time.sleep(0.02)


def test_a_delivery_that_failed_is_sent_again_at_the_next_update_not_the_next_resend(
    server: str,
) -> None:
    """Alertmanager down while an alert fires: every attempt fails. Back, the SpecModel's next
    update sends the alert once, long before a resend is due; a resolution likewise."""
    Recorder.failures_left = 4  # every attempt of the first delivery
    sender = AlertSender(resend_seconds=600, backoff_seconds=0.01)
    receiver = Alertmanager(server, httpx.Client())
    alert = firing("ns", "m", engaged_status(), NOW)
    sender.update(("ns", "m"), alert, [receiver])
    failed(sender)
    assert Recorder.received == []
    sender.update(("ns", "m"), alert, [receiver])  # unchanged, not due: only the failed one
    wait_for(1)
    sender.update(("ns", "m"), alert, [receiver])  # delivered: nothing more
    time.sleep(0.2)
    assert [body[0]["labels"]["alertname"] for _, body in Recorder.received] == [
        "SpecfleetKillSwitchEngaged"
    ]
    assert "endsAt" not in Recorder.received[0][1][0]

    Recorder.failures_left = 4
    sender.update(("ns", "m"), [], [receiver])  # cleared: the resolution fails
    failed(sender)
    sender.update(("ns", "m"), [], [receiver])
    wait_for(2)
    time.sleep(0.2)
    assert len(Recorder.received) == 2 and "endsAt" in Recorder.received[1][1][0]
    sender.close()


def test_only_a_transient_failure_to_a_receiver_the_specmodel_still_has_is_retried(
    server: str,
) -> None:
    request = httpx.Request("POST", "http://am/api/v2/alerts")
    for code, again in ((503, True), (429, True), (400, False), (404, False)):
        response = httpx.Response(code, request=request)
        assert transient(httpx.HTTPStatusError("x", request=request, response=response)) is again
    assert transient(httpx.ConnectError("refused")) and not transient(httpx.InvalidURL("x"))
    Recorder.failures_left = 4
    sender = AlertSender(resend_seconds=600, backoff_seconds=0.01)
    alert = firing("ns", "m", engaged_status(), NOW)
    sender.update(("ns", "m"), alert, [Alertmanager(server, httpx.Client())])
    failed(sender)
    rotated = Alertmanager(server, httpx.Client())  # its Secret rotated: another receiver
    sender.update(("ns", "m"), alert, [rotated])
    time.sleep(0.3)
    assert Recorder.received == []  # the next resend's
    sender.close()
