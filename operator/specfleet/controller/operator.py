"""The operator's state between events: the API writer, render settings, per-SpecModel locks
and retry backoff. kopf handlers call `Operator.reconcile`; it never runs on the event loop."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from specfleet.controller import children
from specfleet.controller.kube import Kube
from specfleet.controller.metrics import KILL_SWITCH_ENGAGED, RECONCILE_SECONDS, RECONCILES
from specfleet.controller.reconcile import Live, Outcome, reconcile
from specfleet.render import RenderSettings

Body = dict[str, Any]
Key = tuple[str, str]
"""(namespace, SpecModel name)."""
Index = Mapping[Key, Iterable[Body]]
log = logging.getLogger(__name__)

MAX_BACKOFF_SECONDS = 300.0


@dataclass
class Operator:
    kube: Kube
    settings: RenderSettings = field(default_factory=RenderSettings)
    clock: Callable[[], datetime] = lambda: datetime.now(UTC)
    _locks: dict[Key, threading.Lock] = field(default_factory=dict)
    _guard: threading.Lock = field(default_factory=threading.Lock)
    _backoff: dict[Key, tuple[float, float]] = field(default_factory=dict)
    """Key -> (next attempt at, current delay) after failed applies: no retry storms."""

    def reconcile(
        self, key: Key, specmodels: Index, child_indexes: list[Index], pods: Index
    ) -> Outcome | None:
        body = next(iter(specmodels.get(key, [])), None)
        if body is None or self._backing_off(key):
            return None
        with self._lock(key), RECONCILE_SECONDS.time():
            outcome = reconcile(
                body, _live(key, child_indexes, pods), self.kube, self.settings, self.clock()
            )
        self._record(key, outcome)
        return outcome

    def _lock(self, key: Key) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(key, threading.Lock())

    def _backing_off(self, key: Key) -> bool:
        next_at, _ = self._backoff.get(key, (0.0, 0.0))
        return time.monotonic() < next_at

    def _record(self, key: Key, outcome: Outcome) -> None:
        namespace, name = key
        result = "ok" if outcome.error is None else "error"
        if outcome.status.phase == "Invalid":
            result = "invalid"
        RECONCILES.labels(namespace, result).inc()
        if result == "error":
            _, delay = self._backoff.get(key, (0.0, 0.5))
            delay = min(delay * 2, MAX_BACKOFF_SECONDS)
            self._backoff[key] = (time.monotonic() + delay, delay)
        else:
            self._backoff.pop(key, None)
        KILL_SWITCH_ENGAGED.labels(namespace, name).set(1 if _switched_off(outcome) else 0)

    def forget(self, key: Key) -> None:
        self._backoff.pop(key, None)
        with self._guard:
            self._locks.pop(key, None)
        with contextlib.suppress(KeyError):
            KILL_SWITCH_ENGAGED.remove(*key)


def _switched_off(outcome: Outcome) -> bool:
    plan = outcome.status.serving_plan
    return outcome.status.speculation not in (None, "none") and not (plan and plan.speculation)


def _live(key: Key, child_indexes: list[Index], pods: Index) -> Live:
    found = {children.key(body): body for index in child_indexes for body in index.get(key, [])}
    return Live(children=found, pods=list(pods.get(key, [])))
