"""Revisions and the serving plan, as pure functions of spec, status, annotations and the clock.

A revision is a distinct engine config. The plan serves the desired revision unless it was
judged bad (then the last good one, until the spec's engine config or the retry annotation
changes), with speculation on unless an override or the guard's kill switch says off.
Precedence: the kill-switch annotation, then spec.guard.mode, then the guard. While the guard
tries speculation again (a trial), the fleet stays without it and a canary pod runs it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from specfleet.api import RETRY_ANNOTATION, SpecModel
from specfleet.api.status import (
    MAX_REVISION_HISTORY,
    RevisionRecord,
    SpecModelStatus,
)
from specfleet.guard import killswitch
from specfleet.render import revision_hash

GOOD, BAD, PROBATION = "good", "bad", "probation"


@dataclass(frozen=True)
class Plan:
    """What runs, and the bookkeeping that led to it."""

    desired: RevisionRecord
    active: RevisionRecord
    speculation: bool
    speculation_source: str
    """Who decided speculation: `annotation`, `spec`, `guard` or `config` (none configured)."""
    canary: bool
    """A trial: one extra pod runs the active revision with speculation beside the fleet."""
    revisions: list[RevisionRecord]
    retry_token: str | None
    new_revision: bool

    @property
    def rolled_back(self) -> bool:
        return self.active.number != self.desired.number


def plan(specmodel: SpecModel, status: SpecModelStatus, now: datetime) -> Plan:
    revisions, desired, new = _record_revision(specmodel, status, now)
    token = specmodel.metadata.annotations.get(RETRY_ANNOTATION)
    if token is not None and token != status.retry_token and desired.verdict == BAD:
        desired = desired.model_copy(update={"verdict": PROBATION})
        revisions = [desired if r.number == desired.number else r for r in revisions]
    active = desired if desired.verdict != BAD else _last_good(revisions, desired)
    speculation, source = killswitch.speculation(specmodel, status.kill_switch)
    return Plan(
        desired=desired,
        active=active,
        speculation=speculation,
        speculation_source=source,
        canary=killswitch.runs_canary(source, status.kill_switch),
        revisions=revisions,
        retry_token=token if token is not None else status.retry_token,
        new_revision=new,
    )


def _record_revision(
    specmodel: SpecModel, status: SpecModelStatus, now: datetime
) -> tuple[list[RevisionRecord], RevisionRecord, bool]:
    digest = revision_hash(specmodel.engine_config())
    for record in status.revisions:
        if record.hash == digest:
            return list(status.revisions), record, False
    number = max((r.number for r in status.revisions), default=0) + 1
    record = RevisionRecord(
        number=number,
        hash=digest,
        generation=specmodel.metadata.generation,
        verdict=PROBATION,
        created=now.isoformat(),
    )
    return _bounded([*status.revisions, record]), record, True


def _bounded(revisions: list[RevisionRecord]) -> list[RevisionRecord]:
    """Keep the newest MAX_REVISION_HISTORY, but never drop the newest good revision."""
    if len(revisions) <= MAX_REVISION_HISTORY:
        return revisions
    good = [r for r in revisions if r.verdict == GOOD]
    keep = revisions[-(MAX_REVISION_HISTORY - 1) :]
    if good and good[-1] not in keep:
        return [good[-1], *keep]
    return revisions[-MAX_REVISION_HISTORY:]


def _last_good(revisions: list[RevisionRecord], fallback: RevisionRecord) -> RevisionRecord:
    good = [r for r in revisions if r.verdict == GOOD and r.number != fallback.number]
    return good[-1] if good else fallback
