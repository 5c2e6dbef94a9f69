"""One SpecModel, level-based: read, step (`tick.step`), write its decisions to status, apply
what differs, prune, write status.

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

from specfleet.api import InvalidSpecModel, SpecModel, SpecModelStatus
from specfleet.api.gateway import Mirror
from specfleet.controller import idempotency
from specfleet.controller.kube import UNANSWERED, Kube
from specfleet.controller.revisions import RevisionConfigs
from specfleet.guard import Action
from specfleet.render import RenderSettings
from specfleet.tick import children, events
from specfleet.tick.children import ChildKey
from specfleet.tick.observed import observe
from specfleet.tick.status import invalid_status
from specfleet.tick.step import GuardTick, Step, step

Body = dict[str, Any]
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Live:
    """A SpecModel's children as watched: every kind by (kind, name), and its pods."""

    children: dict[ChildKey, Body] = field(default_factory=dict)
    pods: list[Body] = field(default_factory=list)
    recently_applied: dict[ChildKey, str] = field(default_factory=dict)
    """Hashes applied moments ago, not yet seen by the watches."""
    mirror: Mirror | None = None
    """A running experiment's arms, which the fleet's gateways mirror a sample to."""


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
    specmodel: SpecModel | InvalidSpecModel,
    live: Live,
    kube: Kube,
    settings: RenderSettings,
    now: datetime,
    tick: GuardTick | None = None,
    written: SpecModelStatus | None = None,
    configs: RevisionConfigs | None = None,
    guard_on: bool = True,
    first: bool = False,
) -> Outcome:
    """Read, step, record its decisions, apply, write. `specmodel` is `body` parsed, or why it is
    invalid. `written` is the status this process last wrote: the watch may not have delivered
    it yet, and the operator is the only writer of status, so it is the fresher of the two.
    `configs` keeps the revisions' engine configs read so far. `guard_on`: a guard judges (the
    operator reads Prometheus); without one a new revision rolls out directly, as nothing would
    judge a canary. `first`: this replica's first reconcile of the SpecModel since it started
    acting; the recent decisions in status whose Events are missing are told now (the last
    leader may have died between writing a decision and telling of it)."""
    if body["metadata"].get("deletionTimestamp"):
        return Outcome(_previous_status(body), 0, 0, None)
    previous = written or _previous_status(body)
    if isinstance(specmodel, InvalidSpecModel):
        status = invalid_status(
            body["metadata"].get("generation"), [str(e) for e in specmodel.errors], previous, now
        )
        _write_status(kube, body, previous, status)
        _post(kube, body, events.transitions(previous, status))
        return Outcome(status, 0, 0, str(specmodel))
    name = specmodel.metadata.name
    observed = observe(name, live.children, live.pods, live.mirror)
    known = (configs or RevisionConfigs(kube)).of(
        specmodel, previous.revisions, previous.active_revision
    )
    the_step = step(specmodel, previous, observed, tick, known, now, guard_on)
    recorded = _record_decisions(kube, body, previous, the_step)
    done = _apply(kube, the_step, live, settings)
    if done.terminating:  # everything in the namespace is going; nothing to report
        return Outcome(the_step.guarded, 0, 0, None)
    if done.error is not None:
        log.warning("applying %s failed: %s", name, done.error)
    status = the_step.status if done.error is None else the_step.failed(done.error)
    if first:
        try:
            tell_untold(kube, body, previous, now)
        except ApiException as exc:  # Events are best effort
            log.warning("telling %s's recent decisions failed: %s", name, describe(exc))
    _write_status(kube, body, recorded, status)
    told = events.of_reconcile(previous, status, the_step.actions)
    _post(kube, body, told, _decision_names(body, now, the_step.actions))
    if done.applied or done.pruned:
        message = (
            f"applied {done.applied} and pruned {done.pruned} children for revision "
            f"{the_step.plan.active.number}"
        )
        kube.event(body, events.NORMAL, "ChildrenApplied", message)
    return Outcome(
        status, done.applied, done.pruned, done.error, the_step.actions, done.applied_hashes
    )


def _record_decisions(
    kube: Kube, body: Body, previous: SpecModelStatus, the_step: Step
) -> SpecModelStatus:
    """A step's decisions are written to status before they are acted on: a leader that dies
    between the two leaves them for the next, which renders its children from status. Acted on
    first, they would be lost with the status write, and the next leader would decide again
    (re-creating a canary just aborted, say). The status now written."""
    if not the_step.actions:
        return previous
    decided = ", ".join(a.action for a in the_step.actions)
    log.info("recording %s's decisions before acting: %s", body["metadata"]["name"], decided)
    _write_status(kube, body, previous, the_step.status)
    return the_step.status


@dataclass
class Applied:
    """What applying a step's children did. On a failure, `applied_hashes` holds those applied
    before it (the operator remembers them until the watches show them) and the counts are 0."""

    applied: int = 0
    pruned: int = 0
    applied_hashes: dict[ChildKey, str] = field(default_factory=dict)
    error: str | None = None
    terminating: bool = False


def _apply(kube: Kube, the_step: Step, live: Live, settings: RenderSettings) -> Applied:
    """The step's new revision, then its children that differ from the watched ones; then
    prunes the ones it no longer wants."""
    done = Applied()
    try:
        revision = the_step.revision()
        if revision is not None:
            kube.apply(revision)
        todo = children.changes(the_step.children(settings), live.children, live.recently_applied)
        for manifest in todo.apply:
            kube.apply(manifest)
            done.applied_hashes[children.key(manifest)] = children.applied_hash(manifest) or ""
        for child in todo.prune:
            meta = child["metadata"]
            kube.delete(child["apiVersion"], child["kind"], meta["namespace"], meta["name"])
        done.applied, done.pruned = len(todo.apply), len(todo.prune)
    except ApiException as exc:
        done.terminating = _namespace_terminating(exc)
        done.error = describe(exc)
    except (ValueError, *UNANSWERED) as exc:
        done.error = describe(exc)
    return done


def tell_untold(kube: Kube, body: Body, status: SpecModelStatus, now: datetime) -> int:
    """Posts the Events of the recent decisions in `status` that have none (found by their
    idempotency key's name: reads, and a write only for one missing). How many it posted."""
    meta = body["metadata"]
    posted = 0
    for decision in idempotency.untold(status.decisions, now):
        name = idempotency.event_name(meta["name"], idempotency.key_of(meta.get("uid"), decision))
        if kube.event_exists(meta["namespace"], name):
            continue
        kind = events.action_type(decision.action)
        kube.event(body, kind, decision.reason, decision.message, name)
        posted += 1
    return posted


def _previous_status(body: Body) -> SpecModelStatus:
    status = status_of(body)
    if status is None:
        log.warning("status of %s is unreadable; starting afresh", body["metadata"]["name"])
        return SpecModelStatus()
    return status


def status_of(body: Body) -> SpecModelStatus | None:
    """The status as the watch has it; None when it is unreadable."""
    try:
        return SpecModelStatus.model_validate(body.get("status") or {})
    except ValidationError:
        return None


def _write_status(kube: Kube, body: Body, before: SpecModelStatus, after: SpecModelStatus) -> None:
    if after.to_wire() == before.to_wire():
        return
    meta = body["metadata"]
    kube.apply_status(meta["namespace"], meta["name"], after.to_wire())


def _post(
    kube: Kube,
    body: Body,
    told: list[events.Event],
    names: dict[tuple[str, str], str] | None = None,
) -> None:
    """`names`: the Events of decisions, by (reason, message), named by their idempotency keys."""
    for event in told:
        name = (names or {}).get((event.reason, event.message))
        kube.event(body, event.type, event.reason, event.message, name)


def _decision_names(body: Body, now: datetime, actions: list[Action]) -> dict[tuple[str, str], str]:
    """Each action's Event name: its decision's idempotency key (the decision is recorded at
    `now`)."""
    uid, specmodel = body["metadata"].get("uid"), body["metadata"]["name"]
    return {
        (a.reason, a.message): idempotency.event_name(
            specmodel, idempotency.decision_key(uid, now.isoformat(), a.action, a.reason, a.message)
        )
        for a in actions
    }


def _namespace_terminating(exc: ApiException) -> bool:
    """The namespace is being deleted (creates are refused) or is gone."""
    body = exc.body or ""
    return (exc.status == 403 and "NamespaceTerminating" in body) or (
        exc.status == 404 and '"kind":"namespaces"' in body
    )


def describe(exc: Exception) -> str:
    if isinstance(exc, ApiException):
        return f"API server answered {exc.status} {exc.reason}: {(exc.body or '')[:300]}"
    if isinstance(exc, UNANSWERED):
        return f"API server did not answer: {exc}"
    return str(exc)
