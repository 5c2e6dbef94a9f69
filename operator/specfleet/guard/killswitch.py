"""Why is speculation off? The first of these that holds:

1. The spec declares no speculative decoding (source `config`).
2. The kill-switch annotation says `engage`; `release` forces it on (source `annotation`).
3. spec.guard.mode says `off`; `on` forces it on (source `spec`); every class is off by the
   per-class override (`classes_off`: the classes-off annotation, else spec.guard.classesOff).
4. The guard's kill switch is engaged (source `guard`):
   - after N bad windows in a row (speedup below minSpeedup, or a critical class below its
     acceptance floor), or one decisive window (its bound at guard.errorRate outside the
     hysteresis band);
   - in a trial: after a cooldown one canary pod runs speculation beside the fleet, which stays
     without; the trial is one judgement on what the canary alone has shown since it began
     (`guard.evidence`), against minSpeedup + releaseMargin, with the fleet's TPOT as the
     measure without speculation. It is released once the speedup reaches that with its lower
     bound at minSpeedup, and every critical class is shown paying (its speedup and its
     acceptance floor), held for a window; it fails once the upper bound is under that or a
     critical class is shown short (engaged again, the cooldown doubled); undecided at
     trialDeadlineSeconds it fails inconclusive (the cooldown not doubled). A trial waits
     while the load that made speculation lose holds, and while a canary rollout runs (the
     two never run at once; a rollout waits for a trial);
   - latched by more than maxActionsPerHour actions (Flapping, `guard.ratelimit`) until the
     next revision.
   A dry run decides and says so, never engages; a blind guard holds the switch as it is; a
   revision on probation that breaches its SLOs and can be rolled back holds it too (the
   revision is to blame, `guard.probation`).

TPOT measured without speculation is evidence for the revision it was measured on alone: a new
revision is judged with the speedup model until it runs without speculation itself.

An override (2, 3) decides and the guard only alerts: its kill switch is discarded while the
override holds, and an override that ends hands the switch back to the guard, released.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from specfleet.api import KILL_SWITCH_ANNOTATION, SpecModel
from specfleet.api.spec import GuardMode, GuardSpec
from specfleet.api.status import (
    DecisionReason,
    Evidence,
    KillSwitchState,
    KillSwitchStatus,
    SpeculationSource,
)
from specfleet.guard import evidence as accumulated
from specfleet.guard.actions import ActionKind, named
from specfleet.guard.policy import TPOT_MEMORY_SECONDS
from specfleet.guard.situation import Situation, Tick
from specfleet.guard.speedup import paying_batch
from specfleet.guard.verdict import Evaluation, requests_to_show
from specfleet.telemetry.model import Observation

ANNOTATION_SPECULATION = {"engage": False, "release": True}
"""What the kill-switch annotation's values force speculation to."""
OVERRIDES = (SpeculationSource.ANNOTATION, SpeculationSource.SPEC)
ENGAGED, TRIAL = KillSwitchState.ENGAGED, KillSwitchState.TRIAL
"""The states every tick compares with, read once: on Python 3.11 reading a member through its
enum is slow (the enum's metaclass has a __getattr__)."""


def speculation(
    specmodel: SpecModel, kill_switch: KillSwitchStatus | None
) -> tuple[bool, SpeculationSource]:
    """Whether the fleet runs speculation, and who decided it."""
    if specmodel.spec.speculative is None:
        return False, SpeculationSource.CONFIG
    annotation = specmodel.metadata.annotations.get(KILL_SWITCH_ANNOTATION, "auto")
    if annotation in ANNOTATION_SPECULATION:
        return ANNOTATION_SPECULATION[annotation], SpeculationSource.ANNOTATION
    mode = specmodel.spec.guard.mode
    if mode != GuardMode.AUTO:
        return mode == GuardMode.ON, SpeculationSource.SPEC
    off, source = classes_off(specmodel)
    if off >= {c.name for c in specmodel.spec.classes}:  # every class off: the fleet's switch
        return False, source
    return kill_switch is None or not kill_switch.engaged, SpeculationSource.GUARD


def classes_off(specmodel: SpecModel) -> tuple[frozenset[str], SpeculationSource]:
    """The classes an override serves without speculation, and which override it is."""
    names, annotated = specmodel.classes_off()
    return frozenset(names), SpeculationSource.ANNOTATION if annotated else SpeculationSource.SPEC


def override(source: str) -> SpeculationSource | None:
    """The override that decides speculation, or None when the guard (or the config) does."""
    return SpeculationSource(source) if source in OVERRIDES else None


def runs_canary(source: str, kill_switch: KillSwitchStatus | None) -> bool:
    """A trial: the guard decides and its kill switch tries speculation on one canary pod."""
    return source == SpeculationSource.GUARD and kill_switch is not None and kill_switch.trial


def after_decision(
    source: str, previous: KillSwitchStatus | None, decided: KillSwitchStatus
) -> KillSwitchStatus:
    """The kill switch once the guard has decided: its own, unless an override decides (then
    the guard's is discarded and the override's stays)."""
    if source in OVERRIDES:
        return previous or KillSwitchStatus()
    return decided


def after_plan(
    source: str, on: bool, previous: KillSwitchStatus | None, now: datetime
) -> KillSwitchStatus:
    """The kill switch once the plan is made: an override sets it (kept while unchanged); an
    override that ended hands it back to the guard, released."""
    old = previous or KillSwitchStatus()
    if source not in OVERRIDES:
        return old if old.source in (SpeculationSource.GUARD, "") else KillSwitchStatus()
    state = KillSwitchState.RELEASED if on else KillSwitchState.ENGAGED
    if old.state == state and old.source == source:
        return old
    return KillSwitchStatus(
        state=state, source=source, since=now.isoformat(), reason=f"set by the {source}"
    )


def canary_judged(ready_since: str, guard: GuardSpec, now: datetime) -> bool:
    """Whether a trial's canary has served long enough to be judged: one interval (its series
    are new, the last speculating pods stopped a cooldown ago, so the window holds nothing
    else, and a failing trial costs less the sooner it is judged); a cooldown shorter than a
    window waits a window."""
    needed = guard.interval_seconds
    if guard.cooldown_seconds < guard.window_seconds:
        needed = guard.window_seconds
    return (now - datetime.fromisoformat(ready_since)).total_seconds() >= needed


def threshold(situation: Situation) -> float:
    """The speedup a window must show: minSpeedup, plus releaseMargin in a trial."""
    guard = situation.policy.guard
    return guard.min_speedup + (guard.release_margin if situation.kill_switch.trial else 0.0)


def remember_tpot_without_speculation(tick: Tick, observation: Observation) -> None:
    """The fleet's mean TPOT per class from a window without speculation, for this revision
    (another revision's measures are dropped)."""
    guard, revision = tick.guard, tick.situation.revision.number
    known = dict(guard.tpot_without_speculation or {}) if guard.tpot_revision == revision else {}
    min_requests = tick.situation.policy.guard.min_requests
    for name, window in observation.classes.items():
        tpot = window.measured_tpot(min_requests)
        if tpot:
            known[name] = tpot
    if known:
        guard.tpot_without_speculation, guard.tpot_revision = known, revision
        guard.tpot_measured_at = tick.stamp


def tpot_without_speculation(tick: Tick) -> dict[str, float]:
    """The active revision's TPOT without speculation, while fresh; {} when none stands."""
    guard, situation = tick.guard, tick.situation
    measured = guard.tpot_measured_at
    if measured is None or not guard.tpot_without_speculation:
        return {}
    if guard.tpot_revision != situation.revision.number:
        return {}
    age = (situation.now - datetime.fromisoformat(measured)).total_seconds()
    return guard.tpot_without_speculation if age <= TPOT_MEMORY_SECONDS else {}


def transition(tick: Tick, evaluation: Evaluation) -> None:
    """The guard's kill switch after a judged window (a trial's: its canary's)."""
    situation = tick.situation
    if not situation.policy.k or tick.guard.flapping or tick.revision_suspect:
        return
    if situation.policy.override is not None:
        _overridden(tick, evaluation)
        return
    state = tick.kill_switch.state
    if state == ENGAGED:
        _maybe_trial(tick, evaluation)
    elif state == TRIAL:
        _judge_trial(tick, evaluation)
    elif evaluation.speculation_bad is not None:
        _count(tick, evaluation.speculation_bad)
        if _convinced(tick, evaluation):
            _engage(
                tick,
                evaluation,
                ActionKind.KILL_SWITCH_ENGAGED,
                DecisionReason.SPECULATION_NOT_PAYING,
            )


def _convinced(tick: Tick, evaluation: Evaluation) -> bool:
    """N bad evaluations in a row, or one decisive bad evaluation."""
    needed = tick.situation.policy.guard.consecutive_breaches
    return tick.guard.consecutive_bad >= needed or bool(
        evaluation.speculation_bad and evaluation.decisive
    )


def _count(tick: Tick, bad: bool) -> None:
    if bad:
        tick.guard.consecutive_bad += 1
        tick.guard.consecutive_good = 0
    else:
        tick.guard.consecutive_good += 1
        tick.guard.consecutive_bad = 0


def _overridden(tick: Tick, evaluation: Evaluation) -> None:
    situation = tick.situation
    if not situation.speculation or evaluation.speculation_bad is None:
        return
    _count(tick, evaluation.speculation_bad)
    if tick.guard.consecutive_bad >= situation.policy.guard.consecutive_breaches:
        tick.guard.consecutive_bad = 0
        tick.act(
            ActionKind.ALERT,
            DecisionReason.SPECULATION_NOT_PAYING,
            f"Speculation does not pay ({_speedup_words(evaluation)}) but "
            f"{situation.policy.override} overrides the guard.",
            evaluation.evidence(),
        )


def _engage(tick: Tick, evaluation: Evaluation, action: ActionKind, reason: DecisionReason) -> None:
    situation = tick.situation
    guard = situation.policy.guard
    failed = tick.kill_switch.failed_trials + (1 if action == ActionKind.TRIAL_FAILED else 0)
    cooldown = min(guard.cooldown_seconds * 2**failed, guard.max_cooldown_seconds)
    breaches = named(evaluation, lambda v: v.speculation_breaches)
    windows = tick.guard.consecutive_bad
    message = (
        f"Speculation off after {_windows_words(evaluation, windows)}: "
        f"{'; '.join(breaches)} ({_speedup_words(evaluation)})."
    )
    if action == ActionKind.TRIAL_FAILED:
        message = (
            f"Trial failed on the canary: {'; '.join(breaches)} "
            f"({_speedup_words(evaluation)}). Canary removed; next trial in {cooldown}s."
        )
    max_in_flight = _lost_to_load(situation, evaluation)
    if max_in_flight is not None:
        message += (
            f" It lost to load ({evaluation.in_flight:.0f} requests in flight per replica): "
            f"trials wait until there are at most {max_in_flight:.0f}."
        )
    tick.guard.trial_max_in_flight = max_in_flight
    tick.guard.consecutive_bad = tick.guard.consecutive_good = 0
    evidence = {
        **evaluation.evidence(),
        "breaches": breaches,
        "windows": windows,
        "cooldownSeconds": cooldown,
    }
    if tick.act(action, reason, message, evidence):
        tick.kill_switch = KillSwitchStatus(
            state=KillSwitchState.ENGAGED,
            source=SpeculationSource.GUARD,
            since=tick.stamp,
            reason=message,
            failed_trials=failed,
            next_trial_after=(situation.now + timedelta(seconds=cooldown)).isoformat(),
        )


def _load_holds_trial(tick: Tick, evaluation: Evaluation, due: datetime) -> bool:
    """While the load that made speculation lose has not dropped, a trial waits, but at
    most maxCooldownSeconds past its time: without speculation each request takes longer,
    so the requests in flight may never fall to where they were when it engaged."""
    max_in_flight, in_flight = tick.guard.trial_max_in_flight, evaluation.in_flight
    if max_in_flight is None or in_flight is None or in_flight <= max_in_flight:
        return False
    waited = (tick.situation.now - due).total_seconds()
    return waited < tick.situation.policy.guard.max_cooldown_seconds


def _maybe_trial(tick: Tick, evaluation: Evaluation) -> None:
    situation = tick.situation
    due = tick.kill_switch.next_trial_after
    if due is None or situation.now < datetime.fromisoformat(due) or situation.rollout:
        return
    if _load_holds_trial(tick, evaluation, datetime.fromisoformat(due)):
        return
    replicas = situation.policy.replicas
    message = (
        f"Trial after the cooldown: a canary pod runs revision {situation.revision.number} "
        f"with speculation beside the {replicas} replicas without it (1 pod of "
        f"{replicas + 1}); the trial is judged on the canary alone."
    )
    if tick.act(
        ActionKind.TRIAL_STARTED,
        DecisionReason.TRIAL_STARTED,
        message,
        {"failedTrials": tick.kill_switch.failed_trials},
    ):
        tick.kill_switch = tick.kill_switch.model_copy(
            update={
                "state": KillSwitchState.TRIAL,
                "since": tick.stamp,
                "reason": message,
                "evidence": _carried(tick),
            }
        )
        tick.guard.trial_since = tick.stamp
        tick.guard.consecutive_bad = tick.guard.consecutive_good = 0


def _carried(tick: Tick) -> Evidence | None:
    """The evidence of the last trial, when it ended at its deadline undecided on the revision
    that serves now: the next trial adds to it, with a deadline of its own. A quiet fleet's trial
    would otherwise start from nothing each time and never gather what a release needs."""
    carried = tick.kill_switch.evidence
    if carried is None or carried.serving != _serving(tick):
        return None
    deadline = tick.situation.now + timedelta(
        seconds=tick.situation.policy.guard.trial_deadline_seconds
    )
    return carried.model_copy(update={"deadline": deadline.isoformat(), "pending": []})


def _serving(tick: Tick) -> str:
    return f"revision {tick.situation.revision.number}"


def trial_evidence(tick: Tick) -> Observation | None:
    """What the trial's canary has shown since the trial began (or the last ones, ended
    undecided, began), this tick's window added (None: nothing new to judge)."""
    situation, switch = tick.situation, tick.kill_switch
    evidence = switch.evidence or accumulated.begin(
        _trial_start(tick), situation.policy.guard.trial_deadline_seconds, _serving(tick)
    )
    evidence, canary = tick.resumed(evidence), situation.canary
    grown = accumulated.added(evidence, canary, situation.now)
    tick.kill_switch = switch.model_copy(update={"evidence": grown or evidence})
    if grown is None or canary is None:
        return None
    return accumulated.observation(grown, canary)


def _trial_start(tick: Tick) -> datetime:
    return datetime.fromisoformat(tick.guard.trial_since or tick.kill_switch.since or tick.stamp)


def _judge_trial(tick: Tick, evaluation: Evaluation) -> None:
    """Failed once the canary's evidence shows the traffic-weighted speedup short of
    minSpeedup + releaseMargin (its upper bound), or a critical class short of what engages
    the switch (its speedup under minSpeedup, its acceptance under its floor); released once
    it shows the converse of what engages it (the speedup's lower bound at minSpeedup, every
    critical class's speedup and acceptance floor, lower bounds) with the speedup at
    minSpeedup + releaseMargin (the hysteresis), held for a window. The burden of proof is the
    same both ways; a canary is judged on the classes that matter, or not yet."""
    bounds, needed = evaluation.speedup_bounds, evaluation.threshold
    minimum = tick.situation.policy.guard.min_speedup
    critical_short = evaluation.critical_short(minimum)
    short = bounds is not None and evaluation.critical_judged and bounds[1] < needed
    if short or critical_short:
        _engage(tick, evaluation, ActionKind.TRIAL_FAILED, DecisionReason.TRIAL_FAILED)
        return
    served = (tick.situation.now - _trial_start(tick)).total_seconds()
    pending = _trial_pending(evaluation, minimum)
    if served < tick.situation.policy.guard.window_seconds:
        pending.append("held for a window: not yet")
    if pending:
        if tick.kill_switch.evidence is not None:
            shown = tick.kill_switch.evidence.model_copy(update={"pending": pending})
            tick.kill_switch = tick.kill_switch.model_copy(update={"evidence": shown})
        return
    seconds = tick.kill_switch.evidence.seconds if tick.kill_switch.evidence else 0.0
    message = (
        f"Speculation pays again on the canary, shown on {seconds:.0f} s of its serving "
        f"({_speedup_words(evaluation)}): kill switch released, the fleet rolls to "
        "speculation and the canary is removed."
    )
    evidence = {**evaluation.evidence(), "evidenceSeconds": round(seconds)}
    if tick.act(
        ActionKind.KILL_SWITCH_RELEASED, DecisionReason.SPECULATION_PAYS, message, evidence
    ):
        tick.kill_switch = KillSwitchStatus(
            state=KillSwitchState.RELEASED,
            source=SpeculationSource.GUARD,
            since=tick.stamp,
            reason=message,
        )


def _trial_pending(evaluation: Evaluation, minimum: float) -> list[str]:
    """What the trial's evidence does not show yet, in words: what status says it needs."""
    bounds, needed = evaluation.speedup_bounds, evaluation.threshold
    if bounds is None:
        return ["the canary's speedup: too few drafted tokens yet"]
    pending = []
    speedup = evaluation.speedup or 0.0
    if bounds[0] < minimum or speedup < needed:
        pending.append(
            f"traffic-weighted speedup {speedup:.2f} (needs {needed:.2f}): lower bound "
            f"{bounds[0]:.2f}, needs {minimum:.2f}"
        )
    for v in evaluation.classes:
        if not v.critical or v.shown_paying(minimum):
            continue
        if not v.conclusive or v.window is None:
            pending.append(f"{v.name} (critical): too few requests on the canary yet")
            continue
        floor, share = v.slo.min_acceptance_rate, v.window.acceptance_rate
        requests = v.window.requests or 0.0
        if floor is not None and share is not None and share > floor:
            more = requests_to_show(v.window, floor, evaluation.error_rate)
            of = f" of about {more:.0f} needed at this share" if more else ""
            pending.append(
                f"{v.name} (critical): acceptance {share:.2f} not yet shown at its floor "
                f"{floor:.2f} (n={requests:.0f}{of})"
            )
        else:
            pending.append(f"{v.name} (critical): its speedup not yet shown at {minimum:.2f}")
    return pending


def end_overdue_trial(tick: Tick) -> None:
    """A trial its evidence has not decided by its deadline fails inconclusive: the canary is
    removed, speculation stays off, and the cooldown is not doubled (nothing showed it
    short)."""
    switch, situation = tick.kill_switch, tick.situation
    if not switch.trial or switch.evidence is None:
        return
    if not accumulated.overdue(switch.evidence, situation.now):
        return
    guard = situation.policy.guard
    cooldown = min(guard.cooldown_seconds * 2**switch.failed_trials, guard.max_cooldown_seconds)
    seconds = switch.evidence.seconds
    message = (
        f"Trial ended at its deadline ({guard.trial_deadline_seconds} s) undecided on "
        f"{seconds:.0f} s of its canary's serving: canary removed, speculation stays off; "
        f"next trial in {cooldown}s (not doubled), adding to this one's evidence."
    )
    facts = {"deadline": True, "evidenceSeconds": round(seconds), "cooldownSeconds": cooldown}
    if tick.act(ActionKind.TRIAL_FAILED, DecisionReason.TRIAL_DEADLINE, message, facts):
        tick.kill_switch = KillSwitchStatus(
            state=KillSwitchState.ENGAGED,
            source=SpeculationSource.GUARD,
            since=tick.stamp,
            reason=message,
            failed_trials=switch.failed_trials,
            next_trial_after=(situation.now + timedelta(seconds=cooldown)).isoformat(),
            evidence=switch.evidence,
        )


def _lost_to_load(situation: Situation, evaluation: Evaluation) -> float | None:
    """The batch up to which speculation would pay again, when load (not acceptance) is what
    made it lose: the speedup without the load term reaches a trial's threshold."""
    if evaluation.speedup is None or evaluation.in_flight is None or evaluation.load >= 1.0:
        return None
    if evaluation.below_acceptance_floor:
        return None
    guard, policy = situation.policy.guard, situation.policy
    trial_threshold = guard.min_speedup + guard.release_margin
    unloaded = evaluation.speedup / evaluation.load
    batch = paying_batch(
        unloaded, evaluation.drafts_per_step, policy.per_token_compute, trial_threshold
    )
    return round(batch, 1) if 0.0 < batch < evaluation.in_flight else None


def _windows_words(evaluation: Evaluation, count: int) -> str:
    """How much evidence it took: one decisive window, or a run of windows."""
    if evaluation.decisive:
        return "1 decisive window" if count <= 1 else f"{count} windows, the last decisive"
    return f"{count} windows in a row"


def _speedup_words(evaluation: Evaluation) -> str:
    if evaluation.speedup is None:
        return "speedup unknown"
    bound = evaluation.bound
    side = "upper" if evaluation.speculation_bad else "lower"
    rate = evaluation.error_rate
    interval = f" ({side} bound {bound:.2f} at error rate {rate:g})" if bound is not None else ""
    return (
        f"traffic-weighted speedup {evaluation.speedup:.2f}{interval} vs "
        f"{evaluation.threshold:.2f} needed"
    )
