"""The arms as overlays of a SpecModel's spec, offline (`simulation`) and live (`workloads`)
alike: `both` is the spec as it is, `quantized` drops `speculative`, `speculative` drops
`quantization`, `baseline` drops both."""

from __future__ import annotations

import copy
from typing import Any

from specfleet.api import SpecModel
from specfleet.api.experiment import ArmOverlay, ArmSpec, SpecExperimentSpec
from specfleet.api.spec import ClassSlo
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


def arms_of(experiment: SpecExperimentSpec) -> list[ArmSpec]:
    """The experiment's arms, the four defaults when it lists none."""
    if experiment.arms:
        return experiment.arms
    return [
        ArmSpec(name=arm, overlay=default_overlay(arm, experiment.unquantized_source))
        for arm in ArmName
    ]


def overlay_spec(spec: dict[str, Any], overlay: ArmOverlay) -> dict[str, Any]:
    """A SpecModel's spec (wire form) as the arm serves it."""
    out = copy.deepcopy(spec)
    if overlay.quantization is False:
        out.pop("quantization", None)
    if overlay.speculative is False:
        out.pop("speculative", None)
    if overlay.model_source is not None:
        out["model"]["source"] = overlay.model_source
    return out


def overlay(document: dict[str, Any], arm: ArmName) -> dict[str, Any]:
    """The SpecModel document as the default arm runs it."""
    return {**document, "spec": overlay_spec(document["spec"], default_overlay(arm))}


def class_slos(specmodel: SpecModel) -> dict[str, ClassSlo]:
    """The SLOs each arm is judged by, per class (a class without any: none to miss)."""
    return {c.name: c.slo or ClassSlo() for c in specmodel.spec.classes}


def gpus_per_replica(specmodel: SpecModel) -> int:
    return specmodel.spec.pod.gpu.count or specmodel.spec.model.tensor_parallel_size
