"""Reads the gateways' per-class metrics from Prometheus as `Observation`s.

Batched: one fixed set of PromQL queries per window length per tick, grouped by labels, however
many SpecModels and classes there are. Sync (prometheus-api-client); run it in a thread.
Prometheus down or a failing query makes every affected Observation blind, never zero.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, fields, replace
from datetime import datetime
from typing import Any

from prometheus_api_client import PrometheusConnect
from prometheus_api_client.exceptions import PrometheusApiClientException
from requests.exceptions import RequestException
from urllib3.util.retry import Retry

from specfleet import series
from specfleet.telemetry.model import ClassWindow, Observation

log = logging.getLogger(__name__)
GROUP = ", ".join(series.SERIES_KEY)
SeriesKey = tuple[str, str, str, str, str]
"""One value per label of `series.SERIES_KEY`."""


@dataclass(frozen=True)
class Target:
    """What to read for one SpecModel: its window and the plan its pods should run."""

    namespace: str
    specmodel: str
    window_seconds: int
    revision: int
    speculation: bool
    canary: tuple[int, bool] | None = None
    """The canary's (revision, speculation); None: the same revision with speculation the other
    way (a trial's canary, if one runs)."""


def _increase(metric: str, extra: str = "") -> str:
    by = f"{GROUP}{', ' + extra if extra else ''}"
    return f"sum by ({by}) (increase({metric}_total[{{w}}]))"


def _quantile(metric: str) -> str:
    return f"histogram_quantile(0.95, sum by ({GROUP}, le) (rate({metric}_bucket[{{w}}])))"


def _mean(metric: str) -> str:
    rate = "sum by ({g}) (rate({m}_{s}[{{w}}]))"
    return (
        f"{rate.format(g=GROUP, m=metric, s='sum')} / {rate.format(g=GROUP, m=metric, s='count')}"
    )


def _validity(metric: str, valid: bool) -> tuple[str, str, str]:
    return _increase(metric, series.VALID), series.VALID, series.valid_value(valid)


# field of ClassWindow -> (PromQL template, label that must match, its value)
QUERIES: dict[str, tuple[str, str | None, str | None]] = {
    "requests": (_increase(series.REQUESTS), None, None),
    "errors": (
        _increase(series.REQUESTS, series.OUTCOME),
        series.OUTCOME,
        series.UPSTREAM_ERROR,
    ),
    "draft_tokens": (_increase(series.DRAFT_TOKENS), None, None),
    "accepted_tokens": (_increase(series.ACCEPTED_TOKENS), None, None),
    "steps": (_increase(series.SPEC_STEPS), None, None),
    "output_tokens": (_increase(series.OUTPUT_TOKENS), None, None),
    "request_seconds": (_increase(series.REQUEST_SECONDS), None, None),
    "p95_ttft_seconds": (_quantile(series.TTFT), None, None),
    "p95_tpot_seconds": (_quantile(series.TPOT), None, None),
    "mean_tpot_seconds": (_mean(series.TPOT), None, None),
    "tool_calls_valid": _validity(series.TOOL_CALLS, True),
    "tool_calls_invalid": _validity(series.TOOL_CALLS, False),
    "structured_valid": _validity(series.STRUCTURED_OUTPUTS, True),
    "structured_invalid": _validity(series.STRUCTURED_OUTPUTS, False),
    "choices": (_increase(series.FINISH_REASONS), None, None),
    "truncated": (
        _increase(series.FINISH_REASONS, series.REASON),
        series.REASON,
        series.TRUNCATED,
    ),
}
UNJUDGED_QUERY = _increase(series.QUALITY_UNJUDGED, f"{series.KIND}, {series.REASON}")
# the unjudged series' `kind` label -> field of ClassWindow (a mapping reason -> count)
UNJUDGED_FIELDS = {"tool_call": "tool_calls_unjudged", "structured_output": "structured_unjudged"}
assert set(QUERIES) | set(UNJUDGED_FIELDS.values()) == {f.name for f in fields(ClassWindow)}
QUERIES_PER_TICK = len({query for query, _, _ in QUERIES.values()}) + 1
"""The PromQL queries one tick sends per window length, whatever the fleet size."""


class TelemetryReader:
    def __init__(self, url: str, timeout_seconds: float = 10.0) -> None:
        # One quick retry: a tick that cannot read is blind, and the next tick tries again.
        retry = Retry(total=1, backoff_factor=0.2, status_forcelist=(502, 503, 504))
        self._prometheus = PrometheusConnect(
            url=url, disable_ssl=True, retry=retry, timeout=int(timeout_seconds)
        )
        self._timeout = timeout_seconds
        self.queries = 0
        """PromQL queries sent, for benchmarks and tests."""

    def read(self, targets: list[Target], now: datetime) -> dict[tuple[str, str], Observation]:
        by_window: dict[int, list[Target]] = defaultdict(list)
        for target in targets:
            by_window[target.window_seconds].append(target)
        result: dict[tuple[str, str], Observation] = {}
        for window, group in by_window.items():
            result |= self._read_window(window, group, now)
        return result

    def _read_window(
        self, window: int, targets: list[Target], now: datetime
    ) -> dict[tuple[str, str], Observation]:
        try:
            values = _by_pod_state(*self._query_all(window))
        except (PrometheusApiClientException, RequestException, ValueError) as exc:
            reason = f"Prometheus query failed: {exc}"[:300]
            log.warning("%s", reason)
            return {
                (t.namespace, t.specmodel): _observation(t, now, {}, blind=reason) for t in targets
            }
        return {(t.namespace, t.specmodel): _observations(t, now, values) for t in targets}

    def _query_all(
        self, window: int
    ) -> tuple[dict[str, dict[SeriesKey, float]], list[dict[str, Any]]]:
        """Every field's series, and the unjudged quality checks' rows."""
        cache: dict[str, list[dict[str, Any]]] = {}
        values: dict[str, dict[SeriesKey, float]] = {}
        for name, (template, label, wanted) in QUERIES.items():
            query = template.format(w=f"{window}s")
            if query not in cache:
                cache[query] = self._query(query)
            values[name] = _series(cache[query], label, wanted)
        return values, self._query(UNJUDGED_QUERY.format(w=f"{window}s"))

    def _query(self, query: str) -> list[dict[str, Any]]:
        self.queries += 1
        rows: list[dict[str, Any]] = self._prometheus.custom_query(
            query, params={"timeout": f"{int(self._timeout * 1000)}ms"}
        )
        return rows


def _series(
    rows: list[dict[str, Any]], label: str | None, wanted: str | None
) -> dict[SeriesKey, float]:
    out: dict[SeriesKey, float] = {}
    for row in rows:
        metric = row["metric"]
        if label is not None and metric.get(label) != wanted:
            continue
        value = float(row["value"][1])
        if value != value:  # NaN: a histogram or ratio with no observations in the window
            continue
        out[_series_key(metric)] = value
    return out


def _series_key(metric: dict[str, str]) -> SeriesKey:
    namespace, specmodel, klass, revision, speculation = (
        metric.get(label, "") for label in series.SERIES_KEY
    )
    return namespace, specmodel, klass, revision, speculation


StateKey = tuple[str, str, str, str]
"""(namespace, specmodel, revision, speculation): one SpecModel's pods in one plan state."""


def _state(target: Target) -> StateKey:
    speculation = series.speculation_value(target.speculation)
    return target.namespace, target.specmodel, str(target.revision), speculation


def _by_pod_state(
    values: dict[str, dict[SeriesKey, float]], unjudged: list[dict[str, Any]]
) -> dict[StateKey, dict[str, dict[str, Any]]]:
    """Regroups query results once, so each target is a lookup: state -> class -> field."""
    grouped: dict[StateKey, dict[str, dict[str, Any]]] = defaultdict(lambda: defaultdict(dict))
    for name, by_key in values.items():
        for (namespace, specmodel, klass, revision, speculation), value in by_key.items():
            grouped[(namespace, specmodel, revision, speculation)][klass][name] = value
    for row in unjudged:
        metric = row["metric"]
        field_name = UNJUDGED_FIELDS.get(metric.get(series.KIND, ""))
        value = float(row["value"][1])
        if field_name is None or not value > 0:  # also NaN
            continue
        namespace, specmodel, klass, revision, speculation = _series_key(metric)
        found = grouped[(namespace, specmodel, revision, speculation)][klass]
        found.setdefault(field_name, {})[metric.get(series.REASON, "")] = value
    return grouped


def _observations(
    target: Target, now: datetime, values: dict[StateKey, dict[str, dict[str, Any]]]
) -> Observation:
    """The target's pods, with its canary's beside them: the same queries answered both, so
    reading them costs nothing."""
    revision, speculation = target.canary or (target.revision, not target.speculation)
    other = replace(target, revision=revision, speculation=speculation, canary=None)
    found = values.get(_state(other))
    beside = _observation(other, now, found) if found else None
    observation = _observation(target, now, values.get(_state(target), {}))
    return replace(observation, canary=beside)


def _observation(
    target: Target, now: datetime, classes: dict[str, dict[str, Any]], blind: str | None = None
) -> Observation:
    return Observation(
        at=now,
        window_seconds=target.window_seconds,
        revision=target.revision,
        speculation=target.speculation,
        classes={klass: ClassWindow(**found) for klass, found in classes.items()},
        blind=blind,
    )
