"""`decide(situation) -> Decision`: the guard's policy, pure and deterministic (clock injected).

One evaluation per tick and SpecModel:
1. No data: inconclusive; after blindAfterSeconds raise MetricsBlind and alert; state frozen.
2. Rollout in progress: inconclusive (windows must show only the new pods).
3. Probation: a new revision that breaks quality floors (tool-call / structured-output
   validity, error rate) N evaluations in a row is rolled back to the last good revision;
   after probationSeconds without breach it becomes the last good.
4. Speculation: after N bad evaluations in a row (speedup below minSpeedup, or a critical
   class below its acceptance floor), or one decisive evaluation (its 95% bound outside the
   hysteresis band), the kill switch engages; after a cooldown a trial runs speculation on
   one canary pod beside the fleet, which stays without, and is judged on the canary's windows
   alone against minSpeedup + releaseMargin for a minimum hold (none for a decisive window),
   with the fleet's TPOT of the same window as the measure without speculation; failed trials
   double the cooldown. More than maxActionsPerHour actions latch speculation off (Flapping).
5. Overrides (annotation, spec mode) and dryRun: decide and alert, never act.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from functools import cached_property, lru_cache
from typing import Any

from specfleet.api.status import (
    ClassObservation,
    GuardStatus,
    KillSwitchState,
    KillSwitchStatus,
    QualityBaseline,
    RevisionRecord,
)
from specfleet.guard.policy import TPOT_MEMORY_SECONDS, Policy
from specfleet.guard.speedup import paying_batch, weighted
from specfleet.guard.verdict import ClassVerdict, Evaluation, evaluate
from specfleet.telemetry.model import ClassWindow, Observation

HOUR = timedelta(hours=1)
ACTING = {
    "kill_switch_engaged",
    "kill_switch_released",
    "trial_started",
    "trial_failed",
    "rolled_back",
}
SCHEDULED = {"trial_started", "trial_failed"}
"""Trials come from the backed-off schedule; they do not count towards Flapping."""


@dataclass(frozen=True)
class Situation:
    """Everything the guard knows at one tick."""

    policy: Policy
    guard: GuardStatus
    kill_switch: KillSwitchStatus
    revision: RevisionRecord
    """The active revision."""
    has_last_good: bool
    speculation: bool
    """Whether the running pods use speculation."""
    settled: bool
    """Rollout complete and every pod in the window runs the current plan."""
    observation: Observation | None
    now: datetime
    canary: Observation | None = None
    """A trial's canary over the window, once it has served long enough to be judged."""


@dataclass(frozen=True)
class Action:
    action: str
    reason: str
    message: str
    evidence: dict[str, Any] = field(default_factory=dict)
    dry_run: bool = False

    @property
    def acts(self) -> bool:
        return self.action in ACTING and not self.dry_run


@dataclass
class Decision:
    """Not frozen (though never changed): a frozen dataclass's __init__ costs 2 µs, a twentieth
    of a whole decision."""

    guard: GuardStatus
    kill_switch: KillSwitchStatus
    verdict: str
    """The active revision's verdict after this evaluation."""
    actions: list[Action]
    observation: Observation | None
    evaluation: Evaluation | None
    """None when the window was not judged (no data, or not settled)."""

    # What the window showed is built when the status is written, not on every tick.
    @cached_property
    def classes(self) -> list[ClassObservation]:
        if self.evaluation is None or self.observation is None:
            return []
        windows = self.observation.classes
        return [
            _class_observation(v.name, windows.get(v.name), v.speedup, v.verdict)
            for v in self.evaluation.classes
        ]

    @cached_property
    def acceptance(self) -> str | None:
        """Traffic-weighted acceptance rate over the conclusive classes."""
        if self.evaluation is None or self.observation is None:
            return None
        rates: dict[str, float] = {}
        for verdict in self.evaluation.classes:
            window = self.observation.classes.get(verdict.name)
            alpha = window.acceptance_rate if window else None
            if alpha is not None and verdict.conclusive:
                rates[verdict.name] = alpha
        overall = weighted(rates, {v.name: v.weight for v in self.evaluation.classes})
        return f"{overall:.2f}" if overall is not None else None


def decide(situation: Situation) -> Decision:
    state = _State.start(situation)
    if not _has_data(situation.observation):
        state.blind(situation)
        return state.decision()
    state.data_seen(situation)
    if not situation.settled or situation.observation is None:
        return state.decision()
    if not situation.observation.speculation:
        state.remember_tpot_without_speculation(situation.observation)
    evaluation = state.judge(situation.observation, situation.policy)
    state.probation(situation, evaluation)
    trial = situation.kill_switch.state == KillSwitchState.TRIAL
    judged = _judge_canary(state, situation) if trial else evaluation
    if judged is not None:
        state.speculation(situation, judged)
    state.rate_limit(situation)
    return state.decision()


def _judge_canary(state: _State, situation: Situation) -> Evaluation | None:
    """A trial is judged on its canary alone (None until it has served long enough): one pod,
    so the requests in flight per replica are its own."""
    if situation.canary is None:
        return None
    return state.judge(situation.canary, replace(situation.policy, replicas=1))


def _has_data(observation: Observation | None) -> bool:
    if observation is None or observation.blind:
        return False
    return any(c.requests is not None for c in observation.classes.values())


@lru_cache(maxsize=4)
def _stamp(now: datetime) -> str:
    """`now` as status fields record it: one tick's decisions share their clock, and isoformat
    would cost as much as a class's judgement."""
    return now.isoformat()


def _fresh_tpot_without_speculation(guard: GuardStatus, now: datetime) -> dict[str, float]:
    measured = guard.tpot_measured_at
    if measured is None or not guard.tpot_without_speculation:
        return {}
    age = (now - datetime.fromisoformat(measured)).total_seconds()
    return guard.tpot_without_speculation if age <= TPOT_MEMORY_SECONDS else {}


def _threshold(situation: Situation) -> float:
    guard = situation.policy.guard
    trial = situation.kill_switch.state == KillSwitchState.TRIAL
    return guard.min_speedup + (guard.release_margin if trial else 0.0)


@dataclass
class _State:
    """The evaluation in progress: the state it may change, and what it did. Status objects
    are shallow copies or shared: their fields are replaced, never mutated in place."""

    situation: Situation
    stamp: str
    """`situation.now` as status fields record it."""
    guard: GuardStatus
    kill_switch: KillSwitchStatus
    verdict: str
    actions: list[Action] = field(default_factory=list)
    observation: Observation | None = None
    evaluation: Evaluation | None = None
    """The window last judged and its evaluation: a trial's canary once it is judged."""

    @classmethod
    def start(cls, situation: Situation) -> _State:
        stamp = _stamp(situation.now)
        guard = situation.guard.model_copy(update={"last_evaluation": stamp})
        if guard.last_data is None:
            guard.last_data = stamp  # the blind clock starts at first sight
        return cls(situation, stamp, guard, situation.kill_switch, situation.revision.verdict)

    def decision(self) -> Decision:
        return Decision(
            self.guard,
            self.kill_switch,
            self.verdict,
            self.actions,
            self.observation or self.situation.observation,
            self.evaluation,
        )

    def judge(self, observation: Observation, policy: Policy) -> Evaluation:
        """Evaluates a window with TPOT without speculation as last measured (this window's
        own, when the fleet runs without)."""
        self.observation = observation
        self.evaluation = evaluate(
            policy,
            observation,
            _threshold(self.situation),
            _fresh_tpot_without_speculation(self.guard, self.situation.now),
            self.guard.baseline,
        )
        return self.evaluation

    def act(self, action: str, reason: str, message: str, evidence: dict[str, Any]) -> bool:
        """Records an action; returns whether it may change what runs."""
        dry = self.situation.policy.guard.dry_run and action in ACTING
        if dry:
            message = f"dry run: would have {message[0].lower()}{message[1:]}"
        window = {"windowSeconds": self.situation.policy.guard.window_seconds}
        self.actions.append(Action(action, reason, message, {**evidence, **window}, dry))
        if action in ACTING - SCHEDULED and not dry:
            self.guard.action_times = [*self.guard.action_times, self.stamp]
        return not dry

    # 1. blind --------------------------------------------------------------------------------

    def blind(self, situation: Situation) -> None:
        reason = (situation.observation and situation.observation.blind) or "no series"
        since = datetime.fromisoformat(self.guard.last_data or self.stamp)
        silent = (situation.now - since).total_seconds()
        if silent >= situation.policy.guard.blind_after_seconds and not self.guard.blind:
            self.guard.blind = True
            self.act(
                "metrics_blind",
                "MetricsBlind",
                f"No data for {silent:.0f}s ({reason}); the guard holds the current state.",
                {"silentSeconds": round(silent), "cause": reason},
            )

    def data_seen(self, situation: Situation) -> None:
        if self.guard.blind:
            self.act("metrics_restored", "MetricsRestored", "Data is back; the guard resumes.", {})
            self.guard.blind = False
        self.guard.last_data = self.stamp

    # 2. what the window showed ---------------------------------------------------------------

    def remember_tpot_without_speculation(self, observation: Observation) -> None:
        known = dict(self.guard.tpot_without_speculation or {})
        min_requests = self.situation.policy.guard.min_requests
        for name, window in observation.classes.items():
            if window.mean_tpot_seconds and (window.requests or 0) >= min_requests:
                known[name] = window.mean_tpot_seconds
        self.guard.tpot_without_speculation = known or None
        if known:
            self.guard.tpot_measured_at = self.stamp

    # 3. probation ----------------------------------------------------------------------------

    def probation(self, situation: Situation, evaluation: Evaluation) -> None:
        guard, revision = self.guard, situation.revision
        if revision.verdict != "probation":
            return
        if guard.probation_revision != revision.number:
            guard.probation_revision, guard.probation_since = (
                revision.number,
                self.stamp,
            )
            guard.quality_bad, guard.quality_good, guard.flapping = 0, 0, False
        quality_bad = evaluation.quality_bad
        if quality_bad:
            guard.quality_bad, guard.quality_good = guard.quality_bad + 1, 0
        elif quality_bad is False:
            guard.quality_bad, guard.quality_good = 0, guard.quality_good + 1
        needed = situation.policy.guard.consecutive_breaches
        if guard.quality_bad >= needed:
            self._quality_breach(situation, evaluation)
            return
        since = datetime.fromisoformat(guard.probation_since or self.stamp)
        served = (situation.now - since).total_seconds() >= situation.policy.guard.probation_seconds
        # Time alone proves nothing: the last N windows must have judged the revision good.
        if served and guard.quality_good >= needed:
            self.verdict = "good"
            guard.baseline = _baseline(situation.observation)
            self.act(
                "revision_promoted",
                "RevisionPromoted",
                f"Revision {revision.number} passed probation and is the last good revision.",
                evaluation.evidence(),
            )

    def _quality_breach(self, situation: Situation, evaluation: Evaluation) -> None:
        breaches = _named(evaluation, lambda v: v.quality_breaches)
        evidence = {**evaluation.evidence(), "breaches": breaches}
        self.guard.quality_bad = 0
        number = situation.revision.number
        if not situation.has_last_good:
            self.act(
                "quality_breach",
                "QualityBreach",
                f"Revision {number} breaks quality floors ({'; '.join(breaches)}) and there is "
                "no earlier good revision to roll back to.",
                evidence,
            )
            return
        if self.act(
            "rolled_back",
            "RolledBack",
            f"Revision {number} breaks quality floors ({'; '.join(breaches)}): rolled back to "
            "the last good revision until the engine config or specfleet.dev/retry changes.",
            evidence,
        ):
            self.verdict = "bad"

    # 4. speculation --------------------------------------------------------------------------

    def speculation(self, situation: Situation, evaluation: Evaluation) -> None:
        if not situation.policy.k or self.guard.flapping:
            return
        if situation.policy.override is not None:
            self._overridden(situation, evaluation)
            return
        state = self.kill_switch.state
        if state == KillSwitchState.ENGAGED:
            self._maybe_trial(situation, evaluation)
        elif evaluation.speculation_bad is not None:
            trial = state == KillSwitchState.TRIAL
            if trial and not evaluation.speculation_bad and not evaluation.critical_judged:
                return  # a canary passes on the classes that matter, or not yet
            self._count(evaluation.speculation_bad)
            if trial:
                self._judge_trial(situation, evaluation)
            elif self._convinced(situation, evaluation):
                self._engage(situation, evaluation, "kill_switch_engaged", "SpeculationNotPaying")

    def _convinced(self, situation: Situation, evaluation: Evaluation) -> bool:
        """N bad evaluations in a row, or one decisive bad evaluation."""
        needed = situation.policy.guard.consecutive_breaches
        return self.guard.consecutive_bad >= needed or bool(
            evaluation.speculation_bad and evaluation.decisive
        )

    def _count(self, bad: bool) -> None:
        if bad:
            self.guard.consecutive_bad += 1
            self.guard.consecutive_good = 0
        else:
            self.guard.consecutive_good += 1
            self.guard.consecutive_bad = 0

    def _overridden(self, situation: Situation, evaluation: Evaluation) -> None:
        if not situation.speculation or evaluation.speculation_bad is None:
            return
        self._count(evaluation.speculation_bad)
        if self.guard.consecutive_bad >= situation.policy.guard.consecutive_breaches:
            self.guard.consecutive_bad = 0
            self.act(
                "alert",
                "SpeculationNotPaying",
                f"Speculation does not pay ({_speedup_words(evaluation)}) but "
                f"{situation.policy.override} overrides the guard.",
                evaluation.evidence(),
            )

    def _engage(
        self, situation: Situation, evaluation: Evaluation, action: str, reason: str
    ) -> None:
        guard = situation.policy.guard
        failed = self.kill_switch.failed_trials + (1 if action == "trial_failed" else 0)
        cooldown = min(guard.cooldown_seconds * 2**failed, guard.max_cooldown_seconds)
        breaches = _named(evaluation, lambda v: v.speculation_breaches)
        windows = self.guard.consecutive_bad
        message = (
            f"Speculation off after {_windows_words(evaluation, windows)}: "
            f"{'; '.join(breaches)} ({_speedup_words(evaluation)})."
        )
        if action == "trial_failed":
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
        self.guard.trial_max_in_flight = max_in_flight
        self.guard.consecutive_bad = self.guard.consecutive_good = 0
        evidence = {
            **evaluation.evidence(),
            "breaches": breaches,
            "windows": windows,
            "cooldownSeconds": cooldown,
        }
        if self.act(action, reason, message, evidence):
            self.kill_switch = KillSwitchStatus(
                state=KillSwitchState.ENGAGED,
                source="guard",
                since=self.stamp,
                reason=message,
                failed_trials=failed,
                next_trial_after=(situation.now + timedelta(seconds=cooldown)).isoformat(),
            )

    def _load_holds_trial(
        self, situation: Situation, evaluation: Evaluation, due: datetime
    ) -> bool:
        """While the load that made speculation lose has not dropped, a trial waits, but at
        most maxCooldownSeconds past its time: without speculation each request takes longer,
        so the requests in flight may never fall to where they were when it engaged."""
        max_in_flight, in_flight = self.guard.trial_max_in_flight, evaluation.in_flight
        if max_in_flight is None or in_flight is None or in_flight <= max_in_flight:
            return False
        waited = (situation.now - due).total_seconds()
        return waited < situation.policy.guard.max_cooldown_seconds

    def _maybe_trial(self, situation: Situation, evaluation: Evaluation) -> None:
        due = self.kill_switch.next_trial_after
        if due is None or situation.now < datetime.fromisoformat(due):
            return
        if self._load_holds_trial(situation, evaluation, datetime.fromisoformat(due)):
            return
        replicas = situation.policy.replicas
        message = (
            f"Trial after the cooldown: a canary pod runs revision {situation.revision.number} "
            f"with speculation beside the {replicas} replicas without it (1 pod of "
            f"{replicas + 1}); the trial is judged on the canary alone."
        )
        if self.act(
            "trial_started",
            "TrialStarted",
            message,
            {"failedTrials": self.kill_switch.failed_trials},
        ):
            self.kill_switch = self.kill_switch.model_copy(
                update={
                    "state": KillSwitchState.TRIAL,
                    "since": self.stamp,
                    "reason": message,
                }
            )
            self.guard.trial_since = self.stamp
            self.guard.consecutive_bad = self.guard.consecutive_good = 0

    def _judge_trial(self, situation: Situation, evaluation: Evaluation) -> None:
        """A trial is released after N good windows at the stricter threshold held for a window,
        or one decisive good window; it fails on the first window that would have engaged the
        kill switch on its own: a bad trial costs one window, not N."""
        guard = situation.policy.guard
        plainly_bad = evaluation.speedup is not None and evaluation.speedup < guard.min_speedup
        breached = evaluation.critical_breach
        if plainly_bad or breached or self.guard.consecutive_bad >= guard.consecutive_breaches:
            self._engage(situation, evaluation, "trial_failed", "TrialFailed")
            return
        since = datetime.fromisoformat(self.guard.trial_since or self.stamp)
        held = (situation.now - since).total_seconds() >= guard.window_seconds
        windows = self.guard.consecutive_good
        if (held and windows >= guard.consecutive_breaches) or evaluation.decisive:
            message = (
                f"Speculation pays again on the canary after "
                f"{_windows_words(evaluation, windows)} ({_speedup_words(evaluation)}): kill "
                "switch released, the fleet rolls to speculation and the canary is removed."
            )
            evidence = {**evaluation.evidence(), "windows": windows}
            if self.act("kill_switch_released", "SpeculationPays", message, evidence):
                self.kill_switch = KillSwitchStatus(
                    state=KillSwitchState.RELEASED,
                    source="guard",
                    since=self.stamp,
                    reason=message,
                )
                self.guard.consecutive_good = 0

    # 5. rate limit ---------------------------------------------------------------------------

    def rate_limit(self, situation: Situation) -> None:
        recent = [
            t for t in self.guard.action_times if situation.now - datetime.fromisoformat(t) < HOUR
        ]
        if len(recent) < len(self.guard.action_times):
            self.guard.action_times = recent
        limit = situation.policy.guard.max_actions_per_hour
        if len(recent) <= limit or self.guard.flapping:
            return
        self.guard.flapping = True
        message = (
            f"{len(recent)} actions in the last hour (limit {limit}): speculation latched off "
            "until the next revision."
        )
        self.actions.append(Action("flapping", "Flapping", message, {"actions": len(recent)}))
        if situation.policy.k and not situation.policy.guard.dry_run:
            self.kill_switch = KillSwitchStatus(
                state=KillSwitchState.ENGAGED,
                source="guard",
                since=self.stamp,
                reason=message,
            )


def _lost_to_load(situation: Situation, evaluation: Evaluation) -> float | None:
    """The batch up to which speculation would pay again, when load (not acceptance) is what
    made it lose: the speedup without the load term reaches a trial's threshold."""
    if evaluation.speedup is None or evaluation.in_flight is None or evaluation.load >= 1.0:
        return None
    if evaluation.below_acceptance_floor:
        return None
    guard, policy = situation.policy.guard, situation.policy
    threshold = guard.min_speedup + guard.release_margin
    unloaded = evaluation.speedup / evaluation.load
    batch = paying_batch(unloaded, evaluation.drafts_per_step, policy.per_token_compute, threshold)
    return round(batch, 1) if 0.0 < batch < evaluation.in_flight else None


def _named(evaluation: Evaluation, breaches: Callable[[ClassVerdict], Sequence[str]]) -> list[str]:
    """Each class's breaches, prefixed with the class's name."""
    return [f"{v.name}: {b}" for v in evaluation.classes for b in breaches(v)]


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
    interval = f" (95% {side} bound {bound:.2f})" if bound is not None else ""
    return (
        f"traffic-weighted speedup {evaluation.speedup:.2f}{interval} vs "
        f"{evaluation.threshold:.2f} needed"
    )


def _baseline(observation: Observation | None) -> QualityBaseline | None:
    if observation is None:
        return None
    windows = list(observation.classes.values())

    def total(attr: str) -> float:
        return sum(getattr(w, attr) or 0.0 for w in windows)

    tool = total("tool_calls_valid") + total("tool_calls_invalid")
    structured = total("structured_valid") + total("structured_invalid")
    requests = total("requests")
    return QualityBaseline(
        tool_call_validity=total("tool_calls_valid") / tool if tool else None,
        structured_output_validity=total("structured_valid") / structured if structured else None,
        error_rate=total("errors") / requests if requests else None,
    )


def _class_observation(
    name: str, window: ClassWindow | None, speedup: float | None, verdict: str
) -> ClassObservation:
    if window is None:
        return ClassObservation(name=name, verdict=verdict)
    return ClassObservation(
        name=name,
        requests=window.requests,
        draft_tokens=window.draft_tokens,
        accepted_tokens=window.accepted_tokens,
        acceptance_rate=_r(window.acceptance_rate),
        mean_acceptance_length=_r(window.mean_acceptance_length),
        p95_ttft_seconds=_r(window.p95_ttft_seconds),
        p95_tpot_seconds=_r(window.p95_tpot_seconds),
        tool_call_validity=_r(window.tool_call_validity),
        expected_speedup=_r(speedup),
        verdict=verdict,
    )


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
