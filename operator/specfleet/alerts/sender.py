"""Delivers alerts in the background: never blocks reconciliation, retries with backoff, resends
firing alerts so Alertmanager keeps them alive, resolves them when they clear. A delivery whose
every attempt failed (the receiver down) is tried again at the SpecModel's next update, with the
alerts then current, to that receiver: an alert that fires while Alertmanager is down reaches it
soon after it is back, not only at the next resend."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx
from tenacity import Retrying, stop_after_attempt, wait_exponential_jitter

from specfleet.alerts.metrics import ALERT_DELIVERIES
from specfleet.alerts.model import Alert, AlertKey
from specfleet.alerts.receivers import Receiver

log = logging.getLogger(__name__)
Key = tuple[str, str]


@dataclass(frozen=True)
class Delivery:
    key: Key
    receiver: Receiver
    alerts: list[Alert]
    resolved: bool


class AlertSender:
    def __init__(
        self,
        resend_seconds: float = 60.0,
        queue_size: int = 1000,
        backoff_seconds: float = 0.5,
        may_send: Callable[[], bool] = lambda: True,
    ) -> None:
        """`may_send`: asked before each delivery; a replica that stopped leading sends nothing
        (the new leader sends the alerts its status implies, Alertmanager deduplicates)."""
        self.resend_seconds = resend_seconds
        self.may_send = may_send
        self._retrying = Retrying(
            wait=wait_exponential_jitter(multiplier=backoff_seconds, max=8, jitter=backoff_seconds),
            stop=stop_after_attempt(4),
            reraise=True,
        )
        self._queue: queue.Queue[Delivery | None] = queue.Queue(maxsize=queue_size)
        self._firing: dict[Key, dict[AlertKey, Alert]] = {}
        self._sent_at: dict[Key, float] = {}
        self._failed: dict[Key, list[Delivery]] = {}
        """Deliveries whose every attempt failed, by SpecModel: the worker adds, update takes."""
        self._failed_lock = threading.Lock()
        self._thread = threading.Thread(target=self._work, name="alert-sender", daemon=True)
        self._thread.start()

    def update(self, key: Key, alerts: list[Alert], receivers: list[Receiver]) -> None:
        """The SpecModel's alerts now; sends what started or cleared, and resends the rest."""
        old = self._firing.get(key, {})
        new = {a.key: a for a in alerts}
        resolved = [a for k, a in old.items() if k not in new]
        due = time.monotonic() - self._sent_at.get(key, 0.0) >= self.resend_seconds
        send = bool(new) and (due or new.keys() != old.keys())
        for receiver in receivers:
            if resolved:
                self._enqueue(Delivery(key, receiver, resolved, resolved=True))
            if send:
                self._enqueue(Delivery(key, receiver, list(new.values()), resolved=False))
        if send:
            self._sent_at[key] = time.monotonic()
        self._firing[key] = new
        self._retry(key, new, receivers, resent=send)

    def _retry(
        self, key: Key, firing: dict[AlertKey, Alert], receivers: list[Receiver], resent: bool
    ) -> None:
        """The failed deliveries to receivers the SpecModel still has, again, as of now: its
        alerts firing now (unless just sent to every receiver), the resolutions of those not
        firing again."""
        with self._failed_lock:
            failed = self._failed.pop(key, [])
        current = {id(r) for r in receivers}
        resolving: dict[int, tuple[Receiver, dict[AlertKey, Alert]]] = {}
        firing_to: dict[int, Receiver] = {}
        for delivery in failed:
            receiver = delivery.receiver
            if id(receiver) not in current:
                continue
            if delivery.resolved:
                _, alerts = resolving.setdefault(id(receiver), (receiver, {}))
                alerts.update({a.key: a for a in delivery.alerts if a.key not in firing})
            elif firing and not resent:
                firing_to[id(receiver)] = receiver
        for receiver, cleared in resolving.values():
            if cleared:
                self._enqueue(Delivery(key, receiver, list(cleared.values()), resolved=True))
        for receiver in firing_to.values():
            self._enqueue(Delivery(key, receiver, list(firing.values()), resolved=False))

    def forget(self, key: Key) -> None:
        self._firing.pop(key, None)
        self._sent_at.pop(key, None)
        with self._failed_lock:
            self._failed.pop(key, None)

    def forget_all(self) -> None:
        """What was sent is forgotten: the next update of each SpecModel sends its alerts whole
        (a replica that leads again after another led does not know what that one sent)."""
        self._firing.clear()
        self._sent_at.clear()
        with self._failed_lock:
            self._failed.clear()

    def close(self, timeout: float = 5.0) -> None:
        self._queue.put(None)
        self._thread.join(timeout)

    def _enqueue(self, delivery: Delivery) -> None:
        try:
            self._queue.put_nowait(delivery)
        except queue.Full:
            ALERT_DELIVERIES.labels(delivery.receiver.name, "dropped").inc()
            log.warning("alert queue full: dropped a delivery to %s", delivery.receiver.name)

    def _work(self) -> None:
        while (delivery := self._queue.get()) is not None:
            if not self.may_send():
                log.info(
                    "not leading: a delivery to %s is left to the leader", delivery.receiver.name
                )
                continue
            try:
                self._retrying(delivery.receiver.send, delivery.alerts, delivery.resolved)
                ALERT_DELIVERIES.labels(delivery.receiver.name, "ok").inc()
            except (httpx.HTTPError, httpx.InvalidURL, OSError) as exc:
                ALERT_DELIVERIES.labels(delivery.receiver.name, "failed").inc()
                if transient(exc):
                    with self._failed_lock:
                        self._failed.setdefault(delivery.key, []).append(delivery)
                receiver = delivery.receiver
                log.warning(
                    "alert delivery to %s %s failed: %s", receiver.name, receiver.target, cause(exc)
                )


def transient(exc: Exception) -> bool:
    """A failure that may pass (the receiver down, overloaded, unreachable), unlike a URL that is
    no URL or a request the receiver refuses."""
    if isinstance(exc, httpx.HTTPStatusError):
        code = exc.response.status_code
        return code >= 500 or code == 429
    return isinstance(exc, (httpx.TransportError, OSError))


def cause(exc: Exception) -> str:
    """What went wrong, without the exception's message: httpx's messages quote the URL."""
    if isinstance(exc, httpx.HTTPStatusError):
        return f"HTTP {exc.response.status_code}"
    return type(exc).__name__
