"""The `SpecModel` object and the slice of its spec that makes a revision."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from specfleet.api.base import API_VERSION, KIND, MAX_NAME_LENGTH, ApiModel
from specfleet.api.spec import (
    EngineSpec,
    ModelSpec,
    QuantizationSpec,
    SpecModelSpec,
    SpeculativeSpec,
)
from specfleet.api.status import SpecModelStatus

KILL_SWITCH_ANNOTATION = "specfleet.dev/kill-switch"
CLASSES_OFF_ANNOTATION = "specfleet.dev/classes-off"
"""Comma-separated classes served without speculation (wins over spec.guard.classesOff; empty:
none)."""
RETRY_ANNOTATION = "specfleet.dev/retry"
ROLLOUT_ANNOTATION = "specfleet.dev/rollout"
"""`promote` or `abort`: ends the canary rollout in progress (acts when its value changes)."""


class ObjectMeta(BaseModel):
    """The metadata fields specfleet reads; everything else is kept as it is."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    name: str = Field(min_length=1, max_length=MAX_NAME_LENGTH)
    namespace: str = "default"
    uid: str | None = None
    generation: int | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class SpecModel(ApiModel):
    api_version: str = Field(default=API_VERSION, pattern=f"^{API_VERSION}$")
    kind: str = Field(default=KIND, pattern=f"^{KIND}$")
    metadata: ObjectMeta
    spec: SpecModelSpec
    status: SpecModelStatus | None = None

    def engine_config(self) -> EngineConfig:
        return EngineConfig(
            engine=self.spec.engine,
            model=self.spec.model,
            quantization=self.spec.quantization,
            speculative=self.spec.speculative,
        )

    def served_name(self) -> str:
        return self.spec.model.served_name or self.metadata.name

    def classes_off(self) -> tuple[list[str], bool]:
        """The classes forced off speculation, and whether the annotation (over the spec)
        says so."""
        annotated = self.metadata.annotations.get(CLASSES_OFF_ANNOTATION)
        if annotated is None:
            return list(self.spec.guard.classes_off or []), False
        return [n for n in (part.strip() for part in annotated.split(",")) if n], True

    def unknown_classes_off(self) -> list[str]:
        """The classes the override names that the spec does not declare."""
        known = {c.name for c in self.spec.classes}
        return [name for name in self.classes_off()[0] if name not in known]


class EngineConfig(ApiModel):
    """Everything that decides how the engine runs. A distinct EngineConfig is a revision; a
    rollback serves an older one while the rest of the spec (classes, guard, pods) stays."""

    engine: EngineSpec
    model: ModelSpec
    quantization: QuantizationSpec
    speculative: SpeculativeSpec | None = None

    def canonical(self) -> dict[str, Any]:
        """Wire form with defaults filled in, so omitted and explicit defaults compare equal.
        The guard's speedup-model knobs and the checkpoint's declaration are no engine settings:
        changing them must not roll pods."""
        return self.model_dump(
            by_alias=True,
            exclude_none=True,
            mode="json",
            exclude={
                "speculative": {"draft_cost", "step_overhead", "per_token_compute"},
                "quantization": {"pre_quantized"},
            },
        )
