"""The `SpecExperiment` API: a SpecModel's four arms served side by side on a sample of its live
traffic, judged by `experiment.verdict.judge`. The experiment never writes the SpecModel's spec:
its status carries a patch for Git."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import ConfigDict, Field

from specfleet.api.base import API_VERSION, MAX_NAME_LENGTH, ApiModel, cel
from specfleet.api.model import ObjectMeta
from specfleet.api.status import Condition
from specfleet.api.verdict import ArmName, ExperimentVerdict

EXPERIMENT_KIND = "SpecExperiment"
EXPERIMENT_PLURAL = "specexperiments"
LONGEST_ARM = max(len(arm) for arm in ArmName)
MAX_EXPERIMENT_NAME_LENGTH = MAX_NAME_LENGTH - len("-") - LONGEST_ARM
"""Each arm is rendered as the SpecModel `<experiment>-<arm>`, held to a SpecModel's name."""
DEFAULT_SHARE = 0.05


class ArmOverlay(ApiModel):
    """What an arm changes of the SpecModel's spec; a field left out keeps the spec's."""

    quantization: bool | None = Field(
        default=None,
        description="true: keep the spec's `quantization`; false: serve unquantized weights "
        "(`quantization` dropped).",
    )
    speculative: bool | None = Field(
        default=None,
        description="true: keep the spec's `speculative`; false: serve without speculation.",
    )
    model_source: str | None = Field(
        default=None,
        min_length=1,
        description="`model.source` of this arm: the unquantized checkpoint an arm without "
        "quantization serves when the spec's is pre-quantized.",
    )


class ArmSpec(ApiModel):
    name: ArmName = Field(description="The arm: `baseline`, `quantized`, `speculative` or `both`.")
    overlay: ArmOverlay = Field(
        default_factory=ArmOverlay, description="What this arm changes of the SpecModel's spec."
    )


class SpecModelRef(ApiModel):
    name: str = Field(min_length=1, description="The SpecModel's name, in this namespace.")


Share = Annotated[float, Field(gt=0.0, le=1.0)]


class SampleSpec(ApiModel):
    """Which share of each class's live requests every arm receives."""

    share: float = Field(
        default=DEFAULT_SHARE,
        gt=0.0,
        le=1.0,
        description="Share of each class's live requests mirrored to every arm, in (0, 1].",
    )
    classes: dict[str, Share] | None = Field(
        default=None,
        description="Per-class shares, in (0, 1], overriding `share` (rare classes need more).",
    )

    def of(self, klass: str) -> float:
        return (self.classes or {}).get(klass, self.share)


class CapacitySpec(ApiModel):
    """A load test of each arm measuring its throughput at SLO on its own GPUs."""

    max_concurrency: int = Field(
        ge=1, le=4096, description="Concurrent requests of the load test's last step."
    )
    steps: int = Field(default=8, ge=1, le=64, description="Concurrency steps up to the maximum.")


class SpecExperimentSpec(ApiModel):
    """A SpecModel's arms on a sample of its live traffic."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "has(self.durationSeconds) || has(self.minRequestsPerClass)",
                    "set durationSeconds, minRequestsPerClass or both: the experiment must know "
                    "when it has seen enough",
                ),
            ]
        }
    )

    spec_model_ref: SpecModelRef = Field(description="The SpecModel whose arms are compared.")
    unquantized_source: str | None = Field(
        default=None,
        min_length=1,
        description="`model.source` of the default arms without quantization (baseline, "
        "speculative) when the SpecModel serves a pre-quantized checkpoint; given once here.",
    )
    arms: list[ArmSpec] = Field(
        default_factory=list,
        max_length=len(ArmName),
        description="The four arms, each once, as overlays of the SpecModel's spec. Empty: "
        "both is the spec, quantized drops speculative, speculative drops quantization, "
        "baseline drops both.",
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["name"],
            "x-kubernetes-validations": [
                cel(
                    f"size(self) == 0 || size(self) == {len(ArmName)}",
                    "arms: list all four (baseline, quantized, speculative, both) or none for "
                    "the defaults; the verdict compares the four",
                )
            ],
        },
    )
    sample: SampleSpec = Field(
        default_factory=SampleSpec, description="The share of each class's live requests."
    )
    duration_seconds: int | None = Field(
        default=None, ge=60, le=30 * 86400, description="Conclude after this long at the latest."
    )
    min_requests_per_class: int | None = Field(
        default=None,
        ge=1,
        le=1_000_000,
        description="Conclude once every arm served this many requests of every class.",
    )
    capacity: CapacitySpec | None = Field(
        default=None, description="A load test of each arm; omit to skip the capacity phase."
    )
    gpu_hour_price: float = Field(gt=0.0, le=1000.0, description="Price of one GPU hour.")
    replicas: int = Field(default=1, ge=1, le=16, description="Pods of each arm.")


class ExperimentPhase(StrEnum):
    PENDING = "Pending"
    RUNNING = "Running"
    CAPACITY = "Capacity"
    CONCLUDED = "Concluded"
    FAILED = "Failed"


class ArmStatus(ApiModel):
    name: ArmName = Field(description="The arm.")
    workload: str = Field(description="Its Deployment and Service: `<experiment>-<arm>`.")
    ready_replicas: int = Field(default=0, ge=0, description="Its pods ready.")
    replicas: int = Field(default=0, ge=0, description="Its pods wanted.")


class ArmClassRequests(ApiModel):
    arm: ArmName = Field(description="The arm.")
    class_name: str = Field(alias="class", description="The prompt class.")
    requests: int = Field(ge=0, description="Requests the arm served of the class so far.")


class Progress(ApiModel):
    requests: list[ArmClassRequests] = Field(
        default_factory=list, description="Requests per arm and class so far."
    )
    percent: int = Field(
        default=0,
        ge=0,
        le=100,
        description="Share of the samples needed, of the arm and class furthest from them.",
    )


class ArmCapacity(ApiModel):
    name: ArmName = Field(description="The arm.")
    throughput_at_slo: float | None = Field(
        default=None, ge=0, description="Its load test's requests/s at SLO; absent if it failed."
    )
    concurrency: int | None = Field(default=None, description="The step that achieved it.")
    failed: str | None = Field(
        default=None,
        description="Why its load test gave no result: its throughput at SLO is then the one "
        "at concurrency one, measured on the sample.",
    )


class CapacityStatus(ApiModel):
    started_at: str = Field(
        description="When the sample was complete: the verdict measures the arms up to then."
    )
    sampled_at: str | None = Field(
        default=None,
        description="When the sample of prompts was taken from the fleet's gateway and the load "
        "tests began (the fleet mirrors until then).",
    )
    requests: int = Field(default=0, ge=0, description="Prompts in the sample.")
    classes: list[str] = Field(
        default_factory=list, description="The classes the sample holds: those load-tested."
    )
    arms: list[ArmCapacity] = Field(
        default_factory=list, description="Each arm's result, once its load test ended."
    )


class SpecExperimentStatus(ApiModel):
    observed_generation: int | None = Field(
        default=None, description="The spec generation this status describes."
    )
    phase: ExperimentPhase = Field(
        default=ExperimentPhase.PENDING,
        description="Pending until every arm is ready, Running on the sample, Capacity while "
        "the arms are load-tested (with `spec.capacity`), Concluded, or Failed.",
    )
    conditions: list[Condition] = Field(default_factory=list, description="Conditions.")
    arms: list[ArmStatus] = Field(default_factory=list, description="Each arm's workload.")
    started_at: str | None = Field(
        default=None,
        description="When every arm was first ready: the sample is measured from then on.",
    )
    progress: Progress = Field(default_factory=Progress, description="Samples so far.")
    leading_arm: ArmName | None = Field(
        default=None, description="The arm the verdict recommends on the samples so far."
    )
    verdict: ExperimentVerdict | None = Field(
        default=None, description="The table per class and overall, exclusions, recommendation."
    )
    recommended_patch: str | None = Field(
        default=None,
        description="A JSON merge patch (YAML) of the SpecModel's spec serving the recommended "
        "arm, to commit to Git; the operator never applies it.",
    )
    capacity: CapacityStatus | None = Field(
        default=None, description="The capacity phase, once the sample is complete."
    )


class SpecExperiment(ApiModel):
    api_version: str = Field(default=API_VERSION, pattern=f"^{API_VERSION}$")
    kind: str = Field(default=EXPERIMENT_KIND, pattern=f"^{EXPERIMENT_KIND}$")
    metadata: ObjectMeta
    spec: SpecExperimentSpec
    status: SpecExperimentStatus | None = None
