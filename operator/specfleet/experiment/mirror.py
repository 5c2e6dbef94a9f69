"""What the fleet's gateways mirror while an experiment runs: a sample of each class's requests
to every arm's own gateway Service. Pure: the SpecModel's reconcile renders it into the fleet's
gateway config, so mirroring starts once the arms are ready and stops when the experiment does."""

from __future__ import annotations

from specfleet.api import SpecModel
from specfleet.api.experiment import ExperimentPhase, SpecExperiment
from specfleet.api.gateway import Mirror, MirrorArm
from specfleet.experiment.arms import arms_of
from specfleet.experiment.verdict import ArmName
from specfleet.experiment.workloads import arm_url


def mirror_of(experiments: list[SpecExperiment], specmodel: SpecModel) -> Mirror | None:
    """The mirror of the first running experiment on `specmodel` by name (one at a time: a
    request is mirrored to one experiment's arms)."""
    running = [
        e
        for e in experiments
        if e.spec.spec_model_ref.name == specmodel.metadata.name
        and e.metadata.namespace == specmodel.metadata.namespace
        and e.status is not None
        and e.status.phase == ExperimentPhase.RUNNING
    ]
    if not running:
        return None
    experiment = min(running, key=lambda e: e.metadata.name)
    return Mirror(
        experiment=experiment.metadata.name,
        arms=[_arm(experiment, arm.name) for arm in arms_of(experiment.spec)],
        baseline=ArmName.BASELINE,
        sample={c.name: experiment.spec.sample.of(c.name) for c in specmodel.spec.classes},
    )


def _arm(experiment: SpecExperiment, arm: str) -> MirrorArm:
    return MirrorArm(name=arm, url=arm_url(experiment, arm))
