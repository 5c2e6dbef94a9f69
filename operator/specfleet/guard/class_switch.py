"""Speculation per class (guard.routeClasses): a class whose own speculation does not pay is
routed to the plain pool while the other classes keep it, and comes back by a trial.

- Off: a class `guard.classes` has named breaching on its acceptance floor or its speedup (with
  its evidence rules: N windows in a row or one decisive) is switched off, unless no other class
  with traffic would speculate (the fleet's kill switch answers then, as without routing). From
  then on the fleet's kill switch judges the other classes alone (`excluding`), as it judges
  without the classes a human's override sets off.
- Trial: after the cooldown (doubled per failed trial, at most maxCooldownSeconds),
  classTrialShare of the class is served by the speculative fleet again. Those requests are the
  class's fleet windows (the plain pool's are labelled apart), summed since the trial began
  (`guard.evidence`) and judged there: no extra pod. Shown paying (its speedup's lower bound at
  minSpeedup, its acceptance at its floor, the converse of what switched it off): back on.
  Shown short (its speedup's upper bound under minSpeedup, or its acceptance under its floor):
  off again, the cooldown doubled. Undecided at trialDeadlineSeconds: off, the cooldown not
  doubled, its evidence handed to the next trial.
- No class trial starts before the class has moved to the plain pool (while it waits for the
  pool it is all on the fleet: a trial would judge all of it), while the fleet's own switch
  holds speculation off (nothing to serve the sample with speculation) or while a human's
  override decides.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta

from specfleet.api.status import (
    ClassGuardStatus,
    ClassState,
    ClassSwitch,
    ClassSwitchState,
    DecisionReason,
    Evidence,
)
from specfleet.guard import evidence as accumulated
from specfleet.guard.actions import ActionKind
from specfleet.guard.classes import readings
from specfleet.guard.situation import Tick
from specfleet.guard.verdict import ClassVerdict, Evaluation, excluding
from specfleet.signals import ACCEPTANCE_RATE, SPEEDUP
from specfleet.telemetry.model import Observation

SPECULATION_SIGNALS = frozenset({ACCEPTANCE_RATE, SPEEDUP})
"""What a class's own speculation breaches: the signals routing it off answers."""
OFF, TRIAL = ClassSwitchState.OFF, ClassSwitchState.TRIAL
Evaluate = Callable[[Observation], Evaluation]


def switch(tick: Tick, window: Evaluation, evaluate: Evaluate) -> Evaluation:
    """Each class's switch after `guard.classes` judged the window; returns the window's
    evaluation for the fleet's kill switch: without the classes switched off or on trial."""
    situation = tick.situation
    policy = situation.policy
    if not policy.guard.route_classes and tick.guard.class_switches:
        tick.guard.class_switches = []  # routing turned off: every class back on the fleet
    if not policy.guard.route_classes or policy.override is not None:
        return _without(window, excluded(tick), tick)
    switches = {s.name: s for s in tick.guard.class_switches}
    for state in tick.guard.classes:
        if state.name not in switches and _not_paying(tick, window, state, set(switches)):
            off = _off(tick, window, state)
            if off is not None:
                switches[state.name] = off
    fleet_on = situation.speculation and not tick.kill_switch.engaged
    for name, found in list(switches.items()):
        decided = _next(tick, found, evaluate, fleet_on)
        if decided is None:
            del switches[name]
        else:
            switches[name] = decided
    listed = list(switches.values())
    if listed != tick.guard.class_switches:
        tick.guard.class_switches = listed
    return _without(window, excluded(tick), tick)


def excluded(tick: Tick) -> frozenset[str]:
    """The classes the fleet's speculation is judged without: an override's and (routing) the
    guard's own."""
    policy = tick.situation.policy
    if not policy.guard.route_classes or policy.override is not None:
        return policy.classes_off
    return policy.classes_off | {s.name for s in tick.guard.class_switches}


def _without(window: Evaluation, names: frozenset[str], tick: Tick) -> Evaluation:
    if not names:
        return window
    return excluding(window, names, tick.situation.policy, tick.situation.speculation)


def _not_paying(
    tick: Tick, window: Evaluation, state: ClassGuardStatus, switched: set[str]
) -> bool:
    """Breaching its speculation, in this window too (a breach named before, its recovery not
    yet judged, is stale evidence), with another class left speculating; in a dry run, named
    so this tick (it switches nothing, so it says so once)."""
    if state.state != ClassState.BREACHING or SPECULATION_SIGNALS.isdisjoint(state.signals):
        return False
    if tick.situation.policy.guard.dry_run and state.since != tick.stamp:
        return False
    return _breaching_now(window, state.name) and bool(_speculating(tick) - switched - {state.name})


def _breaching_now(window: Evaluation, name: str) -> bool:
    verdict = next((v for v in window.classes if v.name == name), None)
    if verdict is None or verdict.window is None:
        return False
    return any(r.breached and r.signal in SPECULATION_SIGNALS for r in readings(verdict))


def _speculating(tick: Tick) -> set[str]:
    """The classes the fleet serves with speculation: not set off by a human, and with requests
    in the window (a declared class without traffic keeps no engine's drafts paying)."""
    observation = tick.situation.observation
    if observation is None:
        return set()
    served = {name for name, w in observation.classes.items() if (w.requests or 0.0) > 0}
    return {c.name for c in tick.situation.policy.classes if c.name in served} - set(
        tick.situation.policy.classes_off
    )


def _off(tick: Tick, window: Evaluation, state: ClassGuardStatus) -> ClassSwitch | None:
    """None in a dry run: it decides, says so, and switches nothing."""
    verdict = next(v for v in window.classes if v.name == state.name)
    guard = tick.situation.policy.guard
    message = (
        f"Speculation does not pay for class {state.name} ({_words(verdict)}): it is routed to "
        f"the plain pool while the other classes keep speculation; a trial sends "
        f"{guard.class_trial_share:.0%} of it back in {guard.cooldown_seconds}s."
    )
    evidence = {"class": state.name, "signals": state.signals, **verdict.evidence()}
    kind, reason = ActionKind.CLASS_SPECULATION_OFF, DecisionReason.CLASS_NOT_PAYING
    if not tick.act(kind, reason, message, evidence):
        return None
    return _switched_off(tick, state.name, message, 0, guard.cooldown_seconds)


def _switched_off(tick: Tick, name: str, reason: str, failed: int, cooldown: float) -> ClassSwitch:
    after = tick.situation.now + timedelta(seconds=cooldown)
    return ClassSwitch(
        name=name,
        since=tick.stamp,
        reason=reason,
        failed_trials=failed,
        next_trial_after=after.isoformat(),
    )


def _next(tick: Tick, found: ClassSwitch, evaluate: Evaluate, fleet_on: bool) -> ClassSwitch | None:
    """The switch after this tick; None once the class is back on. A dry run records the
    decisions and keeps the switch as it was."""
    if found.state == OFF:
        due = tick.situation.now >= datetime.fromisoformat(found.next_trial_after)
        moved = found.name in tick.situation.routed
        return _trial(tick, found) if due and moved and fleet_on else found
    if not fleet_on:
        return found
    return _judge_trial(tick, found, evaluate)


def _trial(tick: Tick, found: ClassSwitch) -> ClassSwitch:
    guard = tick.situation.policy.guard
    evidence = found.evidence or accumulated.begin(
        tick.situation.now, guard.trial_deadline_seconds, _serving(tick)
    )
    if found.evidence is not None:  # handed on: a deadline of its own
        deadline = tick.situation.now + timedelta(seconds=guard.trial_deadline_seconds)
        evidence = evidence.model_copy(update={"deadline": deadline.isoformat(), "pending": []})
    message = (
        f"Trial of speculation for class {found.name}: {guard.class_trial_share:.0%} of it is "
        f"served by the speculative fleet and judged there (deadline "
        f"{guard.trial_deadline_seconds}s)."
    )
    facts = {"class": found.name, "failedTrials": found.failed_trials}
    if not tick.act(
        ActionKind.CLASS_TRIAL_STARTED, DecisionReason.CLASS_TRIAL_STARTED, message, facts
    ):
        return found
    return found.model_copy(
        update={"state": TRIAL, "since": tick.stamp, "reason": message, "evidence": evidence}
    )


def _serving(tick: Tick) -> str:
    return f"revision {tick.situation.revision.number}"


def _judge_trial(tick: Tick, found: ClassSwitch, evaluate: Evaluate) -> ClassSwitch | None:
    evidence = found.evidence
    if evidence is None or evidence.serving != _serving(tick):
        return _trial(tick, found.model_copy(update={"evidence": None}))
    evidence = tick.resumed(evidence)
    judged = _sample_verdict(tick, found.name, evidence, evaluate)
    if judged is not None:
        evidence, verdict = judged
        minimum = tick.situation.policy.guard.min_speedup
        if verdict.shown_paying(minimum):
            return _back_on(tick, found, verdict, evidence.seconds)
        if verdict.shown_short(minimum):
            return _failed(tick, found, verdict, None)
    if accumulated.overdue(evidence, tick.situation.now):
        return _failed(tick, found, None, evidence)
    return found.model_copy(update={"evidence": evidence})


def _sample_verdict(
    tick: Tick, name: str, evidence: Evidence, evaluate: Evaluate
) -> tuple[Evidence, ClassVerdict] | None:
    """The class's sample on the fleet summed since the trial began, and its verdict there;
    None while the window holds nothing new of it."""
    observation = tick.situation.observation
    window = observation.classes.get(name) if observation else None
    if observation is None or window is None:
        return None
    grown = accumulated.added(
        evidence, replace(observation, classes={name: window}), tick.situation.now
    )
    if grown is None:
        return None
    summed = evaluate(accumulated.observation(grown, observation, latency=False))
    return grown, next(v for v in summed.classes if v.name == name)


def _back_on(
    tick: Tick, found: ClassSwitch, verdict: ClassVerdict, seconds: float
) -> ClassSwitch | None:
    message = (
        f"Speculation pays again for class {found.name}, shown on {seconds:.0f} s of its "
        f"trial ({_words(verdict)}): all of it is served with speculation again."
    )
    evidence = {"class": found.name, "evidenceSeconds": round(seconds), **verdict.evidence()}
    if not tick.act(ActionKind.CLASS_SPECULATION_ON, DecisionReason.CLASS_PAYS, message, evidence):
        return found
    tick.guard.classes = [
        _cleared(s, tick.stamp) if s.name == found.name else s for s in tick.guard.classes
    ]
    return None


def _cleared(state: ClassGuardStatus, stamp: str) -> ClassGuardStatus:
    """A class its trial showed paying no longer breaches its speculation (ok, unless it
    breaches more): a breach that comes back is named anew, and answered anew."""
    others = [s for s in state.signals if s not in SPECULATION_SIGNALS]
    if not others:
        return ClassGuardStatus(name=state.name, since=stamp)
    return state.model_copy(update={"signals": others})


def _failed(
    tick: Tick,
    found: ClassSwitch,
    verdict: ClassVerdict | None,
    carried: Evidence | None,
) -> ClassSwitch:
    """Shown short (`verdict`): the cooldown doubled; or ended at its deadline undecided: the
    cooldown not doubled, its evidence (`carried`) handed to the next trial."""
    guard = tick.situation.policy.guard
    failed = found.failed_trials + (1 if verdict is not None else 0)
    cooldown = min(guard.cooldown_seconds * 2**failed, guard.max_cooldown_seconds)
    if verdict is not None:
        reason = DecisionReason.CLASS_TRIAL_FAILED
        why = f"shown short ({_words(verdict)})"
        facts = verdict.evidence()
    else:
        reason = DecisionReason.CLASS_TRIAL_DEADLINE
        why = f"undecided at its deadline ({guard.trial_deadline_seconds} s)"
        facts = {"deadline": True, "evidenceSeconds": round(carried.seconds if carried else 0)}
    message = (
        f"Trial of speculation for class {found.name} {why}: it stays on the plain pool; next "
        f"trial in {cooldown}s."
    )
    evidence = {"class": found.name, "failedTrials": failed, **facts}
    if not tick.act(ActionKind.CLASS_TRIAL_FAILED, reason, message, evidence):
        return found
    off = _switched_off(tick, found.name, message, failed, cooldown)
    return off.model_copy(update={"evidence": carried})


def _words(verdict: ClassVerdict) -> str:
    window = verdict.window
    parts = []
    if window is not None and window.acceptance_rate is not None:
        parts.append(f"acceptance {window.acceptance_rate:.2f}")
        floor = verdict.slo.min_acceptance_rate
        if floor is not None:
            parts.append(f"floor {floor:.2f}")
    if verdict.speedup is not None and verdict.speedup_bounds is not None:
        low, high = verdict.speedup_bounds
        parts.append(f"speedup {verdict.speedup:.2f} [{low:.2f}, {high:.2f}]")
    if window is not None:
        parts.append(f"n={window.requests or 0:.0f}")
    return ", ".join(parts)
