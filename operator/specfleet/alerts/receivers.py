"""Delivery to Alertmanager (v2 API) and to a generic JSON webhook (Slack-compatible text)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, Protocol

import httpx

from specfleet.alerts.model import Alert

TIMEOUT = httpx.Timeout(5.0, connect=2.0)


class Receiver(Protocol):
    name: str

    def send(self, alerts: Sequence[Alert], resolved: bool) -> None: ...


class Alertmanager:
    name = "alertmanager"

    def __init__(self, url: str, client: httpx.Client) -> None:
        self.url = url.rstrip("/") + "/api/v2/alerts"
        self._client = client

    def send(self, alerts: Sequence[Alert], resolved: bool) -> None:
        now = datetime.now(UTC).isoformat()
        body = [_postable(a, now if resolved else a.ends_at) for a in alerts]
        self._client.post(self.url, json=body, timeout=TIMEOUT).raise_for_status()


def _postable(alert: Alert, ends_at: str | None) -> dict[str, Any]:
    body: dict[str, Any] = {"labels": alert.labels(), "annotations": alert.annotations()}
    if alert.starts_at:
        body["startsAt"] = alert.starts_at
    if ends_at:
        body["endsAt"] = ends_at
    return body


class Webhook:
    name = "webhook"

    def __init__(self, url: str, client: httpx.Client) -> None:
        self.url = url
        self._client = client

    def send(self, alerts: Sequence[Alert], resolved: bool) -> None:
        for alert in alerts:
            self._client.post(
                self.url, json=slack_message(alert, resolved), timeout=TIMEOUT
            ).raise_for_status()


def slack_message(alert: Alert, resolved: bool) -> dict[str, Any]:
    state = "RESOLVED" if resolved else "FIRING"
    text = f"[{state}] {alert.name} {alert.namespace}/{alert.specmodel}: {alert.summary}"
    if alert.evidence and not resolved:
        text += f"\nevidence: {json.dumps(alert.evidence, sort_keys=True)[:1500]}"
    return {
        "text": text,
        "status": state.lower(),
        "labels": alert.labels(),
        "evidence": alert.evidence,
    }
