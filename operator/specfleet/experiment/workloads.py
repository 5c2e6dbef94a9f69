"""Each arm of a SpecExperiment as its own small workload (pure): the SpecModel's spec with the
arm's overlay, rendered by `render` as a SpecModel named `<experiment>-<arm>` would be, with a
Service of its own and the gateway sidecar, owned by the experiment. The pods carry
`app.kubernetes.io/name: specfleet-engine-arm` and the experiment's and arm's names, never
`app.kubernetes.io/instance`: no SpecModel's Deployment selector, Service or
PodDisruptionBudget matches them.

An arm serves the SpecModel's served name (mirrored requests name it), drops the rollout
settings (an arm is one fixed revision) and runs the experiment's replicas."""

from __future__ import annotations

from typing import Any

from specfleet.api import SpecModel, parse_specmodel
from specfleet.api.experiment import ArmSpec, SpecExperiment
from specfleet.api.validation import FieldError, InvalidSpecModel
from specfleet.experiment.arms import arm_errors, arms_of, overlay_spec
from specfleet.render import ArmOf, Manifest, RenderSettings, render_arm
from specfleet.render.labels import owner_reference


class InvalidArms(ValueError):
    """The experiment's arms cannot run on this SpecModel; every error names its field."""

    def __init__(self, errors: list[FieldError]) -> None:
        self.errors = errors
        super().__init__("; ".join(str(e) for e in errors))


def arm_name(experiment: str, arm: str) -> str:
    return f"{experiment}-{arm}"


def arm_url(experiment: SpecExperiment, arm: str) -> str:
    """The arm's own gateway, through its Service."""
    service = arm_name(experiment.metadata.name, arm)
    return f"http://{service}.{experiment.metadata.namespace}.svc:80"


def render_arms(
    specmodel: SpecModel, experiment: SpecExperiment, settings: RenderSettings | None = None
) -> list[Manifest]:
    """Every arm's Deployment, ConfigMaps and Service; InvalidArms when an arm cannot run."""
    arms = arms_of(experiment.spec)
    errors = [e for arm in arms for e in arm_errors(specmodel, arm)]
    if errors:
        raise InvalidArms(errors)
    return [
        manifest
        for arm in arms
        for manifest in render_arm(
            arm_specmodel(specmodel, experiment, arm),
            ArmOf(experiment.metadata.name, arm.name, owner_reference(experiment)),
            settings,
        )
    ]


def arm_specmodel(specmodel: SpecModel, experiment: SpecExperiment, arm: ArmSpec) -> SpecModel:
    """The SpecModel as the arm serves it, named `<experiment>-<arm>`."""
    spec = overlay_spec(specmodel.spec.to_wire(), arm.overlay)
    spec["model"]["servedName"] = specmodel.served_name()
    spec["pod"] = {**spec.get("pod", {}), "replicas": experiment.spec.replicas}
    spec.pop("rollout", None)
    document: dict[str, Any] = {
        "metadata": {
            "name": arm_name(experiment.metadata.name, arm.name),
            "namespace": experiment.metadata.namespace,
        },
        "spec": spec,
    }
    try:
        return parse_specmodel(document)
    except InvalidSpecModel as exc:
        raise InvalidArms(
            [FieldError(f"arm {arm.name}: {e.path}", e.message) for e in exc.errors]
        ) from None
