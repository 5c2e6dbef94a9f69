"""A SpecExperiment's status as a pure function of its arms' Deployments as watched: Pending until
every arm is ready, then Running; Failed, with the reason and its fix, when it cannot run.

What the measurement adds (progress, the leading arm, the verdict, the patch) carries over."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from specfleet.api.experiment import (
    ArmStatus,
    ExperimentPhase,
    SpecExperiment,
    SpecExperimentStatus,
)
from specfleet.controller.status import condition, rollout
from specfleet.experiment.arms import arms_of
from specfleet.experiment.workloads import arm_name

Body = dict[str, Any]
READY = "Ready"


def failed_status(
    generation: int | None,
    reason: str,
    message: str,
    previous: SpecExperimentStatus,
    now: datetime,
) -> SpecExperimentStatus:
    """`reason` is CamelCase (SpecModelNotFound, InvalidSpec, ...); `message` says the fix."""
    ready = condition((READY, "False", reason, message), generation, previous.conditions, now)
    return previous.model_copy(
        update={
            "observed_generation": generation,
            "phase": ExperimentPhase.FAILED,
            "conditions": [ready],
        }
    )


def arms_status(
    experiment: SpecExperiment,
    deployments: Mapping[str, Body],
    previous: SpecExperimentStatus,
    now: datetime,
    apply_error: str | None = None,
) -> SpecExperimentStatus:
    """`deployments` are the arms' Deployments by name, as watched."""
    arms = [_arm(experiment, arm.name, deployments) for arm in arms_of(experiment.spec)]
    waiting = [f"{a.workload} {a.ready_replicas}/{a.replicas}" for a in arms if not _ready(a)]
    if apply_error is not None:
        raw = (READY, "False", "ApplyFailed", apply_error)
    elif waiting:
        raw = (READY, "False", "ArmsStarting", "waiting for " + ", ".join(waiting))
    else:
        raw = (READY, "True", "ArmsReady", f"{len(arms)} arms ready")
    generation = experiment.metadata.generation
    was_running = previous.phase == ExperimentPhase.RUNNING
    running = raw[1] == "True" or (was_running and previous.observed_generation == generation)
    return previous.model_copy(
        update={
            "observed_generation": generation,
            "phase": ExperimentPhase.RUNNING if running else ExperimentPhase.PENDING,
            "conditions": [condition(raw, generation, previous.conditions, now)],
            "arms": arms,
        }
    )


def _arm(experiment: SpecExperiment, arm: str, deployments: Mapping[str, Body]) -> ArmStatus:
    name = arm_name(experiment.metadata.name, arm)
    state = rollout(deployments.get(name))
    return ArmStatus(
        name=arm,
        workload=name,
        ready_replicas=state.replicas.ready if state.complete else 0,
        replicas=experiment.spec.replicas,
    )


def _ready(arm: ArmStatus) -> bool:
    return arm.ready_replicas >= arm.replicas
