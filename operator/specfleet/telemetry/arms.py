"""Reads a running experiment's arms from Prometheus: each arm's classes as its own gateway
measured them (the fleet's queries, grouped by arm), and the fleet gateways' comparison of each
arm's greedy outputs with the baseline arm's. One batch per experiment per measurement; sync,
run it in a thread. Prometheus down makes the reading blind, never zero."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from specfleet import series
from specfleet.telemetry.model import ClassWindow
from specfleet.telemetry.reader import Grouping, QueryFailed, TelemetryReader


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
class GreedyComparison:
    """Greedy requests whose outputs of one arm were compared with the baseline arm's."""

    compared: float = 0.0
    exact_matches: float = 0.0


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
    arms = Grouping((series.ARM,), _selector(series.EXPERIMENT, target.experiment, target))
    try:
        grouped = reader.read_grouped(arms, window, target.until)
        compared = _greedy(reader, series.MIRROR_COMPARED, target)
        matches = _greedy(reader, series.MIRROR_EXACT_MATCHES, target)
        peaks = _kv_cache_peaks(reader, target)
    except QueryFailed as exc:
        return ArmsObservation(now, window, blind=str(exc))
    return ArmsObservation(
        at=now,
        window_seconds=window,
        arms={
            arm: {klass: ClassWindow(**found) for klass, found in classes.items()}
            for (arm,), classes in grouped.items()
        },
        greedy={
            arm: {
                klass: GreedyComparison(n, matches.get(arm, {}).get(klass, 0.0))
                for klass, n in classes.items()
            }
            for arm, classes in compared.items()
        },
        kv_cache_peak=peaks,
    )


def _selector(label: str, value: str, target: ArmsTarget) -> str:
    return f'{{{series.NAMESPACE}="{target.namespace}",{label}="{value}"}}'


def _greedy(
    reader: TelemetryReader, metric: str, target: ArmsTarget
) -> dict[str, dict[str, float]]:
    """arm -> class -> the fleet's counter's increase over the window."""
    selector = _selector(series.SPECMODEL, target.specmodel, target)
    query = (
        f"sum by ({series.ARM}, {series.CLASS}) "
        f"(increase({metric}_total{selector}[{target.window_seconds}s]))"
    )
    rows = reader.query(query, target.until)
    out: dict[str, dict[str, float]] = {}
    for row in rows:
        value = float(row["value"][1])
        if value == value:  # not NaN
            metric_labels = row["metric"]
            arm, klass = metric_labels.get(series.ARM, ""), metric_labels.get(series.CLASS, "")
            out.setdefault(arm, {})[klass] = value
    return out


def _kv_cache_peaks(reader: TelemetryReader, target: ArmsTarget) -> dict[str, float]:
    """arm -> the highest KV-cache usage any of its engines reported over the window."""
    selector = _selector(series.EXPERIMENT, target.experiment, target)
    query = (
        f"max by ({series.ARM}) "
        f"(max_over_time({series.VLLM_KV_CACHE_USAGE}{selector}[{target.window_seconds}s]))"
    )
    peaks = {}
    for row in reader.query(query, target.until):
        value = float(row["value"][1])
        if 0.0 <= value <= 1.0:  # also not NaN
            peaks[row["metric"].get(series.ARM, "")] = value
    return peaks
