"""Alerts: which fire for a status, their wire format, and background delivery over real HTTP."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from conftest import specmodel_doc
from specfleet.alerts.model import Alert, firing
from specfleet.alerts.receivers import Alertmanager, Webhook, redacted, slack_message
from specfleet.alerts.sender import AlertSender
from specfleet.api import Condition, Decision, SpecModelStatus, parse_specmodel
from specfleet.api.status import KillSwitchStatus
from specfleet.controller.metrics import REGISTRY
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
