"""What the fleet's gateways mirror while an experiment runs: a sample of each class's requests
to every arm's own gateway Service. Pure: the SpecModel's reconcile renders it into the fleet's
gateway config, so mirroring starts once the arms are ready and stops when the experiment does,
or, with a capacity phase, once the sample of prompts the gateways keep meanwhile is taken."""

from __future__ import annotations

import hashlib

from specfleet.api import SpecModel
from specfleet.api.experiment import ExperimentPhase, SpecExperiment, SpecExperimentStatus
from specfleet.api.gateway import Mirror, MirrorArm
from specfleet.api.verdict import ArmName
from specfleet.experiment.arms import arms_of
from specfleet.experiment.workloads import arm_url

SAMPLE_PER_CLASS = 100
"""Prompts of each class the gateways keep for the capacity phase's load tests."""


def mirror_of(experiments: list[SpecExperiment], specmodel: SpecModel) -> Mirror | None:
    """The mirror of the first mirroring experiment on `specmodel` by name (one at a time: a
    request is mirrored to one experiment's arms)."""
    running = [
        e
        for e in experiments
        if e.spec.spec_model_ref.name == specmodel.metadata.name
        and e.metadata.namespace == specmodel.metadata.namespace
        and e.status is not None
        and mirroring(e.status)
    ]
    if not running:
        return None
    experiment = min(running, key=lambda e: e.metadata.name)
    return Mirror(
        experiment=experiment.metadata.name,
        arms=[_arm(experiment, arm.name) for arm in arms_of(experiment.spec)],
        baseline=ArmName.BASELINE,
        sample={c.name: experiment.spec.sample.of(c.name) for c in specmodel.spec.classes},
        keep_sample=SAMPLE_PER_CLASS if experiment.spec.capacity else None,
        sample_token=sample_token(experiment) if experiment.spec.capacity else None,
    )


def sample_token(experiment: SpecExperiment) -> str:
    """The token the fleet's gateways serve the kept prompts to: derived from the experiment's
    uid, so the operator needs no state for it, and whoever can read neither the experiment nor
    the gateway's config (a pod that merely reaches the metrics port) cannot present it."""
    seed = f"specfleet-sample:{experiment.metadata.uid}"
    return hashlib.sha256(seed.encode()).hexdigest()[:32]


def mirroring(status: SpecExperimentStatus) -> bool:
    """Running, or in the capacity phase until its sample of prompts is taken."""
    if status.phase == ExperimentPhase.CAPACITY:
        return status.capacity is None or status.capacity.sampled_at is None
    return status.phase == ExperimentPhase.RUNNING


def _arm(experiment: SpecExperiment, arm: str) -> MirrorArm:
    return MirrorArm(name=arm, url=arm_url(experiment, arm))
