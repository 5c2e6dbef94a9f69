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


def _increase(metric: str, group: str, selector: str, extra: str = "") -> str:
    by = f"{group}{', ' + extra if extra else ''}"
    return f"sum by ({by}) (increase({metric}_total{selector}[{{w}}]))"


def _quantile(metric: str, group: str, selector: str) -> str:
    rate = f"rate({metric}_bucket{selector}[{{w}}])"
    return f"histogram_quantile(0.95, sum by ({group}, le) ({rate}))"


def _mean(metric: str, group: str, selector: str) -> str:
    rate = "sum by ({g}) (rate({m}_{s}{sel}[{{w}}]))"
    sums, counts = (rate.format(g=group, m=metric, s=s, sel=selector) for s in ("sum", "count"))
    return f"{sums} / {counts}"


def _samples(metric: str, group: str, selector: str) -> str:
    return f"sum by ({group}) (increase({metric}_count{selector}[{{w}}]))"


MOMENT_FIELDS = (
    "spec_requests",
    "accepted_squares",
    "drafted_squares",
    "accepted_by_drafted",
    "tpot_squares",
    "ttft_squares",
)
"""The ClassWindow fields of series.MOMENTS, in their order."""

Query = tuple[str, str | None, str | None]
"""A PromQL template (`{w}`: the window), and the label that must match with its value."""


def queries(group: str, selector: str = "") -> dict[str, Query]:
    """Each field of ClassWindow as a query grouped by `group`, over the series `selector`
    (`{label="value",...}`) picks."""

    selector = _literal(selector)

    def increase(metric: str, extra: str = "") -> str:
        return _increase(metric, group, selector, extra)

    def validity(metric: str, valid: bool) -> Query:
        return increase(metric, series.VALID), series.VALID, series.valid_value(valid)

    def moment(name: str) -> Query:
        return increase(series.REQUEST_MOMENTS, series.MOMENT), series.MOMENT, name

    return {
        "requests": (increase(series.REQUESTS), None, None),
        "errors": (
            increase(series.REQUESTS, series.OUTCOME),
            series.OUTCOME,
            series.UPSTREAM_ERROR,
        ),
        "draft_tokens": (increase(series.DRAFT_TOKENS), None, None),
        "accepted_tokens": (increase(series.ACCEPTED_TOKENS), None, None),
        **{field: moment(name) for field, name in zip(MOMENT_FIELDS, series.MOMENTS, strict=True)},
        "steps": (increase(series.SPEC_STEPS), None, None),
        "output_tokens": (increase(series.OUTPUT_TOKENS), None, None),
        "request_seconds": (increase(series.REQUEST_SECONDS), None, None),
        "p95_ttft_seconds": (_quantile(series.TTFT, group, selector), None, None),
        "mean_ttft_seconds": (_mean(series.TTFT, group, selector), None, None),
        "ttft_samples": (_samples(series.TTFT, group, selector), None, None),
        "p95_tpot_seconds": (_quantile(series.TPOT, group, selector), None, None),
        "mean_tpot_seconds": (_mean(series.TPOT, group, selector), None, None),
        "tpot_samples": (_samples(series.TPOT, group, selector), None, None),
        "tool_calls_valid": validity(series.TOOL_CALLS, True),
        "tool_calls_invalid": validity(series.TOOL_CALLS, False),
        "structured_valid": validity(series.STRUCTURED_OUTPUTS, True),
        "structured_invalid": validity(series.STRUCTURED_OUTPUTS, False),
        "choices": (increase(series.FINISH_REASONS), None, None),
        "truncated": (
            increase(series.FINISH_REASONS, series.REASON),
            series.REASON,
            series.TRUNCATED,
        ),
        "empty_answers": (increase(series.EMPTY_ANSWERS), None, None),
    }


def increase_query(metric: str, group: str, selector: str = "") -> str:
    """A counter's increase by `group` over the window (`{w}` in the template)."""
    return _increase(metric, group, _literal(selector))


def unjudged_query(group: str, selector: str = "") -> str:
    extra = f"{series.KIND}, {series.REASON}"
    return _increase(series.QUALITY_UNJUDGED, group, _literal(selector), extra)


def _literal(selector: str) -> str:
    """The selector inside a template the window is formatted into."""
    return selector.replace("{", "{{").replace("}", "}}")


@dataclass(frozen=True)
class Grouping:
    """How one batch of queries groups the series: by the labels of a pod state (one
    SpecModel's pods in one plan state; one experiment's arm), then by class."""

    state: tuple[str, ...]
    selector: str = ""
    """Which series, as PromQL's `{label="value",...}`; empty: every one."""

    @property
    def labels(self) -> str:
        return ", ".join((*self.state, series.CLASS))

    def key(self, metric: dict[str, str]) -> tuple[State, str]:
        state = tuple(metric.get(label, UNLABELLED.get(label, "")) for label in self.state)
        return state, metric.get(series.CLASS, "")


UNLABELLED = {series.POOL: series.FLEET_POOL}
"""What a series without the label is: one from a gateway older than the plain pool served
its own engine's requests."""


State = tuple[str, ...]
"""One value per label of a Grouping's state."""
Grouped = dict[State, dict[str, dict[str, Any]]]
"""state -> class -> field of ClassWindow -> value."""
FLEET = Grouping(
    (series.NAMESPACE, series.SPECMODEL, series.REVISION, series.SPECULATION, series.POOL)
)
"""The requests the SpecModel's gateways measured, by the pool that served them: their own pods'
(`FLEET_POOL`) and the plain pool's (`PLAIN_POOL`), one answer for both."""


QUERIES = queries(FLEET.labels)
"""The fleet's: field of ClassWindow -> (PromQL template, label that must match, its value)."""
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
            values = self.read_grouped(FLEET, window)
        except QueryFailed as exc:
            return {
                (t.namespace, t.specmodel): _observation(t, now, {}, blind=str(exc))
                for t in targets
            }
        return {(t.namespace, t.specmodel): _observations(t, now, values) for t in targets}

    def read_grouped(
        self, grouping: Grouping, window: int, until: datetime | None = None
    ) -> Grouped:
        """Every field of every class of every state over the `window` seconds up to `until`
        (now by default); QueryFailed when Prometheus did not answer."""
        return _grouped(grouping, *self._query_all(grouping, window, until))

    def _query_all(
        self, grouping: Grouping, window: int, until: datetime | None
    ) -> tuple[dict[str, list[dict[str, Any]]], list[dict[str, Any]]]:
        """Every field's rows, and the unjudged quality checks' rows."""
        cache: dict[str, list[dict[str, Any]]] = {}
        rows: dict[str, list[dict[str, Any]]] = {}
        for name, (template, label, wanted) in queries(grouping.labels, grouping.selector).items():
            query = template.format(w=f"{window}s")
            if query not in cache:
                cache[query] = self.query(query, until)
            rows[name] = [
                r for r in cache[query] if label is None or r["metric"].get(label) == wanted
            ]
        unjudged = unjudged_query(grouping.labels, grouping.selector)
        return rows, self.query(unjudged.format(w=f"{window}s"), until)

    def query(self, query: str, at: datetime | None = None) -> list[dict[str, Any]]:
        """The rows of an instant query (at `at`, now by default); QueryFailed when Prometheus
        did not answer."""
        self.queries += 1
        params = {"timeout": f"{int(self._timeout * 1000)}ms"}
        if at is not None:
            params["time"] = f"{at.timestamp():.3f}"
        try:
            rows: list[dict[str, Any]] = self._prometheus.custom_query(query, params=params)
        except (PrometheusApiClientException, RequestException, ValueError) as exc:
            reason = f"Prometheus query failed: {exc}"[:300]
            log.warning("%s", reason)
            raise QueryFailed(reason) from None
        return rows


class QueryFailed(Exception):
    """Prometheus did not answer a query: whatever it was to tell is unknown, never zero."""


def _grouped(
    grouping: Grouping, rows: dict[str, list[dict[str, Any]]], unjudged: list[dict[str, Any]]
) -> Grouped:
    """Regroups query results once, so each target is a lookup: state -> class -> field."""
    grouped: Grouped = defaultdict(lambda: defaultdict(dict))
    for name, found in rows.items():
        for row in found:
            value = float(row["value"][1])
            if value != value:  # NaN: a histogram or ratio with no observations in the window
                continue
            state, klass = grouping.key(row["metric"])
            grouped[state][klass][name] = value
    for row in unjudged:
        metric = row["metric"]
        field_name = UNJUDGED_FIELDS.get(metric.get(series.KIND, ""))
        value = float(row["value"][1])
        if field_name is None or not value > 0:  # also NaN
            continue
        state, klass = grouping.key(metric)
        grouped[state][klass].setdefault(field_name, {})[metric.get(series.REASON, "")] = value
    return grouped


def _state(target: Target, pool: str = series.FLEET_POOL) -> State:
    speculation = series.speculation_value(target.speculation)
    return target.namespace, target.specmodel, str(target.revision), speculation, pool


def _observations(target: Target, now: datetime, values: Grouped) -> Observation:
    """The target's pods, with its canary's beside them and what their gateways sent to the
    plain pool: the same queries answered all three, so reading them costs nothing."""
    revision, speculation = target.canary or (target.revision, not target.speculation)
    other = replace(target, revision=revision, speculation=speculation, canary=None)
    found = values.get(_state(other))
    beside = _observation(other, now, found) if found else None
    observation = _observation(target, now, values.get(_state(target), {}))
    plain = values.get(_state(target, series.PLAIN_POOL), {})
    routed = {klass: ClassWindow(**counts) for klass, counts in plain.items()}
    return replace(observation, canary=beside, plain=routed)


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
