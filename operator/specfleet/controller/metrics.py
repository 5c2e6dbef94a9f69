"""The operator's own Prometheus metrics (served on --metrics-port)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

REGISTRY = CollectorRegistry()

RECONCILES = Counter(
    "specfleet_reconcile_total",
    "SpecModel reconciles by namespace and result (ok, error, invalid).",
    ["namespace", "result"],
    registry=REGISTRY,
)
RECONCILE_SECONDS = Histogram(
    "specfleet_reconcile_duration_seconds",
    "Time to reconcile one SpecModel.",
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
    registry=REGISTRY,
)
API_WRITES = Counter(
    "specfleet_api_writes_total",
    "Requests that change the cluster: apply, delete, status, event.",
    ["verb"],
    registry=REGISTRY,
)
SPECMODELS = Gauge("specfleet_specmodels", "SpecModels by phase.", ["phase"], registry=REGISTRY)
KILL_SWITCH_ENGAGED = Gauge(
    "specfleet_kill_switch_engaged",
    "1 while speculation is switched off for the SpecModel by the guard or an override.",
    ["namespace", "specmodel"],
    registry=REGISTRY,
)
