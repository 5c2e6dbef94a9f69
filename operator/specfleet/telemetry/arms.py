"""Reads a running experiment's arms from Prometheus: each arm's classes as its own gateway
measured them (the fleet's queries, grouped by arm), and the fleet gateways' comparison of each
arm's greedy outputs with the baseline arm's. One batch per experiment per measurement; sync,
run it in a thread. Prometheus down makes the reading blind, never zero."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from specfleet import series
from specfleet.telemetry.model import ClassWindow, GreedyComparison
from specfleet.telemetry.reader import Grouping, QueryFailed, TelemetryReader, increase_query


@dataclass(frozen=True)
class ArmsTarget:
    namespace: str
    experiment: str
    specmodel: str
    """The SpecModel whose fleet mirrors its traffic to the arms."""
    window_seconds: int
    """Since the arms started serving the sample."""
    until: datetime | None = None
    """The sample's end, once the arms serve a load test instead; None: now."""


@dataclass(frozen=True)
class ArmsObservation:
    at: datetime
    window_seconds: int
    arms: Mapping[str, Mapping[str, ClassWindow]] = field(default_factory=dict)
    """arm -> class -> its window."""
    greedy: Mapping[str, Mapping[str, GreedyComparison]] = field(default_factory=dict)
    """arm -> class -> the comparison with the baseline's outputs."""
    kv_cache_peak: Mapping[str, float] = field(default_factory=dict)
    """arm -> its engines' highest KV-cache usage (0..1); absent where none is exported."""
    blind: str | None = None
    """Why nothing could be read; None when the reading holds."""


def read_arms(reader: TelemetryReader, target: ArmsTarget, now: datetime) -> ArmsObservation:
    window = target.window_seconds
    arms = _selector(target, series.EXPERIMENT, target.experiment)
    try:
        grouped = reader.read_grouped(Grouping((series.ARM,), arms), window, target.until)
        compared = _greedy(reader, series.MIRROR_COMPARED, target)
        matches = _greedy(reader, series.MIRROR_EXACT_MATCHES, target)
        peaks = _kv_cache_peaks(reader, target, arms)
    except QueryFailed as exc:
        return ArmsObservation(now, window, blind=str(exc))
    return ArmsObservation(
        at=now,
        window_seconds=window,
        arms={
            arm: {klass: ClassWindow(**found) for klass, found in classes.items()}
            for (arm,), classes in grouped.items()
        },
        greedy=_comparisons(compared, matches),
        kv_cache_peak={arm: peak for (arm,), peak in peaks.items() if 0.0 <= peak <= 1.0},
    )


def _comparisons(
    compared: dict[tuple[str, ...], float], matches: dict[tuple[str, ...], float]
) -> dict[str, dict[str, GreedyComparison]]:
    """arm -> class -> its greedy outputs compared with the baseline's, and matching it."""
    out: dict[str, dict[str, GreedyComparison]] = {}
    for (arm, klass), n in compared.items():
        out.setdefault(arm, {})[klass] = GreedyComparison(n, matches.get((arm, klass), 0.0))
    return out


def _selector(target: ArmsTarget, label: str, value: str) -> str:
    return f'{{{series.NAMESPACE}="{target.namespace}",{label}="{value}"}}'


def _greedy(
    reader: TelemetryReader, metric: str, target: ArmsTarget
) -> dict[tuple[str, ...], float]:
    """(arm, class) -> the fleet's counter's increase over the window."""
    fleet = _selector(target, series.SPECMODEL, target.specmodel)
    template = increase_query(metric, f"{series.ARM}, {series.CLASS}", fleet)
    query = template.format(w=f"{target.window_seconds}s")
    return _values(reader.query(query, target.until), (series.ARM, series.CLASS))


def _kv_cache_peaks(
    reader: TelemetryReader, target: ArmsTarget, arms: str
) -> dict[tuple[str, ...], float]:
    """(arm,) -> the highest KV-cache usage any of its engines reported over the window."""
    usage = f"{series.VLLM_KV_CACHE_USAGE}{arms}[{target.window_seconds}s]"
    query = f"max by ({series.ARM}) (max_over_time({usage}))"
    return _values(reader.query(query, target.until), (series.ARM,))


def _values(rows: list[dict[str, Any]], labels: tuple[str, ...]) -> dict[tuple[str, ...], float]:
    """Each row's value by its labels' values; NaN (nothing in the window) left out."""
    out = {}
    for row in rows:
        value = float(row["value"][1])
        if value == value:
            out[tuple(row["metric"].get(label, "") for label in labels)] = value
    return out
