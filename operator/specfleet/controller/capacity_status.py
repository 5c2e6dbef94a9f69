"""A SpecExperiment's capacity phase in its status, pure: the sample of prompts taken (or why
not, retried while the fleet mirrors on), each arm's load test result as its Job and pod tell it,
and whether every arm's throughput at SLO was measured. An arm whose load test failed, or gave no
result by the Jobs' deadline, keeps its throughput at concurrency one, and
`CapacityMeasured=False` says so with the load test's words."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from specfleet.api.experiment import ArmCapacity, SpecExperiment, SpecExperimentStatus
from specfleet.api.verdict import ArmName
from specfleet.controller.experiment_status import replace_condition
from specfleet.experiment.arms import arms_of
from specfleet.experiment.capacity import Capacity
from specfleet.experiment.capacity_job import (
    CapacityFailed,
    capacity_job_name,
    capacity_of_job,
    job_deadline_seconds,
)
from specfleet.experiment.replay import ReplayRequest
from specfleet.experiment.sample import SampleUnavailable
from specfleet.render.workload import ARM_LABEL
from specfleet.tick.status import condition

Body = dict[str, Any]
Result = Capacity | CapacityFailed | None
"""An arm's load test: its result, why it gave none, or None while it runs."""
SAMPLED = "CapacitySampled"
CAPACITY_MEASURED = "CapacityMeasured"
DEADLINE_GRACE_SECONDS = 120
"""Past the Jobs' own deadline, for the Job controller to say they failed."""


def sampled_status(
    experiment: SpecExperiment,
    previous: SpecExperimentStatus,
    sample: Sequence[ReplayRequest] | SampleUnavailable,
    every_class: Sequence[str],
    now: datetime,
) -> SpecExperimentStatus:
    """The sample taken, its load tests begun; or why it was not, to be tried again.
    `every_class`: the SpecModel's, to say which the sample lacks."""
    assert previous.capacity is not None
    if isinstance(sample, SampleUnavailable):
        raw = (
            SAMPLED,
            "False",
            "SampleUnavailable",
            f"the sample of prompts could not be taken from the fleet's gateways ({sample}); "
            "the fleet mirrors on and the next reconcile tries again",
        )
        return _with(experiment, previous, raw, now)
    classes = sorted({r.class_name for r in sample})
    capacity = previous.capacity.model_copy(
        update={"sampled_at": now.isoformat(), "requests": len(sample), "classes": classes}
    )
    raw = (SAMPLED, "True", "Sampled", _sampled_message(len(sample), classes, every_class))
    return _with(experiment, previous.model_copy(update={"capacity": capacity}), raw, now)


def _sampled_message(requests: int, classes: list[str], every_class: Sequence[str]) -> str:
    message = f"{requests} prompts of {', '.join(classes)} replayed against every arm"
    unsampled = sorted(set(every_class) - set(classes))
    if unsampled:
        message += f"; {', '.join(unsampled)} had none kept and are not load-tested"
    return message


def arm_results(
    experiment: SpecExperiment, jobs: Mapping[str, Body], pods: Sequence[Body]
) -> dict[ArmName, Result]:
    """Each arm's load test, from its Job (by name) and the experiment's capacity pods."""
    results: dict[ArmName, Result] = {}
    for arm in arms_of(experiment.spec):
        own = [p for p in pods if (p["metadata"].get("labels") or {}).get(ARM_LABEL) == arm.name]
        job = jobs.get(capacity_job_name(experiment.metadata.name, arm.name))
        try:
            results[arm.name] = capacity_of_job(job, own)
        except CapacityFailed as exc:
            results[arm.name] = exc
    return results


def tested_status(
    experiment: SpecExperiment,
    previous: SpecExperimentStatus,
    results: Mapping[ArmName, Result],
    now: datetime,
) -> SpecExperimentStatus:
    """Each arm's result kept once it is known (its Job goes at the conclusion); an arm
    without one past the deadline failed."""
    capacity = previous.capacity
    assert capacity is not None and capacity.sampled_at is not None
    known = {a.name: a for a in capacity.arms}
    deadline = _deadline_seconds(experiment)
    late = now > datetime.fromisoformat(capacity.sampled_at) + timedelta(seconds=deadline)
    for arm, result in results.items():
        if arm not in known and (result is not None or late):
            known[arm] = _arm_capacity(arm, result, deadline)
    arms = [known[a.name] for a in arms_of(experiment.spec) if a.name in known]
    status = previous.model_copy(update={"capacity": capacity.model_copy(update={"arms": arms})})
    return _with(experiment, status, _measured(experiment, arms), now)


def tested(status: SpecExperimentStatus) -> dict[ArmName, float | None] | None:
    """Every arm's throughput at SLO (None where its load test failed), once all are known."""
    capacity = status.capacity
    if capacity is None or capacity.sampled_at is None or len(capacity.arms) < len(ArmName):
        return None
    return {a.name: a.throughput_at_slo for a in capacity.arms}


def _deadline_seconds(experiment: SpecExperiment) -> int:
    assert experiment.spec.capacity is not None
    return job_deadline_seconds(experiment.spec.capacity) + DEADLINE_GRACE_SECONDS


def _arm_capacity(arm: ArmName, result: Result, deadline_seconds: int) -> ArmCapacity:
    if isinstance(result, Capacity):
        return ArmCapacity(
            name=arm, throughput_at_slo=result.throughput_at_slo, concurrency=result.concurrency
        )
    if result is None:
        return ArmCapacity(name=arm, failed=f"no result {deadline_seconds}s after it began")
    return ArmCapacity(name=arm, failed=str(result))


def _measured(experiment: SpecExperiment, arms: list[ArmCapacity]) -> tuple[str, str, str, str]:
    failed = [a for a in arms if a.failed is not None]
    if failed:
        words = "; ".join(f"{a.name}: {a.failed}" for a in failed)
        return (
            CAPACITY_MEASURED,
            "False",
            "CapacityFailed",
            f"the load test of {', '.join(a.name for a in failed)} gave no throughput at SLO, "
            f"which is its own at concurrency one on the sample instead ({words})",
        )
    running = [a.name for a in arms_of(experiment.spec) if a.name not in {b.name for b in arms}]
    if running:
        message = f"load tests of {', '.join(running)} running"
        return CAPACITY_MEASURED, "Unknown", "LoadTesting", message
    return CAPACITY_MEASURED, "True", "Measured", "every arm's throughput at SLO load-tested"


def _with(
    experiment: SpecExperiment,
    status: SpecExperimentStatus,
    raw: tuple[str, str, str, str],
    now: datetime,
) -> SpecExperimentStatus:
    new = condition(raw, experiment.metadata.generation, status.conditions, now)
    return status.model_copy(update={"conditions": replace_condition(status.conditions, new)})
