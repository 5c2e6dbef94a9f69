"""Alert delivery's Prometheus metrics; the operator serves them with its own
(`controller.metrics`)."""

from __future__ import annotations

from prometheus_client import Counter

from specfleet import series

ALERT_DELIVERIES = Counter(
    series.ALERT_DELIVERIES,
    "Alert deliveries by receiver and result (ok, failed, dropped).",
    ["receiver", "result"],
    registry=None,
)
