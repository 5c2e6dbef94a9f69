"""The alert receivers a SpecModel names (`spec.guard.alerts`), their URLs read from its Secrets.

Read once per generation and again every few minutes: Secrets rotate without the spec changing.
A read that fails keeps the receivers read last, is logged once per distinct failure, and shows
in `specfleet_alert_receivers_unreadable` while it lasts.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
import urllib3
from kubernetes.client.exceptions import ApiException

from specfleet.alerts.receivers import Alertmanager, Receiver, Webhook
from specfleet.api import SpecModel
from specfleet.api.spec import SecretKeyRef
from specfleet.controller.kube import Kube
from specfleet.controller.metrics import ALERT_RECEIVERS_UNREADABLE

log = logging.getLogger(__name__)
Key = tuple[str, str]
Stamp = tuple[str | None, int | None]
"""(uid, generation): one spec of one SpecModel."""

REFRESH_SECONDS = 180.0
READ_ERRORS = (ApiException, KeyError, ValueError, OSError, urllib3.exceptions.HTTPError)
"""An unreadable Secret: refused, missing, lacking the key, not text, or no answer."""


@dataclass(frozen=True)
class _Read:
    stamp: Stamp
    at: float
    receivers: list[Receiver]
    error: str | None


@dataclass
class ReceiverCache:
    kube: Kube
    http: httpx.Client
    monotonic: Callable[[], float] = time.monotonic
    _reads: dict[Key, _Read] = field(default_factory=dict)

    def of(self, key: Key, specmodel: SpecModel | None) -> list[Receiver]:
        """The SpecModel's own receivers; those read last while it is invalid (None)."""
        last = self._reads.get(key)
        if specmodel is None:
            return last.receivers if last else []
        stamp = (specmodel.metadata.uid, specmodel.metadata.generation)
        now = self.monotonic()
        if last is not None and last.stamp == stamp and now - last.at < REFRESH_SECONDS:
            return last.receivers
        receivers, error = _receivers(self.kube, self.http, specmodel)
        if error is not None:
            if last is None or last.error != error:
                log.warning("alert receivers of %s/%s: %s", *key, error)
            receivers = last.receivers if last is not None else receivers
        elif last is not None and last.error is not None:
            log.info("alert receivers of %s/%s are readable again", *key)
        ALERT_RECEIVERS_UNREADABLE.labels(*key).set(0 if error is None else 1)
        self._reads[key] = _Read(stamp, now, receivers, error)
        return receivers

    def forget(self, key: Key) -> list[Receiver]:
        """Drops the SpecModel's receivers, returning them (to resolve what it had firing)."""
        read = self._reads.pop(key, None)
        if read is not None:
            ALERT_RECEIVERS_UNREADABLE.remove(*key)
        return read.receivers if read is not None else []


def _receivers(
    kube: Kube, http: httpx.Client, specmodel: SpecModel
) -> tuple[list[Receiver], str | None]:
    """Every receiver whose URL could be read, and what could not be, if anything."""
    config = specmodel.spec.guard.alerts
    wanted: list[tuple[Callable[[str, httpx.Client], Receiver], str | SecretKeyRef]] = []
    if config is not None and config.alertmanager is not None:
        source = config.alertmanager.url_secret or config.alertmanager.url
        if source:
            wanted.append((Alertmanager, source))
    if config is not None and config.webhook_secret is not None:
        wanted.append((Webhook, config.webhook_secret))
    receivers: list[Receiver] = []
    errors = []
    for receiver, source in wanted:
        if isinstance(source, str):
            receivers.append(receiver(source, http))
            continue
        try:
            url = kube.read_secret(specmodel.metadata.namespace, source.name, source.key)
        except READ_ERRORS as exc:
            errors.append(f"Secret {source.name} key {source.key}: {_cause(exc)}")
            continue
        receivers.append(receiver(url, http))
    return receivers, "; ".join(errors) or None


def _cause(exc: Exception) -> str:
    if isinstance(exc, ApiException):
        return f"API server answered {exc.status} {exc.reason}"
    if isinstance(exc, KeyError):
        return "no such key"
    return type(exc).__name__
