"""An experiment's verdict as data: the arms, the table per class and overall, the exclusions
and the recommendation. `experiment.verdict.judge` decides it; SpecExperiment's status holds it,
the report draws it."""

from __future__ import annotations

from enum import StrEnum
from typing import Self

from pydantic import Field, model_validator

from specfleet.api.base import ApiModel

NO_THROUGHPUT = "throughputAtSlo"
"""The signal of an arm that misses its latency SLOs at any load."""


class ArmName(StrEnum):
    BASELINE = "baseline"
    QUANTIZED = "quantized"
    SPECULATIVE = "speculative"
    BOTH = "both"


class Outcome(StrEnum):
    RECOMMENDED = "recommended"
    INCONCLUSIVE = "inconclusive"
    NO_ARM = "noArm"
    """Every arm, the baseline too, misses a latency SLO or the baseline's quality."""


class Latency(ApiModel):
    p50_seconds: float = Field(ge=0)
    p95_seconds: float = Field(ge=0)
    p99_seconds: float = Field(ge=0)

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if not self.p50_seconds <= self.p95_seconds <= self.p99_seconds:
            raise ValueError("percentiles must be ordered: p50Seconds <= p95Seconds <= p99Seconds")
        return self


class Exclusion(ApiModel):
    """Why an arm cannot be recommended: one class and signal, both sides' values and samples."""

    arm: ArmName
    class_name: str = Field(alias="class")
    signal: str
    value: float
    limit: float
    baseline: float | None = None
    samples: float
    baseline_samples: float | None = None

    def words(self) -> str:
        if self.signal == NO_THROUGHPUT:
            return f"{self.arm}: no load keeps every class within its latency SLOs"
        versus = "" if self.baseline is None else f" vs baseline {self.baseline:.3f}"
        counts = f"n={self.samples:.0f}"
        if self.baseline_samples is not None:
            counts += f" vs {self.baseline_samples:.0f}"
        return (
            f"{self.arm}: {self.class_name} {self.signal} {self.value:.3f}{versus}, "
            f"limit {self.limit:.3f} ({counts})"
        )


class ArmRow(ApiModel):
    """One arm in one class's table (or overall: latency percentiles do not pool, so none)."""

    arm: ArmName
    requests: int
    ttft: Latency | None = None
    tpot: Latency | None = None
    acceptance_rate: float | None = None
    tool_call_validity: float | None = None
    structured_output_validity: float | None = None
    truncation_rate: float | None = None
    empty_answer_rate: float | None = None
    error_rate: float | None = None
    greedy_agreement: float | None = None
    throughput_at_slo: float
    accepted_share: float
    cost_per_accepted_answer: float | None = None
    """None: the arm serves no accepted answer at any load inside its SLOs."""
    kv_cache_headroom: float | None = Field(
        default=None,
        description="1 - the arm's peak KV-cache usage over the sample (the overall row): "
        "memory a quantized target saved, or draft machinery ate.",
    )


class ClassTable(ApiModel):
    name: str
    rows: list[ArmRow]


class ExperimentVerdict(ApiModel):
    outcome: Outcome
    recommendation: ArmName | None = None
    reason: str
    gpu_hour_price: float = Field(gt=0)
    min_samples: int = Field(ge=1)
    classes: list[ClassTable]
    overall: list[ArmRow]
    exclusions: list[Exclusion] = Field(default_factory=list)
