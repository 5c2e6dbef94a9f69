"""Every class, critical or not: named once when it breaches, once when it is back, never acting."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

from specfleet.api.status import ClassGuardStatus
from specfleet.controller.metrics import REGISTRY, forget_classes, record_classes
from specfleet.guard import Decision, Situation, decide
from specfleet.guard.actions import Action, ActionKind
from specfleet.telemetry.model import ClassWindow, Observation
from specfleet.tick import events
from test_guard import FLOORS, T0, policy, situation, window

CLASSES = [
    *FLOORS,
    {"name": "prose", "slo": {"minAcceptanceRate": 0.3, "maxP95TpotSeconds": 0.05}},
]


def observe(prose: ClassWindow | None) -> Observation:
    """Code and chat healthy at 200 requests each; prose as given (absent: no requests)."""
    classes = {"code": window(0.8), "chat": window(0.7)}
    if prose is not None:
        classes["prose"] = prose
    return Observation(at=T0, window_seconds=60, revision=1, speculation=True, classes=classes)


def start(**guard: Any) -> Situation:
    return situation(None, policy=policy(classes=CLASSES, **guard))


def run(current: Situation, *windows: ClassWindow | None) -> tuple[Situation, list[Decision]]:
    """One tick per window of the prose class, carrying the guard's memory forward."""
    decisions = []
    for index, prose in enumerate(windows):
        now = current.now + timedelta(seconds=15 if index or decisions else 0)
        decision = decide(replace(current, observation=observe(prose), now=now))
        decisions.append(decision)
        current = replace(current, guard=decision.guard, kill_switch=decision.kill_switch, now=now)
    return current, decisions


def named(decisions: list[Decision]) -> list[Action]:
    return [a for d in decisions for a in d.actions]


def prose_state(current: Situation) -> ClassGuardStatus:
    return next(c for c in current.guard.classes if c.name == "prose")


COLLAPSED = window(0.02, requests=40)
HEALTHY = window(0.7, requests=40)
MARGINAL = window(0.7, requests=40, p95_tpot_seconds=0.06)


def test_a_minor_class_collapse_is_named_in_one_decisive_window_the_switch_stays_on() -> None:
    current, decisions = run(start(), COLLAPSED)
    [breach] = named(decisions)
    assert breach.action == "class_breach" and breach.reason == "ClassBreach"
    assert not breach.acts and current.guard.action_times == []
    evidence = breach.evidence
    assert evidence["class"] == "prose" and not evidence["critical"] and evidence["decisive"]
    assert evidence["signal"] == "acceptanceRate" and evidence["limit"] == 0.3
    assert evidence["value"] == 0.02 and evidence["samples"] == 40
    assert [b["signal"] for b in evidence["breaches"]] == ["acceptanceRate", "speedup"]
    assert "Class prose (not critical)" in breach.message and "0.020 < 0.300" in breach.message
    assert current.kill_switch.state == "released"
    state = prose_state(current)
    assert state.state == "breaching" and state.since == T0.isoformat()
    assert state.signals == ["acceptanceRate", "speedup"]


def test_the_breach_is_named_once_and_recovery_after_n_windows() -> None:
    current, decisions = run(start(), COLLAPSED, COLLAPSED, None, HEALTHY, HEALTHY)
    assert [a.action for a in named(decisions)] == ["class_breach"]
    assert prose_state(current).good == 2  # the window without prose counted for nothing
    current, decisions = run(current, HEALTHY)
    [recovered] = named(decisions)
    assert recovered.action == "class_recovered" and not recovered.acts
    assert recovered.evidence["class"] == "prose" and recovered.evidence["windows"] == 3
    assert recovered.evidence["breachingSince"] == T0.isoformat()
    assert prose_state(current).state == "ok"


def test_a_marginal_breach_needs_n_windows_in_a_row() -> None:
    current, decisions = run(start(), MARGINAL, MARGINAL, HEALTHY, MARGINAL, MARGINAL)
    assert named(decisions) == [] and prose_state(current).bad == 2
    current, decisions = run(current, MARGINAL)
    [breach] = named(decisions)
    assert breach.evidence["signal"] == "p95TpotSeconds" and breach.evidence["windows"] == 3
    assert not breach.evidence["decisive"] and "p95TpotSeconds 0.060 > 0.050" in breach.message


def test_too_few_requests_count_once_the_fleets_evidence_adds_them_up() -> None:
    """Ten requests a window are too few to judge (twenty needed); the fleet's evidence adds a
    quarter window a tick, so the class is judged from the fifth tick on, and named once its
    breach holds consecutiveBreaches evaluations."""
    few = window(0.02, requests=10)
    current, decisions = run(start(), *[few] * 4)
    assert named(decisions) == [] and prose_state(current).bad == 0
    current, decisions = run(start(), *[few] * 8)
    assert [a.action for a in named(decisions)] == ["class_breach"]


def test_status_shows_a_class_as_judged_on_the_fleets_evidence() -> None:
    """The verdict and numbers of a class the windows leave unjudged are its evidence's: its
    seconds and requests summed (a whole window, then a quarter window a tick), no p95."""
    few = window(0.02, requests=10, p95_tpot_seconds=0.03)
    _, decisions = run(start(), *[few] * 8)
    code, _, prose = decisions[-1].classes
    assert (code.judged_on, code.seconds, code.requests, code.verdict) == (
        "window",
        60.0,
        200.0,
        "good",
    )
    assert (prose.judged_on, prose.verdict, prose.acceptance_rate) == ("accumulated", "bad", 0.02)
    assert (prose.seconds, prose.requests, prose.p95_tpot_seconds) == (165.0, 27.5, None)


def test_a_non_critical_class_breaking_tool_calls_is_named() -> None:
    broken = window(0.7, tool_calls_valid=120.0, tool_calls_invalid=80.0)
    observation = replace(observe(None), classes={"code": window(0.8), "chat": broken})
    [breach] = decide(replace(start(), observation=observation)).actions
    assert breach.evidence["class"] == "chat" and breach.evidence["signal"] == "toolCallValidity"
    assert breach.evidence["samples"] == 200 and breach.evidence["limit"] == 0.9


def test_a_class_cutting_off_answers_over_its_slo_is_named() -> None:
    classes = [*FLOORS, {"name": "prose", "slo": {"maxTruncationRate": 0.05}}]
    cut = window(0.5, choices=200.0, truncated=60.0)
    observation = replace(observe(None), classes={**observe(None).classes, "prose": cut})
    [breach] = decide(situation(observation, policy=policy(classes=classes))).actions
    assert breach.evidence["class"] == "prose" and breach.evidence["signal"] == "truncationRate"
    assert (breach.evidence["value"], breach.evidence["limit"]) == (0.3, 0.05)
    assert "truncationRate 0.300 > 0.050 (n=200)" in breach.message
    few = window(0.5, choices=10.0, truncated=8.0)
    observation = replace(observation, classes={**observation.classes, "prose": few})
    assert decide(situation(observation, policy=policy(classes=classes))).actions == []


def test_class_decisions_never_count_towards_flapping() -> None:
    flickering = [COLLAPSED, HEALTHY, HEALTHY, HEALTHY] * 4
    current, decisions = run(start(maxActionsPerHour=2), *flickering)
    assert [a.action for a in named(decisions)].count("class_breach") == 4
    assert not current.guard.flapping and current.guard.action_times == []


def test_a_breach_is_a_warning_event_a_recovery_a_normal_one() -> None:
    assert events.action_type(ActionKind.CLASS_BREACH) == events.WARNING
    assert events.action_type(ActionKind.CLASS_RECOVERED) == events.NORMAL


def test_the_gauge_shows_each_breaching_signal_and_reads_0_once_back() -> None:
    def value(signal: str) -> float | None:
        labels = {"namespace": "ns", "specmodel": "g", "class": "prose", "signal": signal}
        return REGISTRY.get_sample_value("specfleet_class_breaching", labels)

    current, _ = run(start(), COLLAPSED)
    record_classes("ns", "g", current.guard.classes)
    assert value("acceptanceRate") == value("speedup") == 1
    current, _ = run(current, HEALTHY, HEALTHY, HEALTHY)
    record_classes("ns", "g", current.guard.classes)
    assert value("acceptanceRate") == value("speedup") == 0
    forget_classes("ns", "g")
    assert value("acceptanceRate") is None
