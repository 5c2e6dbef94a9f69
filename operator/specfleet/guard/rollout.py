"""A canary rollout's steps. Each step is one judgement (`guard.evidence`): the canary and the
control accumulate what their windows show from when the step's pods were available, and the
step is judged on the sums at every tick (`guard.analysis`). A breach of a share (quality,
acceptance) at the stated error rate, a decisive one, or consecutiveBreaches breaching windows in
a row abort it (the revision is bad, the canary removed, the fleet untouched); the step passes
once its evidence shows every class within its limits, `windows` judgements in a row; passing
the last promotes the revision to the whole fleet. A step its evidence has not decided by
rollout.stepDeadlineSeconds ends as rollout.onInconclusive says (abort by default). A step's
first two guard windows are its pods' warm-up: their latency counts only where decisive (a fresh
pod's first requests are slow), and no judgement is good before."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from specfleet.api.spec import InconclusivePolicy
from specfleet.api.status import (
    DecisionReason,
    Evidence,
    RolloutAnalysis,
    RolloutPhase,
    RolloutStatus,
)
from specfleet.guard import evidence as accumulated
from specfleet.guard.actions import ActionKind
from specfleet.guard.analysis import Analysis, analyse
from specfleet.guard.probation import baseline
from specfleet.guard.situation import Tick
from specfleet.signals import P95_TPOT, P95_TTFT


@dataclass(frozen=True)
class StepJudgement:
    """What one evaluation made of a canary rollout's step. The guard reads the rollout's status
    and never edits it: `tick.rollouts.judged` writes this into it."""

    good_windows: int
    bad_windows: int
    """The step's good and breaching windows in a row, this one counted."""
    analysis: RolloutAnalysis | None = None
    """The window judged; None: none was (a canary that never became available)."""
    passed: bool = False
    """The step passed: the next one starts, its windows counted from none."""
    ended: RolloutPhase | None = None
    """`Promoted` or `Aborted`."""
    message: str | None = None
    """Where the rollout stands, when it passed a step or ended."""
    evidence: Evidence | None = None
    """The step's evidence as this evaluation leaves it (None: unchanged)."""


LATENCY = (P95_TTFT, P95_TPOT)
"""Breaches read from one window's p95s, not from the sums: they need company, or to be
decisive."""


def judge_step(tick: Tick) -> StepJudgement | None:
    """None: no step judged (no rollout, or its canary's pods not yet all available)."""
    situation, rollout = tick.situation, tick.situation.rollout
    if rollout is not None and situation.rollout_stalled:
        return _abort_stalled(tick, rollout, situation.rollout_stalled)
    if rollout is None or rollout.step_since is None:
        return None
    deadline = situation.policy.rollout.step_deadline_seconds
    started = datetime.fromisoformat(rollout.step_since)
    evidence = tick.resumed(rollout.evidence or accumulated.begin(started, deadline))
    grown = None
    if situation.observation is not None:
        grown = accumulated.added(evidence, situation.canary, situation.now, situation.observation)
    if grown is None:
        kept = StepJudgement(rollout.good_windows, rollout.bad_windows, evidence=evidence)
        if accumulated.overdue(evidence, situation.now):
            return _deadline(tick, rollout, kept)
        return kept
    return _judge(tick, rollout, grown)


def _judge(tick: Tick, rollout: RolloutStatus, evidence: Evidence) -> StepJudgement:
    situation = tick.situation
    assert situation.canary is not None and situation.observation is not None
    canary = accumulated.observation(evidence, situation.canary)
    control = accumulated.observation(evidence, situation.observation, control=True)
    window = situation.policy.guard.window_seconds
    warm = _served_for(tick, rollout, 2 * window)  # the window holds none of its first one
    analysis = analyse(situation.policy, canary, control, latency=warm)
    counted = _counted(rollout, analysis, tick.stamp)
    counted = replace(counted, evidence=_pending(evidence, analysis))
    needed = situation.policy.guard.consecutive_breaches
    proven = any(b.signal not in LATENCY for b in analysis.breaches)
    if analysis.verdict == "bad" and (proven or analysis.decisive or counted.bad_windows >= needed):
        return _abort(tick, rollout, counted, analysis)
    if counted.good_windows >= rollout.windows and warm:
        return _pass(tick, rollout, counted)
    if accumulated.overdue(evidence, situation.now):
        return _deadline(tick, rollout, counted)
    return counted


def _pending(evidence: Evidence, analysis: Analysis) -> Evidence:
    """The evidence, saying what the step still needs to be decided."""
    pending = [f"{name}: too few requests on the canary" for name in analysis.unjudged]
    pending += [u.words() for u in analysis.unproven]
    if not analysis.latency_judged:
        pending.append("the canary's latency: warming up")
    return evidence.model_copy(update={"pending": pending})


def _deadline(tick: Tick, rollout: RolloutStatus, counted: StepJudgement) -> StepJudgement:
    """The step's deadline passed undecided: abort (the safe default) or pass, as the spec
    says, with what the evidence showed."""
    evidence = counted.evidence or rollout.evidence
    policy = tick.situation.policy.rollout.on_inconclusive
    shown = evidence.pending if evidence else []
    what = "; ".join(shown) if shown else "no window of the canary"
    seconds = evidence.seconds if evidence else 0.0
    told = (
        f"Revision {rollout.revision}'s canary step {rollout.step} of {rollout.steps} reached "
        f"its deadline undecided on {seconds:.0f} s of its canary's serving (still unknown: "
        f"{what})"
    )
    facts = {**_evidence(rollout, counted), "deadline": True, "pending": shown}
    if policy == InconclusivePolicy.PASS:
        told += ": passed unproven, as rollout.onInconclusive says."
        return _pass(tick, rollout, counted, told, facts)
    message = (
        f"{told}: aborted, as rollout.onInconclusive says. Canary removed; the fleet stays on "
        f"revision {rollout.control} until the engine config or specfleet.dev/retry changes."
    )
    if not tick.act(ActionKind.ROLLOUT_ABORTED, DecisionReason.STEP_DEADLINE, message, facts):
        return counted
    return replace(counted, ended=RolloutPhase.ABORTED, message=f"deadline: {message}")


def _counted(rollout: RolloutStatus, analysis: Analysis, stamp: str) -> StepJudgement:
    good, bad = rollout.good_windows, rollout.bad_windows
    if analysis.verdict == "bad":
        good, bad = 0, bad + 1
    elif analysis.verdict == "good":
        good, bad = good + 1, 0
    last = RolloutAnalysis(
        time=stamp,
        verdict=analysis.verdict,
        decisive=analysis.decisive,
        breaches=[b.words() for b in analysis.breaches],
        unjudged=analysis.unjudged,
        latency_judged=analysis.latency_judged,
    )
    return StepJudgement(good, bad, last)


def _served_for(tick: Tick, rollout: RolloutStatus, seconds: float) -> bool:
    if rollout.step_since is None:
        return False
    served = (tick.situation.now - datetime.fromisoformat(rollout.step_since)).total_seconds()
    return served >= seconds


def _evidence(
    rollout: RolloutStatus, counted: StepJudgement, analysis: Analysis | None = None
) -> dict[str, Any]:
    evidence: dict[str, Any] = {
        "revision": rollout.revision,
        "control": rollout.control,
        "step": rollout.step,
        "steps": rollout.steps,
        "canaryPods": rollout.pods,
        "goodWindows": counted.good_windows,
        "badWindows": counted.bad_windows,
    }
    if analysis is not None:
        evidence["breaches"] = [b.evidence() for b in analysis.breaches]
        evidence["decisive"] = analysis.decisive
    return evidence


def _abort(
    tick: Tick, rollout: RolloutStatus, counted: StepJudgement, analysis: Analysis
) -> StepJudgement:
    # what decided first: the status and a shortened condition message name it
    breaches = sorted(analysis.breaches, key=lambda b: not b.decisive)
    first = breaches[0]
    how = "1 decisive window" if analysis.decisive else f"{counted.bad_windows} windows in a row"
    message = (
        f"Revision {rollout.revision} aborted at canary step {rollout.step} of {rollout.steps} "
        f"after {how}: {'; '.join(b.words() for b in breaches)}. Canary removed; the "
        f"fleet stays on revision {rollout.control} until the engine config or "
        "specfleet.dev/retry changes."
    )
    evidence = _evidence(rollout, counted, analysis)
    if not tick.act(ActionKind.ROLLOUT_ABORTED, DecisionReason.ROLLOUT_ABORTED, message, evidence):
        return counted
    shown = f"{first.klass} {first.signal}: {message}"
    return replace(counted, ended=RolloutPhase.ABORTED, message=shown)


def _abort_stalled(tick: Tick, rollout: RolloutStatus, why: str) -> StepJudgement:
    """A canary that never becomes available is never judged: its revision does not serve."""
    message = (
        f"Revision {rollout.revision} aborted at canary step {rollout.step} of {rollout.steps}: "
        f"its pods did not become available ({why}). Canary removed; the fleet stays on revision "
        f"{rollout.control} until the engine config or specfleet.dev/retry changes."
    )
    kept = StepJudgement(rollout.good_windows, rollout.bad_windows)
    evidence = {**_evidence(rollout, kept), "stalled": why}
    if not tick.act(ActionKind.ROLLOUT_ABORTED, DecisionReason.ROLLOUT_ABORTED, message, evidence):
        return kept
    return replace(kept, ended=RolloutPhase.ABORTED, message=f"canary not available: {message}")


def _pass(
    tick: Tick,
    rollout: RolloutStatus,
    counted: StepJudgement,
    unproven: str | None = None,
    facts: dict[str, Any] | None = None,
) -> StepJudgement:
    """`unproven`: the words of a deadline that passed the step without proof."""
    evidence = facts or _evidence(rollout, counted)
    if rollout.step >= rollout.steps:
        message = (
            f"Revision {rollout.revision} passed every canary step ({rollout.steps}): promoted, "
            "the whole fleet rolls to it and the canary is removed."
        )
        if unproven:
            message = f"{unproven} Promoted: the whole fleet rolls to it."
        if not tick.act(
            ActionKind.ROLLOUT_PROMOTED, DecisionReason.ROLLOUT_PROMOTED, message, evidence
        ):
            return counted
        # the last good revision is now this one: later revisions are held to its windows
        min_requests = tick.situation.policy.guard.min_requests
        tick.guard.baseline = baseline(tick.situation.canary, min_requests)
        return replace(counted, ended=RolloutPhase.PROMOTED, message=message)
    message = unproven or (
        f"Revision {rollout.revision} passed canary step {rollout.step} of {rollout.steps} "
        f"after {counted.good_windows} good windows against revision {rollout.control}."
    )
    if not tick.act(
        ActionKind.ROLLOUT_STEP_PASSED, DecisionReason.ROLLOUT_STEP_PASSED, message, evidence
    ):
        return counted
    return replace(counted, passed=True, message=message)
