"""An arm's throughput at SLO from a load test (pure): the load test's concurrency steps, each
with the throughput it achieved and each class's p95 latencies, and the highest throughput
reached before any class left its latency SLOs.

Steps are read in rising concurrency and the first step outside the SLOs ends the search: a
later step back inside them is noise of a small sample, not capacity. A class's errors count as
its slowest requests (the parser's p95s already do): past the error budget its p95 is an error.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pydantic import Field

from specfleet import signals
from specfleet.api.base import ApiModel
from specfleet.api.spec import ClassSlo
from specfleet.experiment.verdict import latency_misses

ERROR_BUDGET = 0.05
"""The share of a class's requests that may fail before its p95 is itself a failure."""
TERMINATION_MESSAGE_BYTES = 4096
"""What a container's termination message holds at most."""
ERROR_RATE = signals.ERROR_RATE.name
UNMEASURED = "requests"
"""The signal of a class that has no request in a step: nothing says it is inside."""


class ClassStep(ApiModel):
    """One class's requests in one concurrency step."""

    requests: int = Field(ge=0, description="Requests of the class that succeeded.")
    errors: int = Field(default=0, ge=0, description="Requests of the class that failed.")
    p95_ttft_seconds: float = Field(ge=0, description="Counting errors as the slowest.")
    p95_tpot_seconds: float = Field(ge=0, description="Counting errors as the slowest.")


class ConcurrencyStep(ApiModel):
    concurrency: int = Field(ge=1, description="Requests in flight throughout the step.")
    throughput: float = Field(ge=0, description="Successful requests/s the step achieved.")
    classes: dict[str, ClassStep]


class Miss(ApiModel):
    """One class outside its SLOs at one step: what, by how much."""

    concurrency: int
    class_name: str = Field(alias="class")
    signal: str
    value: float
    limit: float


class Capacity(ApiModel):
    """Compact enough for a container's termination message."""

    throughput_at_slo: float = Field(
        ge=0, description="Requests/s at the best step before any class left its SLOs; 0: none."
    )
    concurrency: int | None = Field(default=None, description="The step that achieved it.")
    misses: list[Miss] = Field(
        default_factory=list,
        description="What the first step outside the SLOs missed; empty when every step was in.",
    )
    omitted_misses: int = Field(default=0, ge=0, description="Misses left out to fit.")


class CapacityReport(Capacity):
    steps: list[ConcurrencyStep]


def capacity(steps: Sequence[ConcurrencyStep], slos: Mapping[str, ClassSlo]) -> CapacityReport:
    """Every class in `slos` is judged at every step; one absent from a step misses it."""
    ordered = sorted(steps, key=lambda step: step.concurrency)
    best: ConcurrencyStep | None = None
    misses: list[Miss] = []
    for step in ordered:
        misses = step_misses(step, slos)
        if misses:
            break
        if best is None or step.throughput > best.throughput:
            best = step
    return CapacityReport(
        throughput_at_slo=best.throughput if best else 0.0,
        concurrency=best.concurrency if best else None,
        misses=misses,
        steps=ordered,
    )


def step_misses(step: ConcurrencyStep, slos: Mapping[str, ClassSlo]) -> list[Miss]:
    return [
        Miss(concurrency=step.concurrency, class_name=name, signal=signal, value=value, limit=limit)
        for name, slo in slos.items()
        for signal, value, limit in _class_misses(step.classes.get(name), slo)
    ]


def _class_misses(measured: ClassStep | None, slo: ClassSlo) -> Sequence[tuple[str, float, float]]:
    if measured is None or measured.requests + measured.errors == 0:
        return [(UNMEASURED, 0.0, 1.0)]
    error_rate = measured.errors / (measured.requests + measured.errors)
    if error_rate > ERROR_BUDGET:
        return [(ERROR_RATE, error_rate, ERROR_BUDGET)]
    return latency_misses(measured.p95_ttft_seconds, measured.p95_tpot_seconds, slo)


def concurrency_steps(max_concurrency: int, steps: int) -> list[int]:
    """Evenly spaced up to the maximum, rounded, each at least one request in flight."""
    return sorted({max(1, round(max_concurrency * i / steps)) for i in range(1, steps + 1)})


def termination_message(result: Capacity, limit: int = TERMINATION_MESSAGE_BYTES) -> str:
    """The result without its steps, as JSON within `limit` bytes: the last misses dropped
    (and counted) while it is longer."""
    kept = len(result.misses)
    while True:
        compact = Capacity(
            throughput_at_slo=result.throughput_at_slo,
            concurrency=result.concurrency,
            misses=result.misses[:kept],
            omitted_misses=result.omitted_misses + len(result.misses) - kept,
        )
        text = compact.model_dump_json(by_alias=True)
        if len(text.encode()) <= limit or not kept:
            return text
        kept -= 1
