"""The arms as overlays of a SpecModel's spec, offline (`simulation`) and live (`workloads`)
alike: `both` is the spec as it is, `quantized` drops `speculative`, `speculative` drops
`quantization`, `baseline` drops both."""

from __future__ import annotations

import copy
from typing import Any

from specfleet.api import SpecModel
from specfleet.api.experiment import ArmOverlay, ArmSpec, SpecExperimentSpec
from specfleet.api.spec import ClassSlo, WeightsFormat
from specfleet.api.validation import FieldError
from specfleet.api.verdict import ArmName

QUANTIZED = {ArmName.QUANTIZED, ArmName.BOTH}
SPECULATIVE = {ArmName.SPECULATIVE, ArmName.BOTH}


def default_overlay(arm: ArmName, unquantized_source: str | None = None) -> ArmOverlay:
    quantized = arm in QUANTIZED
    return ArmOverlay(
        quantization=quantized,
        speculative=arm in SPECULATIVE,
        model_source=None if quantized else unquantized_source,
    )


def default_arms(unquantized_source: str | None = None) -> list[ArmSpec]:
    """The four default arms; those without quantization serve `unquantized_source` if given."""
    return [ArmSpec(name=arm, overlay=default_overlay(arm, unquantized_source)) for arm in ArmName]


def arms_of(experiment: SpecExperimentSpec) -> list[ArmSpec]:
    """The experiment's arms, the four defaults when it lists none."""
    return experiment.arms or default_arms(experiment.unquantized_source)


def arm_errors(specmodel: SpecModel, arm: ArmSpec) -> list[FieldError]:
    """What the overlay asks of the SpecModel that it lacks: the live operator refuses such an
    arm, and the simulation will not measure it."""
    spec, overlay = specmodel.spec, arm.overlay
    errors = []
    if overlay.speculative and spec.speculative is None:
        errors.append(
            FieldError(
                f"specmodels/{specmodel.metadata.name}: spec.speculative",
                f"arm {arm.name} speculates but the SpecModel has no speculative settings; "
                "add them to the SpecModel (the arms are its spec with and without them)",
            )
        )
    if overlay.quantization and spec.quantization.weights == WeightsFormat.NONE:
        errors.append(
            FieldError(
                f"specmodels/{specmodel.metadata.name}: spec.quantization",
                f"arm {arm.name} is quantized but the SpecModel serves unquantized weights; "
                "set its quantization (the arms are its spec with and without it)",
            )
        )
    prequantized = spec.quantization.weights != WeightsFormat.NONE and not spec.quantization.online
    if overlay.quantization is False and prequantized and overlay.model_source is None:
        errors.append(
            FieldError(
                "spec.unquantizedSource",
                f"arm {arm.name} drops quantization but {spec.model.source} is a pre-quantized "
                "checkpoint; give the unquantized one in spec.unquantizedSource (or in this "
                "arm's overlay.modelSource)",
            )
        )
    return errors


def overlay_spec(spec: dict[str, Any], overlay: ArmOverlay) -> dict[str, Any]:
    """A SpecModel's spec (wire form) as the arm serves it."""
    out = copy.deepcopy(spec)
    if overlay.quantization is False:
        out.pop("quantization", None)
    if overlay.speculative is False:
        out.pop("speculative", None)
        for prompt_class in out.get("classes", []):
            prompt_class.get("slo", {}).pop("minAcceptanceRate", None)  # nothing is drafted
    if overlay.model_source is not None:
        out["model"]["source"] = overlay.model_source
    return out


def arm_document(document: dict[str, Any], arm: ArmSpec) -> dict[str, Any]:
    """The SpecModel document as the arm runs it."""
    return {**document, "spec": overlay_spec(document["spec"], arm.overlay)}


def class_slos(specmodel: SpecModel) -> dict[str, ClassSlo]:
    """The SLOs each arm is judged by, per class (a class without any: none to miss)."""
    return {c.name: c.slo or ClassSlo() for c in specmodel.spec.classes}


def gpus_per_replica(specmodel: SpecModel) -> int:
    return specmodel.spec.pod.gpu.count or specmodel.spec.model.tensor_parallel_size
