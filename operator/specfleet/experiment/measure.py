"""The live experiment's verdict inputs (pure): each arm's per-class windows since it started
serving the sample, as telemetry reads them (`telemetry.arms.ArmsObservation`), as the
measurements `verdict.judge` takes; the progress towards the samples needed; and the
recommended arm as a merge patch of the SpecModel's spec.

Telemetry gives one percentile of latency, the p95: it stands for p50 and p99 too, so
`verdict.accepted_share` counts a class whose p95 misses its SLO as mostly late (pessimistic),
and one whose p95 meets it as all on time.

Throughput at SLO comes from the capacity phase. Without one, an arm's throughput is its
requests per second at concurrency one (1 / its mean request time on the sample): the same
basis for every arm, but it flatters speculation, whose gain is largest at low concurrency."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

import yaml

from specfleet.api.experiment import ArmClassRequests, ArmOverlay, Progress
from specfleet.api.verdict import ArmName, Latency
from specfleet.experiment.verdict import ArmMeasurement, ClassMeasurement
from specfleet.telemetry.arms import ArmsObservation
from specfleet.telemetry.model import ClassWindow, GreedyComparison


def arm_measurements(
    reading: ArmsObservation,
    classes: list[str],
    gpus_per_replica: Mapping[ArmName, int],
    throughput_at_slo: Mapping[ArmName, float] | None = None,
) -> list[ArmMeasurement]:
    """Every arm, every class (a class an arm has not served yet measures zero requests)."""
    return [
        arm_measurement(
            arm,
            {c: reading.arms.get(arm, {}).get(c, ClassWindow()) for c in classes},
            reading.greedy.get(arm, {}),
            gpus_per_replica[arm],
            (throughput_at_slo or {}).get(arm),
            reading.kv_cache_peak.get(arm),
        )
        for arm in ArmName
    ]


def arm_measurement(
    arm: ArmName,
    classes: Mapping[str, ClassWindow],
    greedy: Mapping[str, GreedyComparison],
    gpus_per_replica: int,
    throughput_at_slo: float | None = None,
    kv_cache_peak: float | None = None,
) -> ArmMeasurement:
    """`throughput_at_slo`: the capacity phase's; None for the arm's at concurrency one."""
    if throughput_at_slo is None:
        throughput_at_slo = throughput_at_concurrency_one(classes.values())
    return ArmMeasurement(
        arm=arm,
        gpus_per_replica=gpus_per_replica,
        throughput_at_slo=throughput_at_slo,
        kv_cache_peak=kv_cache_peak,
        classes={
            name: class_measurement(w, greedy.get(name, GreedyComparison()))
            for name, w in classes.items()
        },
    )


def throughput_at_concurrency_one(windows: Iterable[ClassWindow]) -> float:
    """Requests per second one request at a time would get: requests over their seconds."""
    found = list(windows)
    seconds = sum(w.request_seconds or 0.0 for w in found)
    requests = sum(w.requests or 0.0 for w in found)
    return requests / seconds if seconds > 0 else 0.0


def class_measurement(window: ClassWindow, greedy: GreedyComparison) -> ClassMeasurement:
    """The window with each part held to its whole, in whole counts: Prometheus extrapolates
    every counter's increase on its own, and a request's counters are not bumped at one
    instant, so a window can read four truncated answers of three requests. Its choices are its
    requests that did not fail (one each)."""
    requests = _count(window.requests)
    errors = min(_count(window.errors), requests)
    choices = requests - errors
    tool_calls_valid = _count(window.tool_calls_valid)
    structured_valid = _count(window.structured_valid)
    accepted, drafted = window.accepted_tokens, window.draft_tokens
    empty = window.empty_answers
    held = replace(
        window,
        requests=float(requests),
        errors=float(errors),
        choices=float(choices),
        truncated=float(min(_count(window.truncated), choices)),
        empty_answers=None if empty is None else float(min(_count(empty), choices)),
        tool_calls_valid=float(tool_calls_valid),
        tool_calls_invalid=float(_count(window.tool_calls_judged) - tool_calls_valid),
        structured_valid=float(structured_valid),
        structured_invalid=float(_count(window.structured_judged) - structured_valid),
        accepted_tokens=accepted if accepted is None or drafted is None else min(accepted, drafted),
    )
    compared = _count(greedy.compared)
    matches = min(_count(greedy.exact_matches), compared)
    return ClassMeasurement(
        held,
        ttft=_p95_only(window.p95_ttft_seconds),
        tpot=_p95_only(window.p95_tpot_seconds),
        greedy=GreedyComparison(compared=float(compared), exact_matches=float(matches)),
    )


def _count(value: float | None) -> int:
    """Counter increases are extrapolated by Prometheus: round them."""
    return round(value or 0.0)


def _p95_only(seconds: float | None) -> Latency:
    p95 = seconds or 0.0
    return Latency(p50_seconds=p95, p95_seconds=p95, p99_seconds=p95)


def progress(measured: list[ArmMeasurement], needed: int | None) -> Progress:
    """Requests per arm and class, and the share of `needed` of the one furthest from it
    (no share without `needed`: the experiment then runs for its duration)."""
    requests = [
        ArmClassRequests(arm=arm.arm, class_name=klass, requests=m.requests)
        for arm in measured
        for klass, m in arm.classes.items()
    ]
    if not needed:
        return Progress(requests=requests)
    least = min((r.requests for r in requests), default=0)
    return Progress(requests=requests, percent=min(100, least * 100 // needed))


def recommended_patch(overlay: ArmOverlay) -> str:
    """The JSON merge patch (as YAML) that makes the SpecModel's spec serve the arm: for Git,
    never applied by the operator. Empty (`{}`) when the spec already is the arm."""
    patch: dict[str, object] = {}
    if overlay.quantization is False:
        patch["quantization"] = None
    if overlay.speculative is False:
        patch["speculative"] = None
    if overlay.model_source is not None:
        patch["model"] = {"source": overlay.model_source}
    return yaml.safe_dump({"spec": patch} if patch else {}, sort_keys=True)
