"""The operator's own Prometheus metrics (served on --metrics-port)."""

from __future__ import annotations

import contextlib

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from specfleet import series
from specfleet.alerts.metrics import ALERT_DELIVERIES
from specfleet.api.status import (
    ClassGuardStatus,
    ClassState,
    RolloutPhase,
    RolloutStatus,
    SpecModelStatus,
    SpeculationSource,
)

REGISTRY = CollectorRegistry()
REGISTRY.register(ALERT_DELIVERIES)

RECONCILES = Counter(
    series.RECONCILES,
    "SpecModel reconciles by namespace and result (ok, error, invalid).",
    ["namespace", "result"],
    registry=REGISTRY,
)
RECONCILE_SECONDS = Histogram(
    series.RECONCILE_SECONDS,
    "Time to reconcile one SpecModel.",
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
    registry=REGISTRY,
)
API_WRITES = Counter(
    series.API_WRITES,
    "Requests that change the cluster, by namespace and verb (apply, delete, status, event).",
    ["namespace", "verb"],
    registry=REGISTRY,
)
SPECMODELS = Gauge(
    series.SPECMODELS,
    "SpecModels by namespace and phase, as last reconciled.",
    ["namespace", "phase"],
    registry=REGISTRY,
)
KILL_SWITCH_ENGAGED = Gauge(
    series.KILL_SWITCH_ENGAGED,
    "1 while the kill switch holds the SpecModel's speculation off, by who holds it (source): "
    "the guard, or a human's override (annotation, spec).",
    ["namespace", "specmodel", "source"],
    registry=REGISTRY,
)
KILL_SWITCH_SOURCES = (
    SpeculationSource.GUARD,
    SpeculationSource.ANNOTATION,
    SpeculationSource.SPEC,
)
"""Each SpecModel has a series per source, 1 for the one that holds the switch (if any): an
alert on the guard's switch alone selects source="guard"."""
GUARD_DECISIONS = Counter(
    series.GUARD_DECISIONS,
    "Guard decisions by action (kill_switch_engaged, rolled_back, ...).",
    ["namespace", "action"],
    registry=REGISTRY,
)
ROLLBACKS = Counter(
    series.ROLLBACKS,
    "Rollbacks to the last good revision, and canary rollouts aborted.",
    ["namespace", "specmodel"],
    registry=REGISTRY,
)
GUARD_BLIND = Gauge(
    series.GUARD_BLIND,
    "1 while the guard of a SpecModel has no metrics.",
    ["namespace", "specmodel"],
    registry=REGISTRY,
)
ACTIVE_REVISION = Gauge(
    series.ACTIVE_REVISION,
    "The revision a SpecModel serves (differs from the desired one after a rollback).",
    ["namespace", "specmodel"],
    registry=REGISTRY,
)
ALERT_RECEIVERS_UNREADABLE = Gauge(
    series.ALERT_RECEIVERS_UNREADABLE,
    "1 while a SpecModel's alert receivers cannot be read from its Secrets.",
    ["namespace", "specmodel"],
    registry=REGISTRY,
)
ROLLOUT_CANARY_PODS = Gauge(
    series.ROLLOUT_CANARY_PODS,
    "Pods of a canary rollout's new revision beside the fleet (0 when no rollout runs).",
    ["namespace", "specmodel"],
    registry=REGISTRY,
)
ROLLOUT_STEP = Gauge(
    series.ROLLOUT_STEP,
    "The step a canary rollout runs, from 1 (0 when no rollout runs).",
    ["namespace", "specmodel"],
    registry=REGISTRY,
)
LEADER = Gauge(
    series.LEADER,
    "1 while this replica holds the operator's Lease and acts; 0 while it follows (ready to "
    "take over). Without --leader-elect, 1.",
    registry=REGISTRY,
)
CLASS_BREACHING = Gauge(
    series.CLASS_BREACHING,
    "1 while a class breaches the signal (speculation not paying, or an SLO), 0 once it is back.",
    ["namespace", "specmodel", "class", "signal"],
    registry=REGISTRY,
)
_breached: dict[tuple[str, str], set[tuple[str, str]]] = {}
"""Per SpecModel, the (class, signal) series set so far: they read 0 once back, not vanish."""


def record_classes(namespace: str, specmodel: str, classes: list[ClassGuardStatus]) -> None:
    breaching = {
        (c.name, signal) for c in classes if c.state == ClassState.BREACHING for signal in c.signals
    }
    series = _breached.get((namespace, specmodel), set()) | breaching
    for name, signal in series:
        value = 1 if (name, signal) in breaching else 0
        CLASS_BREACHING.labels(namespace, specmodel, name, signal).set(value)
    _breached[(namespace, specmodel)] = series


def forget_classes(namespace: str, specmodel: str) -> None:
    for name, signal in _breached.pop((namespace, specmodel), set()):
        CLASS_BREACHING.remove(namespace, specmodel, name, signal)


def record_kill_switch(namespace: str, specmodel: str, status: SpecModelStatus) -> None:
    held_by = status.speculation_held_off_by
    for source in KILL_SWITCH_SOURCES:
        KILL_SWITCH_ENGAGED.labels(namespace, specmodel, source).set(1 if held_by == source else 0)


def forget_kill_switch(namespace: str, specmodel: str) -> None:
    for source in KILL_SWITCH_SOURCES:
        with contextlib.suppress(KeyError):
            KILL_SWITCH_ENGAGED.remove(namespace, specmodel, source)


def record_rollout(namespace: str, specmodel: str, rollout: RolloutStatus | None) -> None:
    running = rollout if rollout and rollout.phase == RolloutPhase.PROGRESSING else None
    ROLLOUT_CANARY_PODS.labels(namespace, specmodel).set(running.pods if running else 0)
    ROLLOUT_STEP.labels(namespace, specmodel).set(running.step if running else 0)
