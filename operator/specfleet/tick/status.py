"""Status as a pure function of what the controller planned and what it sees in the cluster.

Conditions keep their lastTransitionTime while their status holds, so an unchanged world makes
an unchanged status, and an unchanged status is never written.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from specfleet.api import Condition, ConditionType, Phase, SpecModel, SpecModelStatus
from specfleet.api.status import (
    NO_SPECULATION,
    CanaryState,
    CanaryStatus,
    DecisionReason,
    GuardStatus,
    RevisionVerdict,
    RolloutPhase,
    ServingPlanStatus,
    SpeculationSource,
)
from specfleet.guard import killswitch
from specfleet.render.workload import canary_name
from specfleet.tick import rollouts
from specfleet.tick.observed import Observed, Rollout
from specfleet.tick.plan import Plan
from specfleet.tick.pools import pools, speculating


def next_status(
    specmodel: SpecModel, plan: Plan, observed: Observed, previous: SpecModelStatus, now: datetime
) -> SpecModelStatus:
    """The status to write. Guard-owned fields (classes, decisions, acceptance) carry over."""
    state = observed.fleet
    generation = specmodel.metadata.generation
    conditions = [
        condition(c, generation, previous.conditions, now)
        for c in _conditions(specmodel, plan, observed, state, previous)
    ]
    return previous.model_copy(
        update={
            "observed_generation": generation,
            "phase": _phase(conditions),
            "conditions": conditions,
            "speculation": _speculation_summary(specmodel),
            "speculation_active": state.speculation_running,
            "serving_plan": ServingPlanStatus(
                revision=plan.active.number,
                speculation=plan.speculation,
                reason=plan.speculation_source,
            ),
            "desired_revision": plan.desired.number,
            "active_revision": plan.active.number,
            "last_good_revision": max(
                (r.number for r in plan.revisions if r.verdict == RevisionVerdict.GOOD),
                default=None,
            ),
            "revisions": plan.revisions,
            "kill_switch": killswitch.after_plan(
                plan.speculation_source, plan.speculation, previous.kill_switch, now
            ),
            "canary": _canary(specmodel, plan, observed.canary, previous, now),
            "rollout": rollouts.seen(plan.rollout, plan.speculation, observed.rollout, now),
            "rollout_override": plan.rollout_override,
            "retry_token": plan.retry_token,
            "replicas": state.replicas,
            **_class_speculation(specmodel, plan, observed, previous),
        }
    )


def _class_speculation(
    specmodel: SpecModel, plan: Plan, observed: Observed, previous: SpecModelStatus
) -> dict[str, Any]:
    switches = previous.guard.class_switches if previous.guard else []
    served = pools(specmodel, plan, observed.plain, previous.classes, switches)
    return {
        "classes_speculating": speculating(served.classes),
        "class_speculation": served.classes,
        "plain_pool": observed.plain.replicas if served.plain else None,
    }


def invalid_status(
    specmodel_generation: int | None, problems: list[str], previous: SpecModelStatus, now: datetime
) -> SpecModelStatus:
    message = "; ".join(problems)
    raw = [
        ("Degraded", "True", "InvalidSpec", message),
        (
            "Ready",
            "False",
            "InvalidSpec",
            "the spec cannot be served; the last applied children stay",
        ),
    ]
    conditions = [condition(c, specmodel_generation, previous.conditions, now) for c in raw]
    kept = [c for c in previous.conditions if c.type not in {"Degraded", "Ready"}]
    return previous.model_copy(
        update={
            "observed_generation": specmodel_generation,
            "phase": Phase.INVALID,
            "conditions": conditions + kept,
        }
    )


RawCondition = tuple[str, str, str, str]


def _conditions(
    specmodel: SpecModel,
    plan: Plan,
    observed: Observed,
    state: Rollout,
    previous: SpecModelStatus,
) -> list[RawCondition]:
    replicas = state.replicas
    pending = observed.unschedulable
    ready_message = f"{replicas.available}/{replicas.desired} replicas available"
    if state.complete:
        ready = ("Ready", "True", "Available", ready_message)
        progressing = ("Progressing", "False", "RolloutComplete", ready_message)
    else:
        ready = ("Ready", "False", "RollingOut", ready_message)
        progressing = (
            "Progressing",
            "True",
            "RollingOut",
            f"{replicas.updated}/{replicas.desired} replicas updated, {ready_message}",
        )
    if observed.apply_error:
        degraded = ("Degraded", "True", "ApplyFailed", observed.apply_error)
    elif state.deadline_exceeded:
        degraded = ("Degraded", "True", "ProgressDeadlineExceeded", state.deadline_exceeded)
        progressing = ("Progressing", "False", "ProgressDeadlineExceeded", state.deadline_exceeded)
    elif pending:
        degraded = ("Degraded", "True", "Unschedulable", pending)
    else:
        degraded = ("Degraded", "False", "AsExpected", "")
    if plan.rollout is not None and rollouts.running(plan.rollout):
        progressing = ("Progressing", "True", "CanaryStep", plan.rollout.message)
    return [
        ready,
        progressing,
        degraded,
        _speculation_condition(specmodel, plan, state),
        _rolled_back_condition(plan),
        *_guard_conditions(previous),
    ]


def _guard_conditions(status: SpecModelStatus) -> list[RawCondition]:
    guard = status.guard or GuardStatus()
    last = {d.reason: d.message for d in status.decisions}
    blind = (
        ("MetricsBlind", "True", "NoData", last.get(DecisionReason.METRICS_BLIND, "no metrics"))
        if guard.blind
        else ("MetricsBlind", "False", "MetricsFlowing", "")
    )
    flapping = (
        (
            "Flapping",
            "True",
            "TooManyActions",
            last.get(DecisionReason.FLAPPING, "too many actions"),
        )
        if guard.flapping
        else ("Flapping", "False", "Stable", "")
    )
    return [blind, flapping]


def _speculation_condition(specmodel: SpecModel, plan: Plan, state: Rollout) -> RawCondition:
    kind = ConditionType.SPECULATION_ACTIVE.value
    if specmodel.spec.speculative is None:
        return (kind, "False", "NotConfigured", "the spec declares no speculative decoding")
    if plan.canary:
        replicas = specmodel.spec.pod.replicas
        return (
            kind,
            "False",
            "CanaryTrial",
            f"speculation off on the {replicas} replicas; a trial runs it on the canary "
            f"{canary_name(specmodel.metadata.name)} (1 pod of {replicas + 1})",
        )
    if not plan.speculation:
        reason = {
            SpeculationSource.ANNOTATION: "DisabledByAnnotation",
            SpeculationSource.SPEC: "DisabledBySpec",
            SpeculationSource.GUARD: "KillSwitchEngaged",
        }[plan.speculation_source]
        return (kind, "False", reason, f"speculation off ({plan.speculation_source})")
    method = _speculation_summary(specmodel)
    if state.speculation_running and state.complete:
        return (kind, "True", "Enabled", f"serving with {method}")
    return (kind, "False", "RollingOut", f"rolling out {method}")


def _rolled_back_condition(plan: Plan) -> RawCondition:
    kind = ConditionType.ROLLED_BACK.value
    if not plan.rolled_back:
        return (kind, "False", "ServingDesiredRevision", f"serving revision {plan.active.number}")
    aborted = plan.rollout
    if aborted is not None and aborted.phase == RolloutPhase.ABORTED:
        return (kind, "True", "CanaryAborted", aborted.message)
    active = plan.active
    why = "the last good revision"
    if active.verdict != RevisionVerdict.GOOD:
        why = "on probation, it served clean"
    return (
        kind,
        "True",
        "RolledBackToLastGood",
        f"revision {plan.desired.number} ({plan.desired.hash}) was judged bad; serving "
        f"revision {active.number} ({active.hash}, {why}) until the engine config or the "
        "specfleet.dev/retry annotation changes",
    )


def condition(
    raw: RawCondition, generation: int | None, previous: list[Condition], now: datetime
) -> Condition:
    """`raw` as a condition that keeps its lastTransitionTime while its status holds."""
    kind, status, reason, message = raw
    old = next((c for c in previous if c.type == kind), None)
    since = old.last_transition_time if old and old.status == status else now.isoformat()
    return Condition(
        type=kind,
        status=status,
        reason=reason,
        message=message,
        observed_generation=generation,
        last_transition_time=since,
    )


def _phase(conditions: list[Condition]) -> Phase:
    status = {c.type: c.status for c in conditions}
    if status.get("Degraded") == "True":
        return Phase.DEGRADED
    if status.get("Ready") == "True":
        return Phase.READY
    if status.get("Progressing") == "True":
        return Phase.PROGRESSING
    return Phase.PENDING


def _speculation_summary(specmodel: SpecModel) -> str:
    speculative = specmodel.spec.speculative
    return (
        f"{speculative.method}/{speculative.num_speculative_tokens}"
        if speculative
        else NO_SPECULATION
    )


def _canary(
    specmodel: SpecModel,
    plan: Plan,
    deployment: Rollout,
    previous: SpecModelStatus,
    now: datetime,
) -> CanaryStatus | None:
    """The trial's canary: serving once its Deployment is complete, since when it first was
    (for this revision)."""
    if not plan.canary:
        return None
    old = previous.canary
    since = None
    if deployment.complete:
        kept = old and old.revision == plan.active.number and old.ready_since
        since = kept or now.isoformat()
    return CanaryStatus(
        deployment=canary_name(specmodel.metadata.name),
        revision=plan.active.number,
        state=CanaryState.SERVING if since else CanaryState.STARTING,
        ready_since=since,
    )
