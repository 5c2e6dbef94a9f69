"""Delivery to Alertmanager (v2 API) and to a generic JSON webhook (Slack-compatible text).

A receiver's URL is a credential (a Slack webhook's path is its token; an Alertmanager URL from a
Secret may carry basic auth): it is never logged. httpx logs every request's URL at INFO, so its
logger is held at WARNING."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, Protocol
from urllib.parse import urlsplit

import httpx

from specfleet.alerts.model import Alert

TIMEOUT = httpx.Timeout(5.0, connect=2.0)
logging.getLogger("httpx").setLevel(logging.WARNING)


class Receiver(Protocol):
    name: str
    target: str
    """Where alerts go, safe to log: scheme and host only."""

    def send(self, alerts: Sequence[Alert], resolved: bool) -> None: ...


def redacted(url: str) -> str:
    """Scheme and host of `url`, without credentials, path or query."""
    try:
        parts = urlsplit(url.strip())
    except ValueError:
        return "<not a URL>"
    if not parts.scheme or not parts.hostname:
        return "<not a URL>"
    return f"{parts.scheme}://{parts.hostname}/…"


class Alertmanager:
    name = "alertmanager"

    def __init__(self, url: str, client: httpx.Client) -> None:
        self.url = url.strip().rstrip("/") + "/api/v2/alerts"
        self.target = redacted(url)
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
        # A Secret written with `--from-file` often ends in a newline, which httpx refuses.
        self.url = url.strip()
        self.target = redacted(url)
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
