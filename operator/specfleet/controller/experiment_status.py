"""A SpecExperiment's status, pure: Pending until every arm's Deployment is ready, then Running;
Failed, with the reason and its fix, when it cannot run; the measurement of the arms adds the
progress, the verdict, the leading arm and its patch, and once enough was seen the capacity
phase (`controller.capacity_status`) when the spec has one, then Concluded (the arms are then
retired: the verdict stays)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from specfleet.api import SpecModel
from specfleet.api.experiment import (
    ArmStatus,
    CapacityStatus,
    ExperimentPhase,
    Progress,
    SpecExperiment,
    SpecExperimentStatus,
)
from specfleet.api.status import Condition
from specfleet.api.verdict import ArmName
from specfleet.experiment.arms import arms_of, class_slos, gpus_per_replica
from specfleet.experiment.measure import arm_measurements, progress, recommended_patch
from specfleet.experiment.verdict import ArmMeasurement, judge
from specfleet.experiment.workloads import arm_name, arm_specmodel
from specfleet.telemetry.arms import ArmsObservation
from specfleet.tick.observed import rollout
from specfleet.tick.status import condition

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
            "phase": _arms_phase(previous, generation, running),
            "conditions": replace_condition(
                previous.conditions, condition(raw, generation, previous.conditions, now)
            ),
            "arms": arms,
            "started_at": previous.started_at if was_running else _started(running, now),
            "capacity": previous.capacity if was_running else None,
        }
    )


def _arms_phase(
    previous: SpecExperimentStatus, generation: int | None, running: bool
) -> ExperimentPhase:
    if in_capacity(previous, generation):
        return ExperimentPhase.CAPACITY
    return ExperimentPhase.RUNNING if running else ExperimentPhase.PENDING


def _running(status: SpecExperimentStatus, generation: int | None) -> bool:
    """Running this very spec, on the sample or its load tests: a new spec starts the sample
    again."""
    running = status.phase in (ExperimentPhase.RUNNING, ExperimentPhase.CAPACITY)
    return running and status.observed_generation == generation


def in_capacity(status: SpecExperimentStatus, generation: int | None) -> bool:
    """In the capacity phase of this very spec."""
    return status.phase == ExperimentPhase.CAPACITY and status.observed_generation == generation


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
    tested: Mapping[ArmName, float | None] | None = None,
) -> SpecExperimentStatus:
    """The verdict on the sample so far, the progress, the leading arm and its patch; once
    enough was seen, the capacity phase if the spec has one, else Concluded. `tested`: the
    capacity phase's throughputs at SLO (None for an arm whose load test failed: its own at
    concurrency one), for the final verdict. A blind reading keeps the last verdict and says
    why."""
    generation = experiment.metadata.generation
    if reading.blind is not None:
        raw = (MEASURED, "False", "PrometheusUnavailable", reading.blind)
        measured = condition(raw, generation, previous.conditions, now)
        return previous.model_copy(
            update={"conditions": replace_condition(previous.conditions, measured)}
        )
    classes = class_slos(specmodel)
    throughputs = {arm: t for arm, t in (tested or {}).items() if t is not None}
    arms = arm_measurements(reading, list(classes), _gpus(specmodel, experiment), throughputs)
    price, enough = experiment.spec.gpu_hour_price, specmodel.spec.guard.min_requests
    verdict = judge(arms, classes, price, enough)
    progress = measured_progress(experiment, arms, previous.started_at, now)
    phase = _measured_phase(experiment, previous, progress.percent >= 100, tested is not None)
    raw = (MEASURED, "True", "Measured", f"{reading.window_seconds}s of the sample measured")
    conditions = replace_condition(
        previous.conditions, condition(raw, generation, previous.conditions, now)
    )
    if phase == ExperimentPhase.CONCLUDED:
        outcome = str(verdict.outcome)  # a condition's reason is CamelCase
        end = (CONCLUDED, "True", outcome[0].upper() + outcome[1:], verdict.reason)
        conditions = replace_condition(conditions, condition(end, generation, conditions, now))
    entered_capacity = phase == ExperimentPhase.CAPACITY != previous.phase
    return previous.model_copy(
        update={
            "phase": phase,
            "capacity": CapacityStatus(started_at=now.isoformat())
            if entered_capacity
            else previous.capacity,
            "conditions": conditions,
            "progress": progress,
            "leading_arm": verdict.recommendation,
            "verdict": verdict,
            "recommended_patch": _patch(experiment, verdict.recommendation),
        }
    )


def _measured_phase(
    experiment: SpecExperiment, previous: SpecExperimentStatus, enough: bool, tested: bool
) -> ExperimentPhase:
    if tested:
        return ExperimentPhase.CONCLUDED
    if not enough or previous.phase == ExperimentPhase.CAPACITY:
        return previous.phase
    return ExperimentPhase.CAPACITY if experiment.spec.capacity else ExperimentPhase.CONCLUDED


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


def replace_condition(conditions: list[Condition], new: Condition) -> list[Condition]:
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
