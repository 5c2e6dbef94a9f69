"""Alert delivery's Prometheus metrics; the operator serves them with its own
(`controller.metrics`)."""

from __future__ import annotations

from prometheus_client import Counter

ALERT_DELIVERIES = Counter(
    "specfleet_alert_deliveries_total",
    "Alert deliveries by receiver and result (ok, failed, dropped).",
    ["receiver", "result"],
    registry=None,
)
