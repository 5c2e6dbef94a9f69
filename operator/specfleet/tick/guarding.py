"""Between telemetry and status: builds the guard's Situation from what the controller knows and
folds its Decision back into status. Pure."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from specfleet.api import Decision as DecisionRecord
from specfleet.api import SpecModel, SpecModelStatus
from specfleet.api.spec import GuardSpec, SpeculativeSpec
from specfleet.api.status import (
    MAX_DECISIONS,
    ClassSpeculationState,
    GuardStatus,
    KillSwitchStatus,
    RevisionRecord,
    RevisionVerdict,
)
from specfleet.guard import Action, Decision, Policy, Situation, killswitch
from specfleet.telemetry.model import Observation
from specfleet.tick import rollouts
from specfleet.tick.observed import Observed, Rollout
from specfleet.tick.plan import Plan, rollback_target

ROUTED = frozenset({ClassSpeculationState.PLAIN, ClassSpeculationState.TRIAL})
"""A class in these states is served by the plain pool (a trial's share aside)."""


def situation(
    specmodel: SpecModel,
    status: SpecModelStatus,
    the_plan: Plan,
    observed: Observed,
    observation: Observation | None,
    now: datetime,
    speculative: SpeculativeSpec | None = None,
) -> Situation:
    """`observed`: the children as watched (has the fleet settled, has a rollout's canary
    stalled)."""
    override = killswitch.override(the_plan.speculation_source)
    target = rollback_target(the_plan.revisions, the_plan.active.number)
    policy = Policy.of(specmodel, override, speculative)
    the_rollout = the_plan.rollout if the_plan.rollout_pods else None
    return Situation(
        policy=replace(policy, replicas=policy.replicas - the_plan.rollout_pods),
        guard=status.guard or GuardStatus(),
        kill_switch=status.kill_switch or KillSwitchStatus(),
        revision=the_plan.active,
        has_last_good=target is not None,
        speculation=the_plan.speculation,
        settled=settled(status, the_plan, observed.fleet, specmodel.spec.guard, now),
        observation=observation,
        now=now,
        canary=judged_canary(status, the_plan, observation, specmodel.spec.guard, now),
        rollback_target=target.number if target else None,
        rollout=the_rollout,
        rollout_stalled=observed.rollout.deadline_exceeded if the_rollout else None,
        routed=frozenset(c.name for c in status.class_speculation if c.state in ROUTED),
    )


def settled(
    status: SpecModelStatus, the_plan: Plan, rollout: Rollout, guard: GuardSpec, now: datetime
) -> bool:
    """Judge a window only when every pod in it ran the current plan: rollout complete, running
    the planned speculation, and complete for at least one window."""
    if not rollout.complete or rollout.speculation_running != the_plan.speculation:
        return False
    plan_status = status.serving_plan
    if plan_status is None or plan_status.revision != the_plan.active.number:
        return False
    ready = next((c for c in status.conditions if c.type == "Ready"), None)
    if ready is None or ready.status != "True" or ready.last_transition_time is None:
        return False
    return _since(ready.last_transition_time, now) >= guard.window_seconds


def judged_canary(
    status: SpecModelStatus,
    the_plan: Plan,
    observation: Observation | None,
    guard: GuardSpec,
    now: datetime,
) -> Observation | None:
    """A trial's canary window (the active revision's pods with speculation, beside a fleet
    without), once the canary has served long enough (`killswitch.canary_judged`); a rollout's
    (the new revision's pods) once its step's pods have served an interval."""
    if the_plan.rollout_pods and the_plan.rollout and observation is not None:
        since = the_plan.rollout.step_since
        judged = since is not None and _since(since, now) >= guard.interval_seconds
        return observation.canary if judged else None
    canary = status.canary
    if not the_plan.canary or observation is None or canary is None or canary.ready_since is None:
        return None
    judged = killswitch.canary_judged(canary.ready_since, guard, now)
    return observation.canary if judged else None


def _since(stamp: str, now: datetime) -> float:
    return (now - datetime.fromisoformat(stamp)).total_seconds()


def apply_decision(
    status: SpecModelStatus, the_plan: Plan, decision: Decision, now: datetime
) -> SpecModelStatus:
    revisions = [_judged(r, the_plan, decision) for r in the_plan.revisions]
    kill_switch = killswitch.after_decision(
        the_plan.speculation_source, status.kill_switch, decision.kill_switch
    )
    return recorded(status, decision.actions, now).model_copy(
        update={
            "guard": decision.guard,
            "kill_switch": kill_switch,
            "revisions": revisions,
            "rollout": rollouts.judged(the_plan.rollout, decision.rollout_step),
            "classes": decision.classes or status.classes,
            "acceptance": decision.acceptance or status.acceptance,
        }
    )


def _judged(record: RevisionRecord, the_plan: Plan, decision: Decision) -> RevisionRecord:
    """The active revision's verdict as decided; a rollout's revision good once this decision
    promoted it, bad once it aborted it."""
    if record.number == the_plan.active.number:
        judged: dict[str, object] = {"verdict": decision.verdict}
        if decision.verdict == RevisionVerdict.BAD:
            judged["served_clean"] = False  # rolled back: no longer a rollback target
        elif decision.served_clean:
            judged["served_clean"] = True
        return record.model_copy(update=judged)
    ended = decision.rollout_step.ended if decision.rollout_step else None
    if (
        ended is not None
        and the_plan.rollout is not None
        and record.number == the_plan.rollout.revision
        and record.verdict == RevisionVerdict.PROBATION
    ):
        return record.model_copy(update={"verdict": rollouts.ENDED_VERDICT[ended]})
    return record


def recorded(status: SpecModelStatus, actions: list[Action], now: datetime) -> SpecModelStatus:
    """Status with the actions recorded as decisions."""
    records = [
        DecisionRecord(
            time=now.isoformat(),
            action=a.action,
            reason=a.reason,
            message=a.message,
            evidence={**a.evidence, **({"dryRun": True} if a.dry_run else {})},
        )
        for a in actions
    ]
    return status.model_copy(update={"decisions": (status.decisions + records)[-MAX_DECISIONS:]})
