"""Alertmanager down while a rollback fires (issue 31's chaos table), with the real Alertmanager
on loopback: stopped when the decision's alert fires, started again on its port. The alert is
delivered once it is back, at the SpecModel's next update (the operator updates at every guard
tick), and once: Alertmanager holds one alert and received one, however many updates follow."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from conftest import free_port
from specfleet.alerts.model import firing
from specfleet.alerts.receivers import Alertmanager
from specfleet.alerts.sender import AlertSender
from specfleet.api import Condition, Decision, SpecModelStatus
from specfleet.api.status import ConditionType, DecisionReason
from specfleet.controller.metrics import REGISTRY
from specfleet.guard.actions import ActionKind

CONFIG = "route: {receiver: nowhere}\nreceivers: [{name: nowhere}]\n"
RECEIVED = re.compile(r'^alertmanager_alerts_received_total\{status="firing",version="v2"\} (\S+)$')


def binary() -> str:
    found = os.environ.get("ALERTMANAGER") or shutil.which("prometheus-alertmanager")
    if not found:
        pytest.fail("ALERTMANAGER is not set: run the tests through `make unit` (it installs it)")
    return found


@dataclass
class LocalAlertmanager:
    """One Alertmanager process on a fixed loopback port, stopped and started again there."""

    state: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        config = self.state / "alertmanager.yml"
        config.write_text(CONFIG)
        self.process = subprocess.Popen(
            [
                binary(),
                f"--config.file={config}",
                f"--storage.path={self.state / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--cluster.listen-address=",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        until(lambda: self._get("/-/ready") is not None, "Alertmanager ready")

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=10)
            self.process = None

    def alerts(self, alertname: str) -> list[dict[str, Any]]:
        response = self._get("/api/v2/alerts", {"filter": f'alertname="{alertname}"'})
        assert response is not None
        alerts: list[dict[str, Any]] = response.json()
        return alerts

    def received(self) -> float:
        """Firing alerts it was sent (each post of an alert counts, a repeat too)."""
        response = self._get("/metrics")
        assert response is not None
        found = (RECEIVED.match(line) for line in response.text.splitlines())
        return sum(float(match.group(1)) for match in found if match)

    def _get(self, path: str, params: dict[str, str] | None = None) -> httpx.Response | None:
        try:
            return httpx.get(self.url + path, params=params, timeout=2).raise_for_status()
        except httpx.HTTPError:
            return None


def until(holds: Callable[[], bool], what: str, seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while not holds():
        assert time.monotonic() < deadline, f"not within {seconds} s: {what}"
        time.sleep(0.02)


@pytest.fixture
def alertmanager(tmp_path: Path) -> Iterator[LocalAlertmanager]:
    local = LocalAlertmanager(tmp_path)
    local.start()
    yield local
    local.stop()


def rolled_back(now: datetime) -> SpecModelStatus:
    """Alertmanager refuses an alert that starts after it would end (in its clock): `now` is
    the wall clock."""
    message = "Revision 2 rolled back to revision 1: chat tool-call validity 0.62 < 0.95"
    return SpecModelStatus(
        conditions=[
            Condition(
                type=ConditionType.ROLLED_BACK,
                status="True",
                reason=DecisionReason.ROLLED_BACK,
                message=message,
            )
        ],
        decisions=[
            Decision(
                time=now.isoformat(),
                action=ActionKind.ROLLED_BACK,
                reason=DecisionReason.ROLLED_BACK,
                message=message,
                evidence={"toolCallValidity": 0.62},
            )
        ],
    )


def failed_deliveries() -> float:
    labels = {"receiver": "alertmanager", "result": "failed"}
    return REGISTRY.get_sample_value("specfleet_alert_deliveries_total", labels) or 0.0


def test_a_rollback_alert_fired_while_alertmanager_is_down_arrives_once_when_it_is_back(
    alertmanager: LocalAlertmanager,
) -> None:
    sender = AlertSender(resend_seconds=600, backoff_seconds=0.02)
    now = datetime.now(UTC)
    alerts = firing("ns", "m", rolled_back(now), now)
    receivers = [Alertmanager(alertmanager.url, httpx.Client())]

    def tick() -> None:
        sender.update(("ns", "m"), alerts, receivers)

    alertmanager.stop()
    failed = failed_deliveries()
    tick()  # the rollback's: every attempt fails
    until(lambda: failed_deliveries() == failed + 1, "the delivery failed")
    tick()  # still down: tried again, failed again, kept
    until(lambda: failed_deliveries() == failed + 2, "the retry failed")

    alertmanager.start()
    back = time.monotonic()
    tick()
    until(lambda: bool(alertmanager.alerts("SpecfleetRolledBack")), "the alert delivered")
    delivered = time.monotonic() - back
    for _ in range(3):
        tick()
    sender.close()

    [alert] = alertmanager.alerts("SpecfleetRolledBack")
    assert alert["labels"]["specmodel"] == "m" and alert["status"]["state"] == "active"
    assert alertmanager.received() == 1
    assert failed_deliveries() == failed + 2
    assert delivered < 2, f"delivered {delivered:.2f} s after the first update once back"
