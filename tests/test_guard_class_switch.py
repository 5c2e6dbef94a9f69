"""guard.routeClasses: a class whose own speculation does not pay is routed off alone, and
comes back by a trial judged on its sample's accumulated evidence."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

from specfleet.api import SpecModelStatus
from specfleet.api.status import ClassSwitch, KillSwitchState, KillSwitchStatus
from specfleet.guard import Decision, Situation, decide
from specfleet.guard.evidence import past_deadline
from specfleet.telemetry.model import ClassWindow, Observation
from test_guard import T0, policy, situation, window
from test_guard_classes import CLASSES, COLLAPSED, HEALTHY

ROUTED = {"routeClasses": True, "cooldownSeconds": 60, "trialDeadlineSeconds": 600}


def start(classes: list[dict[str, Any]] = CLASSES, **guard: Any) -> Situation:
    return situation(None, policy=policy(classes=classes, **{**ROUTED, **guard}))


def observe(**windows: ClassWindow | None) -> Observation:
    """Code and chat healthy at 200 requests each, prose absent, unless given."""
    classes: dict[str, ClassWindow | None] = {"code": window(0.8), "chat": window(0.7)}
    classes.update(windows)
    present = {name: w for name, w in classes.items() if w is not None}
    return Observation(at=T0, window_seconds=60, revision=1, speculation=True, classes=present)


def run(current: Situation, *observations: Observation) -> tuple[Situation, list[Decision]]:
    """A tick every 15 s, carrying the guard's memory forward."""
    decisions = []
    for observation in observations:
        first = current.guard.last_evaluation is None
        now = current.now if first else current.now + timedelta(seconds=15)
        decision = decide(replace(current, observation=observation, now=now))
        decisions.append(decision)
        current = replace(current, guard=decision.guard, kill_switch=decision.kill_switch, now=now)
    return current, decisions


def actions(decisions: list[Decision]) -> list[tuple[str, str]]:
    return [(a.action, a.reason) for d in decisions for a in d.actions]


def switch_of(current: Situation, name: str = "prose") -> ClassSwitch | None:
    return next((s for s in current.guard.class_switches if s.name == name), None)


def routed_off(current: Situation | None = None) -> Situation:
    """Prose switched off, and (as the next status says once the pool is Ready) routed."""
    current, _ = run(current or start(), observe(prose=COLLAPSED))
    return replace(current, routed=frozenset({"prose"}))


def test_a_class_that_does_not_pay_is_routed_off_alone() -> None:
    current, decisions = run(start(), observe(prose=COLLAPSED))
    assert actions(decisions) == [
        ("class_breach", "ClassBreach"),
        ("class_speculation_off", "ClassNotPaying"),
    ]
    off = decisions[0].actions[1]
    assert off.acts and off.evidence["class"] == "prose"
    assert off.evidence["signals"] == ["acceptanceRate", "speedup"]
    assert "routed to the plain pool" in off.message and "50% of it back in 60s" in off.message
    switch = switch_of(current)
    assert switch is not None and switch.state == "off" and switch.failed_trials == 0
    assert switch.next_trial_after == (T0 + timedelta(seconds=60)).isoformat()
    assert current.kill_switch.state == KillSwitchState.RELEASED


def test_without_route_classes_the_breach_changes_nothing_that_runs() -> None:
    current, decisions = run(start(routeClasses=False), observe(prose=COLLAPSED))
    assert actions(decisions) == [("class_breach", "ClassBreach")]
    assert current.guard.class_switches == []


def test_a_critical_class_routed_off_leaves_the_fleet_switch_released() -> None:
    """Code under its floor engages the fleet's kill switch without routing; routed, the fleet
    is judged on chat and prose, which pay."""
    collapsed = observe(code=window(0.05), prose=HEALTHY)
    alone, decisions = run(start(routeClasses=False), collapsed)
    assert alone.kill_switch.state == KillSwitchState.ENGAGED
    current, decisions = run(start(), collapsed)
    assert ("class_speculation_off", "ClassNotPaying") in actions(decisions)
    assert switch_of(current, "code") is not None
    assert current.kill_switch.state == KillSwitchState.RELEASED


def test_the_last_speculating_class_is_the_fleet_switchs_to_answer() -> None:
    two = [CLASSES[0], {"name": "chat", "slo": {"minAcceptanceRate": 0.3}}]
    current, decisions = run(start(two), observe(chat=COLLAPSED))
    assert ("class_speculation_off", "ClassNotPaying") in actions(decisions)
    current, decisions = run(current, observe(code=window(0.05), chat=None))
    assert ("class_speculation_off", "ClassNotPaying") not in actions(decisions)
    assert [s.name for s in current.guard.class_switches] == ["chat"]
    assert current.kill_switch.state == KillSwitchState.ENGAGED


def test_a_class_without_traffic_keeps_no_speculation_paying() -> None:
    """Prose declared but silent: with chat routed, routing code too would leave the fleet
    speculating for nobody (the replay's low-acceptance example ran both its classes on a pool
    as large as the fleet). The fleet's switch answers, as for the last class."""
    chat = {"name": "chat", "slo": {"minAcceptanceRate": 0.3}}
    current, decisions = run(start([CLASSES[0], chat, CLASSES[-1]]), observe(chat=COLLAPSED))
    assert ("class_speculation_off", "ClassNotPaying") in actions(decisions)
    current, decisions = run(current, observe(code=window(0.05), chat=None))
    assert ("class_speculation_off", "ClassNotPaying") not in actions(decisions)
    assert [s.name for s in current.guard.class_switches] == ["chat"]
    assert current.kill_switch.state == KillSwitchState.ENGAGED


def test_a_trial_after_the_cooldown_brings_a_class_back_on_its_samples_evidence() -> None:
    current = routed_off()
    current, decisions = run(current, *[observe()] * 3)  # routed: no prose on the fleet
    assert actions(decisions) == [] and switch_of(current).state == "off"
    current, decisions = run(current, observe())
    assert actions(decisions) == [("class_trial_started", "ClassTrialStarted")]
    assert switch_of(current).state == "trial"
    assert switch_of(current).evidence.deadline == (T0 + timedelta(seconds=660)).isoformat()
    current, decisions = run(current, *[observe(prose=window(0.7, requests=10))] * 12)
    back = [a for d in decisions for a in d.actions if a.action == "class_speculation_on"]
    assert len(back) == 1 and back[0].reason == "ClassPays"
    assert back[0].evidence["class"] == "prose" and back[0].evidence["requests"] >= 20
    assert back[0].evidence["evidenceSeconds"] >= 60 and "shown on" in back[0].message
    assert switch_of(current) is None
    prose = next(c for c in current.guard.classes if c.name == "prose")
    assert prose.state == "ok"  # shown paying: a new breach is named, and answered, anew


def test_no_class_trial_while_the_class_waits_for_the_pool() -> None:
    """Waiting, the class is all on the fleet: a trial then would judge all of it."""
    waiting = replace(routed_off(), routed=frozenset())
    current, decisions = run(waiting, *[observe(prose=HEALTHY)] * 8)
    assert "class_trial_started" not in [a for a, _ in actions(decisions)]
    current, decisions = run(replace(current, routed=frozenset({"prose"})), observe())
    assert actions(decisions) == [("class_trial_started", "ClassTrialStarted")]


def test_a_trial_shown_short_doubles_the_cooldown() -> None:
    current, _ = run(routed_off(), *[observe()] * 4)
    assert switch_of(current).state == "trial"
    current, decisions = run(current, observe(prose=COLLAPSED))
    assert actions(decisions) == [("class_trial_failed", "ClassTrialFailed")]
    switch = switch_of(current)
    assert switch.state == "off" and switch.failed_trials == 1 and switch.evidence is None
    assert switch.next_trial_after == (current.now + timedelta(seconds=120)).isoformat()


def test_a_trial_undecided_at_its_deadline_hands_its_evidence_on() -> None:
    current, _ = run(routed_off(), *[observe()] * 4)
    trickle = observe(prose=window(0.7, requests=1))
    current, decisions = run(current, *[trickle] * 40)  # the deadline: 600 s after it began
    assert actions(decisions) == [("class_trial_failed", "ClassTrialDeadline")]
    assert (
        decisions[-1].actions
        and "undecided at its deadline (600 s)" in decisions[-1].actions[0].message
    )
    switch = switch_of(current)
    assert switch.failed_trials == 0 and switch.evidence is not None
    kept = switch.evidence.seconds
    assert (
        kept > 500 and switch.next_trial_after == (current.now + timedelta(seconds=60)).isoformat()
    )
    current, decisions = run(current, *[observe()] * 4)
    assert actions(decisions) == [("class_trial_started", "ClassTrialStarted")]
    assert switch_of(current).evidence.seconds == kept  # the next trial adds to it


def test_no_class_trial_while_the_fleets_switch_holds_speculation_off() -> None:
    current = routed_off()
    engaged = KillSwitchStatus(state=KillSwitchState.ENGAGED, source="guard")
    current = replace(current, kill_switch=engaged, speculation=False)
    fleet_off = replace(observe(), speculation=False)
    current, decisions = run(current, *[fleet_off] * 8)
    assert "class_trial_started" not in [a for a, _ in actions(decisions)]
    assert switch_of(current).state == "off"


def test_a_dry_run_says_what_it_would_route_once_and_routes_nothing() -> None:
    current, decisions = run(start(dryRun=True), *[observe(prose=COLLAPSED)] * 4)
    off = [a for d in decisions for a in d.actions if a.action == "class_speculation_off"]
    assert len(off) == 1 and off[0].dry_run and off[0].message.startswith("dry run: would have")
    assert current.guard.class_switches == []


def test_route_classes_turned_off_brings_every_class_back_to_the_fleet() -> None:
    current = routed_off()
    assert switch_of(current) is not None
    current, _ = run(replace(current, policy=start(routeClasses=False).policy), observe())
    assert current.guard.class_switches == []


def test_a_routed_class_is_watched_on_what_the_plain_pool_served_it() -> None:
    """No request of prose on the fleet's engines, forty on the plain pool, slow there: it is
    judged (and named) on those, without speculation, and the fleet on code and chat alone."""
    slow = window(0.0, requests=40, draft_tokens=0.0, accepted_tokens=0.0, p95_tpot_seconds=0.2)
    routed = replace(observe(), plain={"prose": slow})
    current, decisions = run(start(), *[routed] * 3)
    breach = [a for d in decisions for a in d.actions if a.action == "class_breach"]
    assert len(breach) == 1 and breach[0].evidence["signal"] == "p95TpotSeconds"
    assert breach[0].evidence["samples"] == 40
    prose = next(c for c in decisions[-1].classes if c.name == "prose")
    assert (prose.judged_on, prose.requests, prose.verdict) == ("plainPool", 40.0, "bad")
    assert prose.expected_speedup is None  # nothing drafted there: no speculation to judge
    assert prose.plain_pool_requests == 40.0
    assert current.kill_switch.state == KillSwitchState.RELEASED
    assert current.guard.class_switches == []  # latency, not speculation: nothing to route


def test_route_classes_turned_on_later_routes_a_class_that_already_breaches() -> None:
    current, decisions = run(start(routeClasses=False), observe(prose=COLLAPSED))
    assert actions(decisions) == [("class_breach", "ClassBreach")]
    routing = replace(current, policy=start().policy)
    current, decisions = run(routing, observe(prose=COLLAPSED))
    assert actions(decisions) == [("class_speculation_off", "ClassNotPaying")]
    assert switch_of(current) is not None


def test_route_classes_turned_on_later_leaves_a_class_named_before_that_pays_now() -> None:
    """Named breaching earlier (its recovery not yet judged), paying in this window: routing it
    off would act on stale evidence (the demo's code, routed at acceptance 0.66 over its 0.5
    floor when Git turned routing on after the kill switch's story)."""
    current, decisions = run(start(routeClasses=False), observe(prose=COLLAPSED))
    assert actions(decisions) == [("class_breach", "ClassBreach")]
    routing = replace(current, policy=start().policy)
    current, decisions = run(routing, observe(prose=HEALTHY))
    assert ("class_speculation_off", "ClassNotPaying") not in actions(decisions)
    assert switch_of(current) is None


def test_a_class_a_human_set_off_is_not_the_fleets_switchs_to_judge() -> None:
    """While code waits for the plain pool it is still served, with speculation, by the fleet:
    its collapse there engages no kill switch, set off as it is already."""
    collapsed = observe(code=window(0.05), prose=HEALTHY)
    current, _ = run(start(routeClasses=False, classesOff=["code"]), collapsed)
    assert current.kill_switch.state == KillSwitchState.RELEASED
    current, _ = run(start(routeClasses=False), collapsed)
    assert current.kill_switch.state == KillSwitchState.ENGAGED


def test_a_class_trial_is_a_pending_judgement_with_a_deadline() -> None:
    """The replay holds every pending judgement to its deadline (`evidence.past_deadline`): a
    class trial is one."""
    current, _ = run(routed_off(), *[observe()] * 4)
    status = SpecModelStatus(guard=current.guard)
    assert past_deadline(status, current.now, 0.0) == []
    late = current.now + timedelta(seconds=601)
    seen = current.guard.model_copy(update={"last_data": late.isoformat()})  # not blind
    assert past_deadline(SpecModelStatus(guard=seen), late, 0.0) == ["class trial of prose"]
