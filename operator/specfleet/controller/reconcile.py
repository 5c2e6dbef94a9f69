"""One SpecModel, level-based: parse, plan, render, apply what differs, prune, write status.

Sync; runs in a worker thread. Children come from the operator's watches (no reads); writes go
through `Kube`. An unchanged SpecModel in an unchanged cluster makes no request.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from specfleet.api import (
    EngineConfig,
    InvalidSpecModel,
    SpecModel,
    SpecModelStatus,
    parse_specmodel,
)
from specfleet.api.status import RevisionRecord
from specfleet.controller import children, events, guarding
from specfleet.controller.children import ChildKey
from specfleet.controller.kube import Kube
from specfleet.controller.plan import Plan, plan
from specfleet.controller.status import Observed, invalid_status, next_status, rollout
from specfleet.guard import Action, decide
from specfleet.render import RenderSettings, ServingPlan, render
from specfleet.render.workload import canary_name
from specfleet.telemetry.model import Observation

Body = dict[str, Any]
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Live:
    """A SpecModel's children as watched: every kind by (kind, name), and its pods."""

    children: dict[ChildKey, Body] = field(default_factory=dict)
    pods: list[Body] = field(default_factory=list)
    recently_applied: dict[ChildKey, str] = field(default_factory=dict)
    """Hashes applied moments ago, not yet seen by the watches."""


@dataclass(frozen=True)
class GuardTick:
    """A guard evaluation is due; `observation` is None when telemetry had nothing at all."""

    observation: Observation | None


@dataclass(frozen=True)
class Outcome:
    status: SpecModelStatus
    applied: int
    pruned: int
    error: str | None
    actions: list[Action] = field(default_factory=list)
    applied_hashes: dict[ChildKey, str] = field(default_factory=dict)


def reconcile(
    body: Body,
    live: Live,
    kube: Kube,
    settings: RenderSettings,
    now: datetime,
    tick: GuardTick | None = None,
    written: SpecModelStatus | None = None,
) -> Outcome:
    """`written` is the status this process last wrote: the watch may not have delivered it
    yet, and the operator is the only writer of status, so it is the fresher of the two."""
    if body["metadata"].get("deletionTimestamp"):
        return Outcome(_previous_status(body), 0, 0, None)
    previous = written or _previous_status(body)
    stored = previous
    try:
        specmodel = parse_specmodel({k: v for k, v in body.items() if k != "status"})
    except InvalidSpecModel as exc:
        status = invalid_status(
            body["metadata"].get("generation"), [str(e) for e in exc.errors], previous, now
        )
        _write_status(kube, body, stored, status)
        return Outcome(status, 0, 0, str(exc))
    deployment = live.children.get(("Deployment", specmodel.metadata.name))
    actions: list[Action] = []
    if tick is not None:
        previous, actions = _guard(specmodel, previous, deployment, tick, now, kube)
    the_plan = plan(specmodel, previous, now)
    error = None
    applied = pruned = 0
    applied_hashes: dict[ChildKey, str] = {}
    try:
        if the_plan.new_revision:
            kube.apply(controller_revision(specmodel, the_plan.desired))
        manifests = _desired(specmodel, the_plan, kube, settings)
        todo = children.changes(manifests, live.children, live.recently_applied)
        for manifest in todo.apply:
            kube.apply(manifest)
            applied_hashes[children.key(manifest)] = children.applied_hash(manifest) or ""
        for child in todo.prune:
            kube.delete(
                child["apiVersion"],
                child["kind"],
                child["metadata"]["namespace"],
                child["metadata"]["name"],
            )
        applied, pruned = len(todo.apply), len(todo.prune)
    except ApiException as exc:
        if _namespace_terminating(exc):  # everything in it is going; nothing to report
            return Outcome(previous, 0, 0, None)
        error = _describe(exc)
        log.warning("applying %s failed: %s", specmodel.metadata.name, error)
    except ValueError as exc:
        error = _describe(exc)
        log.warning("applying %s failed: %s", specmodel.metadata.name, error)
    canary = live.children.get(("Deployment", canary_name(specmodel.metadata.name)))
    observed = Observed(deployment, live.pods, error, canary)
    status = next_status(specmodel, the_plan, observed, previous, now)
    _write_status(kube, body, stored, status)
    for action in actions:
        kind = events.NORMAL if action.action == "revision_promoted" else events.WARNING
        kube.event(body, kind, action.reason, action.message)
    if applied or pruned:
        message = (
            f"applied {applied} and pruned {pruned} children for revision {the_plan.active.number}"
        )
        kube.event(body, events.NORMAL, "ChildrenApplied", message)
    return Outcome(status, applied, pruned, error, actions, applied_hashes)


def _guard(
    specmodel: SpecModel,
    status: SpecModelStatus,
    deployment: Body | None,
    tick: GuardTick,
    now: datetime,
    kube: Kube,
) -> tuple[SpecModelStatus, list[Action]]:
    """Runs the guard on the plan as it stands, and folds its decision into status, so the
    plan computed next already follows it."""
    current = plan(specmodel, status, now)
    try:
        speculative = _active_config(specmodel, current, kube).speculative
    except ApiException as exc:  # judge with the spec's depth rather than not at all
        log.warning(
            "revision %s of %s unreadable: %s", current.active.number, specmodel.metadata.name, exc
        )
        speculative = specmodel.spec.speculative
    the_situation = guarding.situation(
        specmodel, status, current, rollout(deployment), tick.observation, now, speculative
    )
    decision = decide(the_situation)
    return guarding.apply_decision(status, current, decision, now), decision.actions


def _active_config(specmodel: SpecModel, the_plan: Plan, kube: Kube) -> EngineConfig:
    """The engine config being served: the spec's own, or after a rollback the last good
    revision's, kept in its ControllerRevision."""
    if not the_plan.rolled_back:
        return specmodel.engine_config()
    name = revision_name(specmodel, the_plan.active)
    return EngineConfig.model_validate(kube.read_revision(specmodel.metadata.namespace, name))


def _desired(
    specmodel: SpecModel, the_plan: Plan, kube: Kube, settings: RenderSettings
) -> list[Body]:
    serving = ServingPlan(
        revision=the_plan.active.number,
        speculation=the_plan.speculation,
        canary=the_plan.canary,
        engine_config=_active_config(specmodel, the_plan, kube),
    )
    return [children.with_applied_hash(m) for m in render(specmodel, serving, settings)]


def revision_name(specmodel: SpecModel, record: RevisionRecord) -> str:
    return f"{specmodel.metadata.name}-{record.hash}"


def controller_revision(specmodel: SpecModel, record: RevisionRecord) -> Body:
    """The full engine config of a revision, owned by the SpecModel, for rollbacks."""
    meta = specmodel.metadata
    return {
        "apiVersion": "apps/v1",
        "kind": "ControllerRevision",
        "metadata": {
            "name": revision_name(specmodel, record),
            "namespace": meta.namespace,
            "labels": {
                "app.kubernetes.io/instance": meta.name,
                "app.kubernetes.io/managed-by": "specfleet",
            },
            "ownerReferences": [
                {
                    "apiVersion": specmodel.api_version,
                    "kind": specmodel.kind,
                    "name": meta.name,
                    "uid": meta.uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "revision": record.number,
        "data": specmodel.engine_config().canonical(),
    }


def _previous_status(body: Body) -> SpecModelStatus:
    try:
        return SpecModelStatus.model_validate(body.get("status") or {})
    except ValidationError:
        log.warning("status of %s is unreadable; starting afresh", body["metadata"]["name"])
        return SpecModelStatus()


def _write_status(kube: Kube, body: Body, before: SpecModelStatus, after: SpecModelStatus) -> None:
    if after.to_wire() == before.to_wire():
        return
    meta = body["metadata"]
    kube.apply_status(meta["namespace"], meta["name"], after.to_wire())
    for event in events.transitions(before, after):
        kube.event(body, event.type, event.reason, event.message)


def _namespace_terminating(exc: ApiException) -> bool:
    """The namespace is being deleted (creates are refused) or is gone."""
    body = exc.body or ""
    return (exc.status == 403 and "NamespaceTerminating" in body) or (
        exc.status == 404 and '"kind":"namespaces"' in body
    )


def _describe(exc: Exception) -> str:
    if isinstance(exc, ApiException):
        return f"API server answered {exc.status} {exc.reason}: {(exc.body or '')[:300]}"
    return str(exc)
