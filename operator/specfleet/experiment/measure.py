"""The live experiment's verdict inputs (pure): each arm's per-class windows, as telemetry reads
them (`telemetry.model.Observation`), as the measurements `verdict.judge` takes; the progress
towards the samples needed; and the recommended arm as a merge patch of the SpecModel's spec.

Telemetry gives one percentile of latency, the p95: it stands for p50 and p99 too, so
`verdict.accepted_share` counts a class whose p95 misses its SLO as mostly late (pessimistic),
and one whose p95 meets it as all on time. Greedy agreement is not measured live yet."""

from __future__ import annotations

from collections.abc import Mapping

import yaml

from specfleet.api.experiment import ArmClassRequests, ArmOverlay, Progress
from specfleet.experiment.verdict import ArmMeasurement, ArmName, ClassMeasurement, Latency
from specfleet.telemetry.model import ClassWindow, Observation


def arm_measurement(
    arm: ArmName, observation: Observation, gpus_per_replica: int, throughput_at_slo: float
) -> ArmMeasurement:
    """`throughput_at_slo` comes from the capacity phase: the sample's windows cannot tell it."""
    return ArmMeasurement(
        arm=arm,
        gpus_per_replica=gpus_per_replica,
        throughput_at_slo=throughput_at_slo,
        classes={name: class_measurement(w) for name, w in observation.classes.items()},
    )


def class_measurement(window: ClassWindow) -> ClassMeasurement:
    errors = _count(window.errors)
    return ClassMeasurement(
        requests=_count(window.requests),
        errors=errors,
        truncated=_count(window.truncated),
        tool_calls_valid=_count(window.tool_calls_valid),
        tool_calls_judged=_count(window.tool_calls_judged),
        structured_valid=_count(window.structured_valid),
        structured_judged=_count(window.structured_judged),
        ttft=_p95_only(window.p95_ttft_seconds),
        tpot=_p95_only(window.p95_tpot_seconds),
        acceptance_rate=window.acceptance_rate,
    )


def _count(value: float | None) -> int:
    """Counter increases are extrapolated by Prometheus: round them."""
    return round(value or 0.0)


def _p95_only(seconds: float | None) -> Latency:
    p95 = seconds or 0.0
    return Latency(p50_seconds=p95, p95_seconds=p95, p99_seconds=p95)


def progress(
    observations: Mapping[ArmName, Observation], classes: list[str], needed: int
) -> Progress:
    """Requests per arm and class, and the share of `needed` of the one furthest from it."""
    requests = [
        ArmClassRequests(
            arm=arm,
            class_name=klass,
            requests=_count(observations[arm].classes.get(klass, ClassWindow()).requests),
        )
        for arm in observations
        for klass in classes
    ]
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
