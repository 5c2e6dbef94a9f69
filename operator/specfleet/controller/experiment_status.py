"""A SpecExperiment's status, pure: Pending until every arm's Deployment is ready, then Running;
Failed, with the reason and its fix, when it cannot run; the measurement of the arms adds the
progress, the verdict, the leading arm and its patch, and Concluded once enough was seen (the
arms are then retired: the verdict stays)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from specfleet.api import SpecModel
from specfleet.api.experiment import (
    ArmStatus,
    ExperimentPhase,
    Progress,
    SpecExperiment,
    SpecExperimentStatus,
)
from specfleet.api.status import Condition
from specfleet.controller.status import condition, rollout
from specfleet.experiment.arms import arms_of, class_slos, gpus_per_replica
from specfleet.experiment.measure import arm_measurements, progress, recommended_patch
from specfleet.experiment.verdict import ArmMeasurement, ArmName, judge
from specfleet.experiment.workloads import arm_name, arm_specmodel
from specfleet.telemetry.arms import ArmsObservation

Body = dict[str, Any]
READY = "Ready"
MEASURED = "Measured"
CONCLUDED = "Concluded"


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
    was_running = _running(previous, generation)
    running = raw[1] == "True" or was_running
    return previous.model_copy(
        update={
            "observed_generation": generation,
            "phase": ExperimentPhase.RUNNING if running else ExperimentPhase.PENDING,
            "conditions": _replace(
                previous.conditions, condition(raw, generation, previous.conditions, now)
            ),
            "arms": arms,
            "started_at": previous.started_at if was_running else _started(running, now),
        }
    )


def _running(status: SpecExperimentStatus, generation: int | None) -> bool:
    """Running this very spec: a new spec starts the sample again."""
    return status.phase == ExperimentPhase.RUNNING and status.observed_generation == generation


def _started(running: bool, now: datetime) -> str | None:
    return now.isoformat() if running else None


def concluded(status: SpecExperimentStatus, generation: int | None) -> bool:
    """The experiment has its verdict for this spec: its arms are retired."""
    return status.phase == ExperimentPhase.CONCLUDED and status.observed_generation == generation


def measured_status(
    experiment: SpecExperiment,
    specmodel: SpecModel,
    reading: ArmsObservation,
    previous: SpecExperimentStatus,
    now: datetime,
) -> SpecExperimentStatus:
    """The verdict on the sample so far, the progress, the leading arm and its patch; Concluded
    once enough was seen. A blind reading keeps the last verdict and says why."""
    generation = experiment.metadata.generation
    if reading.blind is not None:
        raw = (MEASURED, "False", "PrometheusUnavailable", reading.blind)
        measured = condition(raw, generation, previous.conditions, now)
        return previous.model_copy(update={"conditions": _replace(previous.conditions, measured)})
    classes = class_slos(specmodel)
    arms = arm_measurements(reading, list(classes), _gpus(specmodel, experiment))
    price, enough = experiment.spec.gpu_hour_price, specmodel.spec.guard.min_requests
    verdict = judge(arms, classes, price, enough)
    progress = measured_progress(experiment, arms, previous.started_at, now)
    done = progress.percent >= 100
    raw = (MEASURED, "True", "Measured", f"{reading.window_seconds}s of the sample measured")
    conditions = _replace(previous.conditions, condition(raw, generation, previous.conditions, now))
    if done:
        outcome = str(verdict.outcome)  # a condition's reason is CamelCase
        end = (CONCLUDED, "True", outcome[0].upper() + outcome[1:], verdict.reason)
        conditions = _replace(conditions, condition(end, generation, conditions, now))
    return previous.model_copy(
        update={
            "phase": ExperimentPhase.CONCLUDED if done else previous.phase,
            "conditions": conditions,
            "progress": progress,
            "leading_arm": verdict.recommendation,
            "verdict": verdict,
            "recommended_patch": _patch(experiment, verdict.recommendation),
        }
    )


def measured_progress(
    experiment: SpecExperiment, arms: list[ArmMeasurement], started_at: str | None, now: datetime
) -> Progress:
    """The samples' share of those needed or the time's of the duration, whichever is
    further: the experiment concludes at the first of the two."""
    spec = experiment.spec
    found = progress(arms, spec.min_requests_per_class)
    if spec.duration_seconds is None or started_at is None:
        return found
    elapsed = (now - datetime.fromisoformat(started_at)).total_seconds()
    by_time = min(100, int(elapsed * 100 // spec.duration_seconds))
    return found.model_copy(update={"percent": max(found.percent, by_time)})


def _gpus(specmodel: SpecModel, experiment: SpecExperiment) -> dict[ArmName, int]:
    return {
        arm.name: gpus_per_replica(arm_specmodel(specmodel, experiment, arm))
        for arm in arms_of(experiment.spec)
    }


def _patch(experiment: SpecExperiment, arm: ArmName | None) -> str | None:
    if arm is None:
        return None
    overlay = next(a.overlay for a in arms_of(experiment.spec) if a.name == arm)
    return recommended_patch(overlay)


def _replace(conditions: list[Condition], new: Condition) -> list[Condition]:
    """One condition of each type: `new` in place of its type's."""
    return [*(c for c in conditions if c.type != new.type), new]


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
