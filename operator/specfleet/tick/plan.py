"""Revisions and the serving plan, as pure functions of spec, status, annotations and the clock.

A revision is a distinct engine config. The plan serves the desired revision unless it was
judged bad (then the rollback target, until the spec's engine config or the retry annotation
changes), with speculation on unless an override or the guard's kill switch says off
(`guard.killswitch` says which, and why). While the guard tries speculation again (a trial),
the fleet stays without it and a canary pod runs it. While a new revision rolls out as a canary
(`tick.rollouts`), the fleet serves the control and the canary the new revision; after an
abort the fleet stays on the control.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime

from specfleet.api import RETRY_ANNOTATION, ROLLOUT_ANNOTATION, SpecModel
from specfleet.api.status import (
    MAX_REVISION_HISTORY,
    KillSwitchStatus,
    RevisionRecord,
    RevisionVerdict,
    RolloutStatus,
    SpecModelStatus,
    SpeculationSource,
)
from specfleet.guard import killswitch
from specfleet.render import revision_hash
from specfleet.tick import rollouts


@dataclass(frozen=True)
class Plan:
    """What runs, and the bookkeeping that led to it."""

    desired: RevisionRecord
    active: RevisionRecord
    speculation: bool
    speculation_source: SpeculationSource
    """Who decided speculation (`guard.killswitch`)."""
    canary: bool
    """A trial: one extra pod runs the active revision with speculation beside the fleet."""
    revisions: list[RevisionRecord]
    retry_token: str | None
    new_revision: bool
    rollout: RolloutStatus | None = None
    """The desired revision's canary rollout, running or ended."""
    rollout_override: str | None = None
    """The `specfleet.dev/rollout` value seen."""
    overridden: str | None = None
    """The override acted on now: `promote` or `abort`."""

    @property
    def rolled_back(self) -> bool:
        return self.active.number != self.desired.number and not rollouts.running(self.rollout)

    @property
    def rollout_pods(self) -> int:
        """The rollout canary's pods now (0 while it waits or once it ended)."""
        return rollouts.canary_pods(self.rollout)


def plan(
    specmodel: SpecModel, status: SpecModelStatus, now: datetime, guard_on: bool = True
) -> Plan:
    """`guard_on`: a guard judges the windows; without one a canary rollout could never end."""
    revisions, desired, new = _record_revision(specmodel, status, now)
    token = specmodel.metadata.annotations.get(RETRY_ANNOTATION)
    if token is not None and token != status.retry_token and desired.verdict == RevisionVerdict.BAD:
        desired = desired.model_copy(update={"verdict": RevisionVerdict.PROBATION})
        revisions = [desired if r.number == desired.number else r for r in revisions]
    retry_token = token if token is not None else status.retry_token
    progress = rollouts.progress(specmodel, status, desired, revisions, now, guard_on)
    if progress.overridden and progress.rollout:
        verdict = rollouts.ENDED_VERDICT[progress.rollout.phase]
        desired = desired.model_copy(update={"verdict": verdict})
        revisions = [desired if r.number == desired.number else r for r in revisions]
    the_plan = _serving(
        specmodel, revisions, desired, status.kill_switch, retry_token, new, progress.rollout
    )
    override = specmodel.metadata.annotations.get(ROLLOUT_ANNOTATION)
    return replace(the_plan, rollout_override=override, overridden=progress.overridden)


def replan(specmodel: SpecModel, the_plan: Plan, status: SpecModelStatus) -> Plan:
    """The plan once the guard's decision is folded into `status` (the revisions' verdicts, the
    kill switch): the revisions as `the_plan` recorded them, served as the decision says."""
    desired = next(r for r in status.revisions if r.number == the_plan.desired.number)
    the_rollout = None
    if the_plan.rollout is not None:
        the_rollout = rollouts.restepped(specmodel, status.rollout, status.kill_switch)
    replanned = _serving(
        specmodel,
        status.revisions,
        desired,
        status.kill_switch,
        the_plan.retry_token,
        the_plan.new_revision,
        the_rollout,
    )
    return replace(
        replanned, rollout_override=the_plan.rollout_override, overridden=the_plan.overridden
    )


def _serving(
    specmodel: SpecModel,
    revisions: list[RevisionRecord],
    desired: RevisionRecord,
    kill_switch: KillSwitchStatus | None,
    retry_token: str | None,
    new_revision: bool,
    rollout: RolloutStatus | None,
) -> Plan:
    active = _active(revisions, desired, rollout)
    speculation, source = killswitch.speculation(specmodel, kill_switch)
    return Plan(
        desired=desired,
        active=active,
        speculation=speculation,
        speculation_source=source,
        canary=killswitch.runs_canary(source, kill_switch),
        revisions=revisions,
        retry_token=retry_token,
        new_revision=new_revision,
        rollout=rollout,
    )


def _active(
    revisions: list[RevisionRecord], desired: RevisionRecord, rollout: RolloutStatus | None
) -> RevisionRecord:
    """The control while a rollout runs and after it aborted (the fleet untouched); else the
    desired revision unless it was judged bad (then the rollback target)."""
    control = rollouts.control_of(rollout, revisions)
    if control is not None and (
        rollouts.running(rollout) or desired.verdict == RevisionVerdict.BAD
    ):
        return control
    if desired.verdict != RevisionVerdict.BAD:
        return desired
    return rollback_target(revisions, desired.number) or desired


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
        verdict=RevisionVerdict.PROBATION,
        created=now.isoformat(),
    )
    return _bounded([*status.revisions, record], status.active_revision), record, True


def _bounded(revisions: list[RevisionRecord], serving: int | None) -> list[RevisionRecord]:
    """Keep the newest MAX_REVISION_HISTORY, the oldest of them giving way to those that may
    serve again (`_may_serve_again`)."""
    if len(revisions) <= MAX_REVISION_HISTORY:
        return revisions
    pinned = _may_serve_again(revisions, serving)
    rest = [r.number for r in revisions if r.number not in pinned]
    kept = pinned | set(rest[len(rest) - (MAX_REVISION_HISTORY - len(pinned)) :])
    return [r for r in revisions if r.number in kept]


def _may_serve_again(revisions: list[RevisionRecord], serving: int | None) -> set[int]:
    """The revision serving (a canary rollout's control: trimmed, the new revision would go to
    the whole fleet unjudged), the last good (`lastGoodRevision`), and where a rollback goes
    leaving the serving revision or the newest."""
    numbers = [r.number for r in revisions]
    served = [n for n in numbers if n == serving]
    targets = [rollback_target(revisions, n) for n in [numbers[-1], *served]]
    good = [r.number for r in revisions if r.verdict == RevisionVerdict.GOOD]
    return {*served, *good[-1:], *(t.number for t in targets if t)}


def rollback_target(revisions: list[RevisionRecord], leaving: int) -> RevisionRecord | None:
    """The newest revision but `leaving` with good evidence: promoted, or on probation having
    served clean (N windows in a row judged good). One never judged good is never chosen."""
    for record in reversed(revisions):
        if record.number != leaving and served_well(record):
            return record
    return None


def served_well(record: RevisionRecord) -> bool:
    """Good evidence: promoted, or on probation having served clean."""
    if record.verdict == RevisionVerdict.GOOD:
        return True
    return record.verdict == RevisionVerdict.PROBATION and record.served_clean
