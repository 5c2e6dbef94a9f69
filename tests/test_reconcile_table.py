"""The operator shell as a table, in the style of Knative's reconciler tests: given a SpecModel's
history (its spec, the status written, its children as watched), one reconcile with a guard
tick's window or without, and failures injected on chosen requests; then the exact requests the
API server saw (applies, deletes, status writes with their key fields), the exact Events and the
alerts delivered, each compared whole.

Everything below `Operator.reconcile` is real: `controller.reconcile`, the pure tick and `Kube`
(its retries and its 404 handling) over an API server in memory (`fake_api`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from fake_api import TIMEOUT, Failure, Request, no_backoff
from shell_world import KEY, World
from specfleet.alerts.sender import Delivery
from specfleet.telemetry.model import Observation
from specfleet.tick.step import GuardTick
from test_guard import observe

CLASSES = [
    {"name": "code", "critical": True, "slo": {"minAcceptanceRate": 0.5}},
    {"name": "chat", "slo": {"minAcceptanceRate": 0.5, "minToolCallValidity": 0.9}},
]
SPEC = {
    "speculative": {"method": "eagle3", "draftModel": "d", "numSpeculativeTokens": 4},
    "classes": CLASSES,
    "defaultClass": "chat",
    "pod": {"replicas": 2},
}
NEXT_REVISION = {"speculative": {"numSpeculativeTokens": 3}}
VALID: dict[str, Any] = {
    "tool_calls_valid": 98.0,
    "tool_calls_invalid": 2.0,
    "p95_tpot_seconds": 0.02,
}
NAMESPACE_GONE = (
    '{"kind":"Status","status":"Failure","reason":"NotFound",'
    '"details":{"name":"ns","kind":"namespaces"},"code":404}'
)


def good() -> Observation:
    return observe(0.8, 0.8, **VALID)


def broken() -> Observation:
    """Chat's tool calls 60% valid, far under its 90% floor: the revision's fault."""
    return observe(0.8, 0.8, tool_calls_valid=60.0, tool_calls_invalid=40.0)


def collapsed() -> Observation:
    """Acceptance 0.1 in both classes: speculation does not pay, decisively."""
    return observe(0.1, 0.1, **VALID)


def chat_drafts_badly() -> Observation:
    """Chat's acceptance under its floor; the fleet's speedup still pays."""
    return observe(0.8, 0.3, **VALID)


def beside_rollout(canary: dict[str, float] | None = None, tpot: float = 0.02) -> Observation:
    """The control's window (revision 1) and the rollout canary's (revision 2) beside it."""
    beside = replace(observe(0.8, 0.8, tpot=tpot, **(VALID | (canary or {}))), revision=2)
    return replace(good(), canary=beside)


def beside_trial() -> Observation:
    """The fleet's window without speculation, a trial's canary paying well beside it."""
    fleet = observe(0.8, 0.8, speculation=False, **VALID)
    return replace(fleet, canary=observe(0.8, 0.8, tpot=0.008, **VALID))


# Histories: each a World that has settled (the watches show everything written).


def created() -> World:
    """A SpecModel just applied, never reconciled."""
    return World(SPEC)


def serving(**spec: Any) -> World:
    """Reconciled, its pods up and Ready for ten minutes, three good windows judged."""
    world = World({**SPEC, **spec})
    world.settle()
    world.wait(600)
    world.tick(good(), good(), good())
    return world


def canary_starting() -> World:
    """Serving revision 1; revision 2's rollout canary pod just became available."""
    world = serving()
    world.change(**NEXT_REVISION)
    world.settle()
    return world


def pushed_on_probation() -> World:
    """Serving revision 1, still on probation; Git pushed revisions 2 to 10 since, each
    replacing the last one's canary beside revision 1."""
    world = serving()
    for k in range(5, 14):
        world.change(speculative={"numSpeculativeTokens": k})
        world.settle()
    return world


def breaking() -> World:
    """A direct rollout: revision 2 serves the whole fleet and breached two windows in a row."""
    world = serving(rollout={"strategy": "direct"})
    world.change(**NEXT_REVISION)
    world.settle()
    world.wait(60)
    world.tick(broken(), broken())
    return world


def rolled_back_and_restarted() -> World:
    """Revision 2 was rolled back to revision 1; the operator restarted since."""
    world = breaking()
    world.tick(broken())
    world.restart()
    return world


def rolled_back_untold_and_taken_over() -> World:
    """Revision 2 was rolled back by a leader that died between the status write and its
    Events; another replica leads now."""
    world = rolled_back_and_restarted()
    world.api.events.clear()
    return world


def rolled_back_then_reverted() -> World:
    """Revision 2 was rolled back; then Git reverted to revision 1's engine config."""
    world = breaking()
    world.tick(broken())
    world.change(speculative={"numSpeculativeTokens": 4})
    world.settle()
    return world


def engaged() -> World:
    """A collapse engaged the kill switch; the fleet serves without speculation."""
    world = serving()
    world.tick(collapsed())
    return world


def cooling_down() -> World:
    """Engaged, three windows into the 60 s cooldown."""
    world = engaged()
    world.tick(*[observe(0.8, 0.8, speculation=False, **VALID)] * 3)
    return world


def on_trial() -> World:
    """Engaged; after the cooldown a trial's canary has run speculation for a minute."""
    world = cooling_down()
    world.tick(*[observe(0.8, 0.8, speculation=False, **VALID)] * 5)
    return world


def going_blind() -> World:
    """Serving; then no data for 105 s."""
    world = serving()
    world.tick(*[None] * 7)
    return world


def with_leftover() -> World:
    """Serving, and a trial's canary left over from another operator's life."""
    world = serving()
    meta = {"name": "m-canary", "namespace": "ns"}
    leftover = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta}
    world.api.objects[("Deployment", "m-canary")] = leftover
    return world


def blind_then_data() -> World:
    """Blind for 120 s: MetricsBlind."""
    world = going_blind()
    world.tick(None)
    return world


def being_deleted() -> World:
    """Serving; then deleted (its finalizers still run)."""
    world = serving()
    world.deleted = True
    return world


@dataclass(frozen=True)
class Row:
    name: str
    given: Callable[[], World]
    """The history: what the API server holds and the watches show, and what the operator
    remembers."""
    change: dict[str, Any] = field(default_factory=dict)
    """Git applies this over the spec first (a new generation)."""
    tick: GuardTick | None = None
    """A guard tick (its window; None, no data at all), or none."""
    fail: tuple[Failure, ...] = ()
    requests: tuple[str, ...] = ()
    """`verb Kind/name` (apply, delete, status with its key fields, read; an Event posted is
    in `events`), a request failed as `-> answer`; `*` stands for any text."""
    events: tuple[str, ...] = ()
    """`Type Reason: message`, the message a glob (`*`)."""
    alerts: tuple[str, ...] = ()
    """One a delivery: `firing|resolved Alert{labels}, ...`."""
    error: str | None = None
    """The reconcile's error, a glob; `raised X` when it raised X."""
    backs_off: bool = False


SCALED = {"pod": {"replicas": 3}}
"""A change that rolls nothing but the fleet's Deployment (replicas are no revision)."""
SCALED_STATUS = "status SpecModel/m: Ready, revision 1, speculation on"
RETRIES = 5
"""`Kube`'s attempts at a request that keeps failing transiently."""
ROLLED_BACK = (
    "Warning RolledBack: Revision 2 breaches its SLOs (chat: toolCallValidity 0.600 < 0.900 "
    "(n=100)): rolled back to revision 1 until the engine config or specfleet.dev/retry changes."
)
ROLLBACK_ALERTS = (
    "firing SpecfleetRolledBack, SpecfleetClassBreach{class=chat,signal=toolCallValidity}"
)
ROWS = [
    Row(
        "a new SpecModel: its revision kept, its children applied, its status and Events",
        created,
        requests=(
            "apply ControllerRevision/m-*",
            "apply ConfigMap/m-gateway",
            "apply Deployment/m",
            "apply Service/m",
            "apply PodDisruptionBudget/m",
            "status SpecModel/m: Progressing, revision 1, speculation on",
        ),
        events=(
            "Normal RevisionCreated: revision 1 (*) for generation 1",
            "Normal ChildrenApplied: applied 4 and pruned 0 children for revision 1",
        ),
    ),
    Row("an unchanged SpecModel in an unchanged cluster: no request", serving),
    Row(
        "a guard tick judging a good window writes its evaluation and nothing else",
        serving,
        tick=GuardTick(good()),
        requests=("status SpecModel/m: Ready, revision 1, speculation on",),
    ),
    Row(
        "a new engine config starts a canary rollout beside the fleet on the control",
        serving,
        change=NEXT_REVISION,
        requests=(
            "read ControllerRevision/m-*",  # the control's config, kept by revision 1
            "apply ControllerRevision/m-*",
            "apply Deployment/m",
            "apply ConfigMap/m-rollout-gateway",
            "apply Deployment/m-rollout",
            "status SpecModel/m: Ready, revision 1 of 2, speculation on, "
            "rollout Progressing step 1/1",
        ),
        events=(
            "Normal RevisionCreated: revision 2 (*) for generation 2",
            "Normal ChildrenApplied: applied 3 and pruned 0 children for revision 1",
        ),
    ),
    Row(
        "an eleventh revision still rolls out as a canary on the control serving on probation",
        pushed_on_probation,
        change={"speculative": {"numSpeculativeTokens": 14}},
        requests=(  # revision 1 outlives the history's bound: trimmed, 11 would serve unjudged
            "apply ControllerRevision/m-*",
            "apply ConfigMap/m-rollout-gateway",
            "apply Deployment/m-rollout",
            "status SpecModel/m: Ready, revision 1 of 11, speculation on, "
            "rollout Progressing step 1/1",
        ),
        events=(
            "Normal RevisionCreated: revision 11 (*) for generation 11",
            # no CanaryStepServing yet: m-rollout still runs revision 10, the canary it replaces
            "Normal ChildrenApplied: applied 2 and pruned 0 children for revision 1",
        ),
    ),
    Row(
        "a third breaching window rolls back to the last good revision, told once",
        breaking,
        tick=GuardTick(broken()),
        requests=(
            "status SpecModel/m: Ready, revision 1 of 2, speculation on, "
            "RolledBack RolledBackToLastGood",
            "apply ConfigMap/m-gateway",
            "apply Deployment/m",
        ),
        events=(
            ROLLED_BACK,
            "Normal ChildrenApplied: applied 2 and pruned 0 children for revision 1",
        ),
        alerts=(ROLLBACK_ALERTS,),
    ),
    Row(
        "Git brings back a revision judged bad: rolled back, told by the condition alone",
        rolled_back_then_reverted,
        change=NEXT_REVISION,
        requests=(  # revision 1 serves already
            "status SpecModel/m: Ready, revision 1 of 2, speculation on, "
            "RolledBack RolledBackToLastGood",
        ),
        events=(
            "Warning RolledBack: revision 2 (*) was judged bad; serving revision 1 (*, on "
            "probation, it served clean) until the engine config or the specfleet.dev/retry "
            "annotation changes",
        ),
        alerts=(ROLLBACK_ALERTS,),
    ),
    Row(
        "a decisive window aborts a canary rollout: the canary goes, the fleet stays",
        canary_starting,
        tick=GuardTick(beside_rollout({"p95_tpot_seconds": 0.05}, tpot=0.05)),
        requests=(
            "status SpecModel/m: Ready, revision 1 of 2, speculation on, "
            "rollout Aborted step 1/1, RolledBack CanaryAborted",
            "apply Deployment/m",
            "delete ConfigMap/m-rollout-gateway",
            "delete Deployment/m-rollout",
        ),
        events=(
            # the RolledBack condition's Event (every rollback has one), then the decision's
            "Warning RolledBack: chat p95TpotSeconds: Revision 2 aborted at canary step 1 of 1 *",
            "Warning RolloutAborted: Revision 2 aborted at canary step 1 of 1 after 1 decisive "
            "window: chat: p95TpotSeconds 0.050 on the canary vs control 0.020, limit 0.025 *",
            "Normal ChildrenApplied: applied 1 and pruned 2 children for revision 1",
        ),
        alerts=("firing SpecfleetRolledBack",),
    ),
    Row(
        "a collapse engages the kill switch and names each class",
        serving,
        tick=GuardTick(collapsed()),
        requests=(
            "status SpecModel/m: Ready, revision 1, speculation off, kill switch engaged",
            "apply ConfigMap/m-gateway",
            "apply Deployment/m",
        ),
        events=(
            "Warning SpeculationDisabled: speculation off (by guard)",
            "Warning ClassBreach: Class code (critical) breaches after 1 decisive window: "
            "acceptanceRate 0.100 < 0.500 (n=200). This decision changes nothing that runs.",
            "Warning ClassBreach: Class chat (not critical) breaches after 1 decisive window: "
            "acceptanceRate 0.100 < 0.500 (n=200). This decision changes nothing that runs.",
            "Warning SpeculationNotPaying: Speculation off after 1 decisive window: *",
            "Normal ChildrenApplied: applied 2 and pruned 0 children for revision 1",
        ),
        alerts=(
            "firing SpecfleetKillSwitchEngaged, "
            "SpecfleetClassBreach{class=code,signal=acceptanceRate}, "
            "SpecfleetClassBreach{class=chat,signal=acceptanceRate}",
        ),
    ),
    Row(
        "after the cooldown a trial runs speculation on a canary pod",
        cooling_down,
        tick=GuardTick(observe(0.8, 0.8, speculation=False, **VALID)),
        requests=(
            "status SpecModel/m: Ready, revision 1, speculation off, kill switch trial, "
            "canary Starting",
            "apply ConfigMap/m-canary-gateway",
            "apply Deployment/m-canary",
        ),
        events=(
            "Normal CanaryCreated: canary m-canary runs revision 1 with speculation",
            "Warning TrialStarted: Trial after the cooldown: a canary pod runs revision 1 with "
            "speculation beside the 2 replicas without it (1 pod of 3); *",
            "Normal ChildrenApplied: applied 2 and pruned 0 children for revision 1",
        ),
    ),
    Row(
        "a trial that pays releases the kill switch and removes the canary",
        on_trial,
        tick=GuardTick(beside_trial()),
        requests=(
            "status SpecModel/m: Ready, revision 1, speculation on",
            "apply ConfigMap/m-gateway",
            "apply Deployment/m",
            "delete ConfigMap/m-canary-gateway",
            "delete Deployment/m-canary",
        ),
        events=(
            "Normal SpeculationEnabled: speculation on (by guard)",
            "Normal CanaryRemoved: canary m-canary removed",
            "Normal SpeculationPays: Speculation pays again on the canary, shown on 60 s of its "
            "serving *: kill switch released, the fleet rolls to speculation and the canary is "
            "removed.",
            "Normal ChildrenApplied: applied 2 and pruned 2 children for revision 1",
        ),
        alerts=(
            "resolved SpecfleetKillSwitchEngaged",
            # the collapse's class breaches, one-shot alerts, sent again with the set changed
            "firing SpecfleetClassBreach{class=code,signal=acceptanceRate}, "
            "SpecfleetClassBreach{class=chat,signal=acceptanceRate}",
        ),
    ),
    Row(
        "a class breach is named and alerted and changes nothing that runs",
        serving,
        tick=GuardTick(chat_drafts_badly()),
        requests=("status SpecModel/m: Ready, revision 1, speculation on",),
        events=(
            "Warning ClassBreach: Class chat (not critical) breaches after 1 decisive window: "
            "acceptanceRate 0.300 < 0.500 (n=200). This decision changes nothing that runs.",
        ),
        alerts=("firing SpecfleetClassBreach{class=chat,signal=acceptanceRate}",),
    ),
    Row(
        "no data for blindAfterSeconds: MetricsBlind, the state held",
        going_blind,
        tick=GuardTick(None),
        requests=("status SpecModel/m: Ready, revision 1, speculation on, MetricsBlind NoData",),
        events=(
            "Warning MetricsBlind: No data for 120s (no series); the guard holds the current "
            "state.",
        ),
        alerts=("firing SpecfleetMetricsBlind",),
    ),
    Row(
        "data back: MetricsBlind cleared, good news",
        blind_then_data,
        tick=GuardTick(good()),
        requests=("status SpecModel/m: Ready, revision 1, speculation on",),
        events=(
            "Normal MetricsRestored: Data is back after 135s; the guard resumes, and a pending "
            "judgement's deadline moves back by the time no window covered.",
        ),
        alerts=("resolved SpecfleetMetricsBlind",),
    ),
    Row(
        "an apply answered 409 is retried",
        serving,
        change=SCALED,
        fail=(Failure("apply", "Deployment/m", 409),),
        requests=("apply Deployment/m -> 409", "apply Deployment/m", SCALED_STATUS),
        events=("Normal ChildrenApplied: applied 1 and pruned 0 children for revision 1",),
    ),
    Row(
        "a child gone before its prune (404) is pruned",
        with_leftover,
        fail=(Failure("delete", "Deployment/m-canary", 404),),
        requests=("delete Deployment/m-canary -> 404",),
        events=("Normal ChildrenApplied: applied 0 and pruned 1 children for revision 1",),
    ),
    Row(
        "a namespace being deleted (404 naming it): nothing more is written",
        serving,
        change=SCALED,
        fail=(Failure("apply", "*", 404, body=NAMESPACE_GONE),),
        requests=("apply Deployment/m -> 404",),
    ),
    Row(
        "an apply that keeps failing (500) is in status and backs off",
        serving,
        change=SCALED,
        fail=(Failure("apply", "Deployment/m", 500, times=RETRIES),),
        requests=(
            *["apply Deployment/m -> 500"] * RETRIES,
            "status SpecModel/m: Degraded, revision 1, speculation on, Degraded ApplyFailed",
        ),
        events=("Warning ApplyFailed: API server answered 500 Internal Server Error: *",),
        error="API server answered 500 Internal Server Error: *",
        backs_off=True,
    ),
    Row(
        "an apply that keeps timing out is a failed apply like a 500's",
        serving,
        change=SCALED,
        fail=(Failure("apply", "Deployment/m", TIMEOUT, times=RETRIES),),
        requests=(
            *["apply Deployment/m -> timeout"] * RETRIES,
            "status SpecModel/m: Degraded, revision 1, speculation on, Degraded ApplyFailed",
        ),
        events=("Warning ApplyFailed: API server did not answer: *Read timed out.",),
        error="API server did not answer: *Read timed out.",
        backs_off=True,
    ),
    Row(
        "a status write answered 500 once is retried",
        serving,
        change=SCALED,
        fail=(Failure("status", "SpecModel/m", 500),),
        requests=("apply Deployment/m", "status SpecModel/m -> 500", SCALED_STATUS),
        events=("Normal ChildrenApplied: applied 1 and pruned 0 children for revision 1",),
    ),
    Row(
        "a status write timing out once is retried",
        serving,
        change=SCALED,
        fail=(Failure("status", "SpecModel/m", TIMEOUT),),
        requests=("apply Deployment/m", "status SpecModel/m -> timeout", SCALED_STATUS),
        events=("Normal ChildrenApplied: applied 1 and pruned 0 children for revision 1",),
    ),
    Row(
        # The Events and alerts wait for a status that says so; the worker logs the failure
        # and the next watch event or the resync reconciles again.
        "a status write that keeps failing (500) fails the reconcile before any Event",
        serving,
        change=SCALED,
        fail=(Failure("status", "SpecModel/m", 500, times=RETRIES),),
        requests=("apply Deployment/m", *["status SpecModel/m -> 500"] * RETRIES),
        error="raised ApiException",
    ),
    Row(
        "an Event the API server keeps failing is dropped; the rest goes on",
        breaking,
        tick=GuardTick(broken()),
        fail=(Failure("event", "Event/RolledBack", 500, times=RETRIES),),
        requests=(
            "status SpecModel/m: Ready, revision 1 of 2, speculation on, "
            "RolledBack RolledBackToLastGood",
            "apply ConfigMap/m-gateway",
            "apply Deployment/m",
            *["event Event/RolledBack -> 500"] * RETRIES,
        ),
        events=("Normal ChildrenApplied: applied 2 and pruned 0 children for revision 1",),
        alerts=(ROLLBACK_ALERTS,),
    ),
    Row(
        "an Event that keeps timing out is dropped too",
        serving,
        change=SCALED,
        fail=(Failure("event", "Event/ChildrenApplied", TIMEOUT, times=RETRIES),),
        requests=(
            "apply Deployment/m",
            SCALED_STATUS,
            *["event Event/ChildrenApplied -> timeout"] * RETRIES,
        ),
    ),
    Row(
        "after a restart the served revision's config is read back once; no write",
        rolled_back_and_restarted,
        # a new process looks for its recent decisions' Events by their keys: told already
        requests=("read ControllerRevision/m-*", *["read Event/m.*"] * 2),
        alerts=(ROLLBACK_ALERTS,),  # a new process: what holds fires again
    ),
    Row(
        "a new leader tells the decisions its predecessor wrote but did not tell, once",
        rolled_back_untold_and_taken_over,
        requests=("read ControllerRevision/m-*", *["read Event/m.*"] * 2),
        events=("Warning ClassBreach: Class chat *", "Warning RolledBack: *"),
        alerts=(ROLLBACK_ALERTS,),
    ),
    Row(
        "after a restart a revision's config read that times out is a failed apply",
        rolled_back_and_restarted,
        fail=(Failure("read", "ControllerRevision/*", TIMEOUT, times=RETRIES),),
        requests=(
            *["read ControllerRevision/m-* -> timeout"] * RETRIES,
            *["read Event/m.*"] * 2,
            "status SpecModel/m: Degraded, revision 1 of 2, speculation on, "
            "Degraded ApplyFailed, RolledBack RolledBackToLastGood",
        ),
        events=(
            "Warning ApplyFailed: the engine config of revision 1 (*) is unreadable; it is kept "
            "in its ControllerRevision",
        ),
        alerts=(ROLLBACK_ALERTS,),
        error="the engine config of revision 1 (*) is unreadable; *",
        backs_off=True,
    ),
    Row(
        "an invalid spec: status Invalid, one Warning, the children kept",
        serving,
        change={"defaultClass": "nowhere"},
        requests=("status SpecModel/m: Invalid, revision 1, speculation on, Degraded InvalidSpec",),
        events=("Warning InvalidSpec: spec.defaultClass: defaultClass must name one of classes*",),
        error="spec.defaultClass: defaultClass must name one of classes*",
    ),
    Row("a SpecModel being deleted is left alone", being_deleted),
]


@dataclass
class Seen:
    requests: list[str]
    events: list[str]
    alerts: list[str]
    error: str | None
    backs_off: bool


def reconcile_once(row: Row) -> Seen:
    """The row's history, its change and failures, then one reconcile a guard tick later."""
    world = row.given()
    if row.change:
        world.change(**row.change)
    world.api.failures.extend(replace(f) for f in row.fail)  # fresh counts, whatever ran before
    requests, events, deliveries = (
        len(world.api.requests),
        len(world.api.events),
        len(world.sender.deliveries),
    )
    world.wait(15)
    try:
        outcome = world.reconcile(row.tick)
        error = outcome.error if outcome else None
    except Exception as exc:
        error = f"raised {type(exc).__name__}"
    return Seen(
        [request_line(r) for r in world.api.requests[requests:] if not posted(r)],
        [f"{e['type']} {e['reason']}: {e['message']}" for e in world.api.events[events:]],
        [delivery_line(d) for d in world.sender.deliveries[deliveries:]],
        error,
        world.operator.retry_in(KEY) is not None,
    )


def posted(request: Request) -> bool:
    """An Event the API server took: in the Events column, not the requests'."""
    return request.verb == "event" and request.failed is None


def request_line(request: Request) -> str:
    line = f"{request.verb} {request.target}"
    if request.failed is not None:
        return f"{line} -> {request.failed}"
    if request.verb == "status" and request.body is not None:
        return f"{line}: {status_line(request.body)}"
    return line


def status_line(status: dict[str, Any]) -> str:
    """A status's key fields: phase, revisions, speculation, the guard's state, what is True
    that should not be."""
    active, desired = status.get("activeRevision"), status.get("desiredRevision")
    revision = f"revision {active}" + (f" of {desired}" if desired != active else "")
    speculation = (status.get("servingPlan") or {}).get("speculation")
    parts = [status["phase"], revision, f"speculation {'on' if speculation else 'off'}"]
    kill_switch = (status.get("killSwitch") or {}).get("state")
    if kill_switch not in (None, "released"):
        parts.append(f"kill switch {kill_switch}")
    if status.get("canary"):
        parts.append(f"canary {status['canary']['state']}")
    if rollout := status.get("rollout"):
        parts.append(f"rollout {rollout['phase']} step {rollout['step']}/{rollout['steps']}")
    parts += [
        f"{c['type']} {c['reason']}"
        for c in status.get("conditions", [])
        if c["status"] == "True" and c["type"] not in ("Ready", "Progressing", "SpeculationActive")
    ]
    return ", ".join(parts)


def delivery_line(delivery: Delivery) -> str:
    alerts = []
    for alert in delivery.alerts:
        labels = ",".join(f"{k}={v}" for k, v in sorted(alert.extra_labels.items()))
        alerts.append(f"{alert.name}{{{labels}}}" if labels else alert.name)
    return f"{'resolved' if delivery.resolved else 'firing'} {', '.join(alerts)}"


def matches(pattern: str, line: str) -> bool:
    """`pattern` is `line`, with `*` standing for any text."""
    return re.fullmatch(".*".join(map(re.escape, pattern.split("*"))), line, re.DOTALL) is not None


def whole(seen: list[str], expected: tuple[str, ...]) -> list[str]:
    """`seen`, each line that matches its expected pattern written as the pattern: equal to
    `expected` only when every line matches, in order, with none missing and none extra."""
    return [e if matches(e, s) else s for s, e in zip(seen, expected, strict=False)] + seen[
        len(expected) :
    ]


@pytest.mark.parametrize("row", ROWS, ids=lambda row: row.name)
def test_one_reconcile(row: Row, monkeypatch: pytest.MonkeyPatch) -> None:
    no_backoff(monkeypatch)
    seen = reconcile_once(row)
    assert whole(seen.requests, row.requests) == list(row.requests)
    assert whole(seen.events, row.events) == list(row.events)
    assert seen.alerts == list(row.alerts)
    assert seen.error == row.error or (
        seen.error is not None and row.error is not None and matches(row.error, seen.error)
    )
    assert seen.backs_off == row.backs_off


def test_the_table_covers_the_shells_ways_to_fail() -> None:
    injected = {(f.verb, f.answer) for row in ROWS for f in row.fail}
    assert {("apply", 409), ("delete", 404), ("apply", 404), ("status", 500)} <= injected
    assert {("apply", TIMEOUT), ("status", TIMEOUT), ("event", 500)} <= injected
    assert len(ROWS) >= 20
