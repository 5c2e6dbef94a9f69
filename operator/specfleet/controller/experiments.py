"""One SpecExperiment, level-based: read it and its SpecModel, render the arms
(`experiment.workloads`), apply what differs and prune the rest (as a SpecModel's children),
measure the running arms when asked to, retire them once concluded, write status. Writes only
the arms and the experiment's status: never the SpecModel.

Sync; runs in a worker thread."""

from __future__ import annotations

import logging
import math
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
from specfleet.controller import children, events
from specfleet.controller.children import ChildKey
from specfleet.controller.experiment_status import (
    arms_status,
    concluded,
    failed_status,
    measured_status,
)
from specfleet.controller.kube import Kube
from specfleet.controller.reconcile import describe
from specfleet.experiment.workloads import InvalidArms, render_arms
from specfleet.render import Manifest, RenderSettings
from specfleet.telemetry.arms import ArmsTarget, read_arms
from specfleet.telemetry.reader import TelemetryReader

Body = dict[str, Any]
log = logging.getLogger(__name__)


class CannotRun(Exception):
    def __init__(self, reason: str, message: str) -> None:
        self.reason, self.message = reason, message
        super().__init__(message)


def reconcile_experiment(
    body: Body,
    specmodel_body: Body | None,
    arms: dict[ChildKey, Body],
    kube: Kube,
    settings: RenderSettings,
    now: datetime,
    reader: TelemetryReader | None = None,
) -> SpecExperimentStatus:
    """`arms` are the experiment's children as watched; `specmodel_body` the SpecModel it
    names, if there is one; `reader`, when a measurement of the running arms is due."""
    previous = _previous_status(body)
    generation = body["metadata"].get("generation")
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
        error = _sync(kube, desired, arms)
        deployments = {name: b for (kind, name), b in arms.items() if kind == "Deployment"}
        status = arms_status(experiment, deployments, previous, now, error)
        if reader is not None and status.phase == ExperimentPhase.RUNNING:
            reading = read_arms(reader, _target(experiment, status, now), now)
            status = measured_status(experiment, specmodel, reading, status, now)
            if concluded(status, generation):  # the verdict is in: retire the arms
                _sync(kube, [], arms)
    _write_status(kube, body, previous, status)
    return status


def _target(experiment: SpecExperiment, status: SpecExperimentStatus, now: datetime) -> ArmsTarget:
    """The sample since the arms first served it (two scrapes at least: an increase needs
    two samples)."""
    started = datetime.fromisoformat(status.started_at) if status.started_at else now
    elapsed = math.ceil((now - started).total_seconds())
    return ArmsTarget(
        namespace=experiment.metadata.namespace,
        experiment=experiment.metadata.name,
        specmodel=experiment.spec.spec_model_ref.name,
        window_seconds=max(elapsed, 2 * SCRAPE_INTERVAL_SECONDS),
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
    """Applies what differs and prunes the rest; the API server's refusal, if any."""
    todo = children.changes(desired, live)
    try:
        for manifest in todo.apply:
            kube.apply(manifest)
        for child in todo.prune:
            meta = child["metadata"]
            kube.delete(child["apiVersion"], child["kind"], meta["namespace"], meta["name"])
    except ApiException as exc:
        log.warning("applying the arms failed: %s", exc.reason)
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
