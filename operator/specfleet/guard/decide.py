"""`decide(situation) -> Decision`: the guard's policy, pure and deterministic (clock injected).

One evaluation per tick and SpecModel, each concern in its module:
1. No data: inconclusive; after blindAfterSeconds raise MetricsBlind and alert; state frozen
   (`blindness`).
2. A canary rollout's step: the canary against the control on the same window (`rollout`).
   The fleet's rollout in progress: inconclusive (windows must show only the new pods).
3. Probation: a new revision that breaches quality floors or latency SLOs is rolled back to
   the rollback target, or becomes the last good after probationSeconds (`probation`).
4. Speculation: the kill switch engages when it does not pay and a trial on a canary may release
   it (`killswitch`, whose docstring says why speculation is off).
   Every class, critical or not, is named once when it breaches and once when it is back
   (`classes`); that changes nothing that runs, unless guard.routeClasses routes a class whose
   own speculation does not pay to the plain pool (`class_switch`): the kill switch then judges
   the other classes.
5. More than maxActionsPerHour actions latch speculation off (`ratelimit`).
6. Overrides (annotation, spec mode) and dryRun: decide and alert, never act.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property, partial

from specfleet.api.status import ClassObservation, GuardStatus, JudgedOn, KillSwitchStatus
from specfleet.guard import (
    blindness,
    class_switch,
    classes,
    killswitch,
    probation,
    quiet,
    ratelimit,
    rollout,
)
from specfleet.guard.actions import Action
from specfleet.guard.policy import Policy
from specfleet.guard.rollout import StepJudgement
from specfleet.guard.situation import QuietJudgement, Situation, Tick
from specfleet.guard.speedup import weighted
from specfleet.guard.verdict import ClassVerdict, Evaluation, evaluate, excluding
from specfleet.telemetry.model import Observation


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
    served_clean: bool = False
    """The active revision served N windows in a row judged good: a rollback target."""
    rollout_step: StepJudgement | None = None
    """What this evaluation made of a canary rollout's step (`tick.rollouts.judged` writes it
    into the rollout's status)."""
    quiet: QuietJudgement | None = None
    """The classes the window left unjudged, judged on the fleet's evidence instead."""
    routed: frozenset[str] = frozenset()
    """The classes judged on what the plain pool served them (`_with_routed`)."""

    # What each class was judged on is built when the status is written, not on every tick.
    @cached_property
    def classes(self) -> list[ClassObservation]:
        observation = self.observation
        if self.evaluation is None or observation is None:
            return []
        quiet, routed = self.quiet, self.routed
        plain = replace(observation, classes=observation.plain) if routed else observation
        found = [
            _class_observation(quiet.classes[v.name], quiet.evidence, JudgedOn.ACCUMULATED)
            if quiet is not None and v.name in quiet.classes
            else _class_observation(v, plain, JudgedOn.PLAIN_POOL)
            if v.name in routed
            else _class_observation(v, observation, JudgedOn.WINDOW)
            for v in self.evaluation.classes
        ]
        return [_with_plain_pool(c, observation) for c in found]

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
    tick = Tick.start(situation)
    if not _has_data(situation.observation):
        blindness.blind(tick)
        return _decision(tick)
    blindness.data_seen(tick)
    step = rollout.judge_step(tick)
    if not situation.settled or situation.observation is None:
        return _decision(tick, step)
    if not situation.observation.speculation:
        killswitch.remember_tpot_without_speculation(tick, situation.observation)
    evaluation = _judge(tick, situation.observation, situation.policy)
    judge_evidence = partial(_evaluate, tick, policy=situation.policy)
    probation.judge_revision(tick, evaluation, judge_evidence)
    evaluation = quiet.judged(tick, evaluation, judge_evidence)
    classes.judge(tick, evaluation)
    fleet = class_switch.switch(tick, evaluation, judge_evidence)
    judged = _judge_canary(tick) if situation.kill_switch.trial else fleet
    if judged is not None:
        killswitch.transition(tick, judged)
    killswitch.end_overdue_trial(tick)
    ratelimit.limit(tick)
    return _decision(tick, step)


def _decision(tick: Tick, rollout_step: StepJudgement | None = None) -> Decision:
    return Decision(
        guard=tick.guard,
        kill_switch=tick.kill_switch,
        verdict=tick.verdict,
        actions=tick.actions,
        observation=tick.observation or tick.situation.observation,
        evaluation=tick.evaluation,
        served_clean=tick.served_clean,
        rollout_step=rollout_step,
        quiet=tick.quiet,
        routed=tick.routed,
    )


def _judge(tick: Tick, observation: Observation, policy: Policy) -> Evaluation:
    """Evaluates a window, as what status shows (with the classes a quiet fleet's evidence
    judges instead, until a trial's canary is judged)."""
    tick.observation, tick.quiet = observation, None
    tick.evaluation = _with_routed(tick, _evaluate(tick, observation, policy), policy)
    return tick.evaluation


def _with_routed(tick: Tick, evaluation: Evaluation, policy: Policy) -> Evaluation:
    """The classes the fleet's engines served none of, judged instead on what the plain pool
    served them (quality and latency: nothing drafted there), so a routed class is still
    watched, and named when it breaches. The fleet's speculation is judged without them."""
    observation = tick.observation
    plain = observation.plain if observation is not None else {}
    routed = {v.name for v in evaluation.classes if not v.conclusive and v.name in plain}
    tick.routed = frozenset(routed)
    if observation is None or not routed:
        return evaluation
    served = replace(observation, speculation=False, classes=plain, plain={}, canary=None)
    judged = {v.name: v for v in _evaluate(tick, served, policy).classes if v.name in routed}
    return evaluation._replace(classes=[judged.get(v.name, v) for v in evaluation.classes])


def _evaluate(tick: Tick, observation: Observation, policy: Policy) -> Evaluation:
    """With TPOT without speculation as last measured (this window's own, when the fleet runs
    without)."""
    return evaluate(
        policy,
        observation,
        killswitch.threshold(tick.situation),
        killswitch.tpot_without_speculation(tick),
        tick.guard.baseline,
    )


def _judge_canary(tick: Tick) -> Evaluation | None:
    """A trial is judged on what its canary alone has shown since the trial began (None while
    nothing new): one pod, so the requests in flight per replica are its own; without the
    classes off speculation alone (they will be routed once the fleet speculates)."""
    canary = killswitch.trial_evidence(tick)
    if canary is None:
        return None
    judged = _judge(tick, canary, replace(tick.situation.policy, replicas=1))
    off = class_switch.excluded(tick)
    return excluding(judged, off, tick.situation.policy, True) if off else judged


def _has_data(observation: Observation | None) -> bool:
    if observation is None or observation.blind:
        return False
    return any(c.requests is not None for c in observation.classes.values())


def _class_observation(
    verdict: ClassVerdict, judged: Observation, judged_on: JudgedOn
) -> ClassObservation:
    window = judged.classes.get(verdict.name)
    if window is None:
        return ClassObservation(name=verdict.name, judged_on=judged_on, verdict=verdict.verdict)
    return ClassObservation(
        name=verdict.name,
        judged_on=judged_on,
        seconds=_r(judged.window_seconds),
        requests=window.requests,
        draft_tokens=window.draft_tokens,
        accepted_tokens=window.accepted_tokens,
        acceptance_rate=_r(window.acceptance_rate),
        mean_acceptance_length=_r(window.mean_acceptance_length),
        p95_ttft_seconds=_r(window.p95_ttft_seconds),
        p95_tpot_seconds=_r(window.p95_tpot_seconds),
        tool_call_validity=_r(window.tool_call_validity),
        expected_speedup=_r(verdict.speedup),
        verdict=verdict.verdict,
    )


def _with_plain_pool(found: ClassObservation, observation: Observation) -> ClassObservation:
    window = observation.plain.get(found.name)
    if window is None or not window.requests:
        return found
    return found.model_copy(update={"plain_pool_requests": window.requests})


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
