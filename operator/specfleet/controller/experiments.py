"""One SpecExperiment, level-based: read it and its SpecModel, render the arms
(`experiment.workloads`), apply what differs and prune the rest (as a SpecModel's children),
measure the running arms when asked to; with a capacity phase, once the sample is complete, take
the sample of prompts from a fleet gateway and load-test every arm with it (a Job each); retire
them all once concluded, write status. Writes only the arms, their load tests and the
experiment's status: never the SpecModel.

Sync; runs in a worker thread."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from specfleet.api import InvalidSpecModel, SpecModel, parse_specmodel
from specfleet.api.base import SCRAPE_INTERVAL_SECONDS
from specfleet.api.experiment import (
    EXPERIMENT_KIND,
    ExperimentPhase,
    SpecExperiment,
    SpecExperimentStatus,
)
from specfleet.api.validation import InvalidSpecExperiment, parse_specexperiment
from specfleet.api.verdict import ArmName
from specfleet.controller.capacity_status import (
    Result,
    arm_results,
    sampled_status,
    tested,
    tested_status,
)
from specfleet.controller.experiment_status import (
    arms_status,
    concluded,
    failed_status,
    in_capacity,
    measured_status,
)
from specfleet.controller.kube import UNANSWERED, Kube
from specfleet.controller.reconcile import describe
from specfleet.experiment.capacity_job import render_capacity_jobs, render_requests, requests_name
from specfleet.experiment.mirror import sample_token
from specfleet.experiment.replay import ReplayRequest
from specfleet.experiment.sample import SampleFetch, SampleUnavailable, sample_urls, take_sample
from specfleet.experiment.workloads import InvalidArms, render_arms
from specfleet.render import Manifest, RenderSettings
from specfleet.telemetry.arms import ArmsTarget, read_arms
from specfleet.telemetry.reader import TelemetryReader
from specfleet.tick import children, events
from specfleet.tick.children import ChildKey

Body = dict[str, Any]
log = logging.getLogger(__name__)


class CannotRun(Exception):
    def __init__(self, reason: str, message: str) -> None:
        self.reason, self.message = reason, message
        super().__init__(message)


@dataclass(frozen=True)
class CapacityLive:
    """What the capacity phase reads besides the experiment's children: its load tests' pods,
    the fleet's pods (whose gateways keep the sample of prompts) and how to fetch a sample."""

    pods: list[Body] = field(default_factory=list)
    fleet_pods: list[Body] = field(default_factory=list)
    fetch: SampleFetch | None = None


@dataclass(frozen=True)
class LoadTests:
    """The capacity phase in one reconcile: its children, and the sample taken (or why not)
    or the arms' results."""

    manifests: list[Manifest] = field(default_factory=list)
    sample: list[ReplayRequest] | SampleUnavailable | None = None
    results: dict[ArmName, Result] | None = None


def reconcile_experiment(
    body: Body,
    specmodel_body: Body | None,
    arms: dict[ChildKey, Body],
    kube: Kube,
    settings: RenderSettings,
    now: datetime,
    reader: TelemetryReader | None = None,
    capacity: CapacityLive | None = None,
    written: SpecExperimentStatus | None = None,
) -> SpecExperimentStatus:
    """`arms` are the experiment's children as watched (its load tests' Jobs and sample too);
    `specmodel_body` the SpecModel it names, if there is one; `reader`, when a measurement of
    the arms is due; `written`, the status last written for this very object and spec, fresher
    than a lagging watch's (which would take a concluded experiment back to Running)."""
    generation = body["metadata"].get("generation")
    fresh = written is not None and written.observed_generation == generation
    previous = written if fresh and written is not None else _previous_status(body)
    if body["metadata"].get("deletionTimestamp"):
        return previous
    if concluded(previous, generation):
        _sync(kube, [], arms)
        return previous
    try:
        experiment = _experiment(body)
        specmodel = _specmodel(experiment, specmodel_body)
        desired = _desired(experiment, specmodel, settings)
    except CannotRun as exc:
        status = failed_status(generation, exc.reason, exc.message, previous, now)
        if exc.reason == "SpecModelNotFound":  # its arms serve nothing anyone will adopt
            _sync(kube, [], arms)
    else:
        tests = _load_tests(experiment, specmodel, previous, arms, capacity, settings)
        error = _sync(kube, desired + tests.manifests, arms)
        deployments = {name: b for (kind, name), b in arms.items() if kind == "Deployment"}
        status = arms_status(experiment, deployments, previous, now, error)
        if status.phase == ExperimentPhase.CAPACITY:
            status = _tested_status(experiment, specmodel, status, tests, error, now)
        if reader is not None:
            status = _measured(experiment, specmodel, reader, status, now)
            if concluded(status, generation):  # the verdict is in: retire the arms
                _sync(kube, [], arms)
    _write_status(kube, body, previous, status)
    return status


def _load_tests(
    experiment: SpecExperiment,
    specmodel: SpecModel,
    previous: SpecExperimentStatus,
    arms: dict[ChildKey, Body],
    live: CapacityLive | None,
    settings: RenderSettings,
) -> LoadTests:
    """In the capacity phase: first the sample from the fleet's gateways (the requests'
    ConfigMap and the Jobs applied with it), then the Jobs' results; the ConfigMap, whose data
    the watch does not hold, kept as it is."""
    capacity = previous.capacity
    if not in_capacity(previous, experiment.metadata.generation) or capacity is None:
        return LoadTests()
    live = live or CapacityLive()
    name = experiment.metadata.name
    if capacity.sampled_at is None:
        try:
            sample = _take_sample(experiment, live)
        except SampleUnavailable as exc:
            return LoadTests(sample=exc)
        classes = {r.class_name for r in sample}
        manifests = [
            render_requests(experiment, sample),
            *_jobs(specmodel, experiment, settings, classes),
        ]
        return LoadTests([children.with_applied_hash(m) for m in manifests], sample=sample)
    kept = arms.get(("ConfigMap", requests_name(name)))
    jobs = _jobs(specmodel, experiment, settings, set(capacity.classes))
    results = arm_results(experiment, {n: b for (k, n), b in arms.items() if k == "Job"}, live.pods)
    manifests = [children.with_applied_hash(m) for m in jobs]
    return LoadTests([*([kept] if kept else []), *manifests], results=results)


def _take_sample(experiment: SpecExperiment, live: CapacityLive) -> list[ReplayRequest]:
    if live.fetch is None:
        raise SampleUnavailable("this operator cannot fetch samples")
    urls, token = sample_urls(live.fleet_pods), sample_token(experiment)
    return take_sample(urls, experiment.metadata.name, token, live.fetch)


def _jobs(
    specmodel: SpecModel, experiment: SpecExperiment, settings: RenderSettings, classes: set[str]
) -> list[Manifest]:
    return render_capacity_jobs(specmodel, experiment, settings.capacity_image, classes)


def _tested_status(
    experiment: SpecExperiment,
    specmodel: SpecModel,
    status: SpecExperimentStatus,
    tests: LoadTests,
    apply_error: str | None,
    now: datetime,
) -> SpecExperimentStatus:
    """The sample taken once it and its Jobs are applied (else taken again); the results."""
    if tests.sample is not None and apply_error is None:
        every_class = [c.name for c in specmodel.spec.classes]
        return sampled_status(experiment, status, tests.sample, every_class, now)
    if tests.results is not None:
        return tested_status(experiment, status, tests.results, now)
    return status


def _measured(
    experiment: SpecExperiment,
    specmodel: SpecModel,
    reader: TelemetryReader,
    status: SpecExperimentStatus,
    now: datetime,
) -> SpecExperimentStatus:
    """The running arms on the sample so far; once every load test is in, the arms on the
    whole sample (up to its end: the load tests are no sample) with their throughputs."""
    if status.phase == ExperimentPhase.RUNNING:
        reading = read_arms(reader, _target(experiment, status, now), now)
        return measured_status(experiment, specmodel, reading, status, now)
    throughputs = tested(status)
    if status.phase != ExperimentPhase.CAPACITY or throughputs is None:
        return status
    assert status.capacity is not None
    until = datetime.fromisoformat(status.capacity.started_at)
    reading = read_arms(reader, _target(experiment, status, until), now)
    return measured_status(experiment, specmodel, reading, status, now, throughputs)


def _target(
    experiment: SpecExperiment, status: SpecExperimentStatus, until: datetime
) -> ArmsTarget:
    """The sample from when the arms first served it until `until` (two scrapes at least: an
    increase needs two samples)."""
    started = datetime.fromisoformat(status.started_at) if status.started_at else until
    elapsed = math.ceil((until - started).total_seconds())
    return ArmsTarget(
        namespace=experiment.metadata.namespace,
        experiment=experiment.metadata.name,
        specmodel=experiment.spec.spec_model_ref.name,
        window_seconds=max(elapsed, 2 * SCRAPE_INTERVAL_SECONDS),
        until=until if status.phase == ExperimentPhase.CAPACITY else None,
    )


def _experiment(body: Body) -> SpecExperiment:
    try:
        return parse_specexperiment({k: v for k, v in body.items() if k != "status"})
    except InvalidSpecExperiment as exc:
        raise CannotRun("InvalidSpec", str(exc)) from None


def _desired(
    experiment: SpecExperiment, specmodel: SpecModel, settings: RenderSettings
) -> list[Manifest]:
    try:
        return [children.with_applied_hash(m) for m in render_arms(specmodel, experiment, settings)]
    except InvalidArms as exc:
        raise CannotRun("ArmsInvalid", str(exc)) from None


def _specmodel(experiment: SpecExperiment, body: Body | None) -> SpecModel:
    name = experiment.spec.spec_model_ref.name
    if body is None:
        raise CannotRun(
            "SpecModelNotFound",
            f"SpecModel {name} not found in {experiment.metadata.namespace}: create it or fix "
            "spec.specModelRef.name",
        )
    try:
        return parse_specmodel({k: v for k, v in body.items() if k != "status"})
    except InvalidSpecModel as exc:
        raise CannotRun("SpecModelInvalid", f"SpecModel {name} is invalid: {exc}") from None


def _sync(kube: Kube, desired: list[Manifest], live: dict[ChildKey, Body]) -> str | None:
    """Applies what differs and prunes the rest; the API server's refusal or silence, if any."""
    todo = children.changes(desired, live)
    try:
        for manifest in todo.apply:
            kube.apply(manifest)
        for child in todo.prune:
            meta = child["metadata"]
            kube.delete(child["apiVersion"], child["kind"], meta["namespace"], meta["name"])
    except (ApiException, *UNANSWERED) as exc:
        log.warning("applying the arms failed: %s", describe(exc))
        return describe(exc)
    return None


def _previous_status(body: Body) -> SpecExperimentStatus:
    try:
        return SpecExperimentStatus.model_validate(body.get("status") or {})
    except ValidationError:
        return SpecExperimentStatus()


def _write_status(
    kube: Kube, body: Body, before: SpecExperimentStatus, after: SpecExperimentStatus
) -> None:
    if after.to_wire() != before.to_wire():
        meta = body["metadata"]
        kube.apply_status(meta["namespace"], meta["name"], after.to_wire(), EXPERIMENT_KIND)
        for event in events.experiment_transitions(before, after):
            kube.event(body, event.type, event.reason, event.message)
