"""A canary rollout's steps: each window the canary served (`guard.analysis`) counts for or
against the step. One decisive window or consecutiveBreaches breaching windows in a row abort it
(the revision is bad, the canary removed, the fleet untouched); the step's windows good in a row
pass it; passing the last promotes the revision to the whole fleet. Inconclusive windows count
neither way. A step's first two guard windows are its pods' warm-up: their answers are judged,
their latency only where decisive (a fresh pod's first requests are slow), and no window is good
before."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from specfleet.api.status import RolloutAnalysis, RolloutPhase, RolloutStatus
from specfleet.guard.actions import ActionKind
from specfleet.guard.analysis import Analysis, analyse
from specfleet.guard.probation import baseline
from specfleet.guard.situation import Tick


def judge_step(tick: Tick) -> None:
    situation, rollout = tick.situation, tick.rollout
    if rollout is not None and situation.rollout_stalled:
        _abort_stalled(tick, rollout, situation.rollout_stalled)
        return
    if rollout is None or situation.canary is None or situation.observation is None:
        return
    window = situation.policy.guard.window_seconds
    warm = _served_for(tick, rollout, 2 * window)  # the window holds none of its first one
    analysis = analyse(situation.policy, situation.canary, situation.observation, latency=warm)
    rollout = _counted(rollout, analysis, tick.stamp)
    tick.rollout = rollout
    needed = situation.policy.guard.consecutive_breaches
    if analysis.verdict == "bad" and (analysis.decisive or rollout.bad_windows >= needed):
        _abort(tick, rollout, analysis)
    elif rollout.good_windows >= rollout.windows and warm:
        _pass(tick, rollout)


def _counted(rollout: RolloutStatus, analysis: Analysis, stamp: str) -> RolloutStatus:
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
    return rollout.model_copy(
        update={"good_windows": good, "bad_windows": bad, "last_analysis": last}
    )


def _served_for(tick: Tick, rollout: RolloutStatus, seconds: float) -> bool:
    if rollout.step_since is None:
        return False
    served = (tick.situation.now - datetime.fromisoformat(rollout.step_since)).total_seconds()
    return served >= seconds


def _evidence(rollout: RolloutStatus, analysis: Analysis | None = None) -> dict[str, Any]:
    evidence: dict[str, Any] = {
        "revision": rollout.revision,
        "control": rollout.control,
        "step": rollout.step,
        "steps": rollout.steps,
        "canaryPods": rollout.pods,
        "goodWindows": rollout.good_windows,
        "badWindows": rollout.bad_windows,
    }
    if analysis is not None:
        evidence["breaches"] = [b.evidence() for b in analysis.breaches]
        evidence["decisive"] = analysis.decisive
    return evidence


def _abort(tick: Tick, rollout: RolloutStatus, analysis: Analysis) -> None:
    # what decided first: the status and a shortened condition message name it
    breaches = sorted(analysis.breaches, key=lambda b: not b.decisive)
    first = breaches[0]
    how = "1 decisive window" if analysis.decisive else f"{rollout.bad_windows} windows in a row"
    message = (
        f"Revision {rollout.revision} aborted at canary step {rollout.step} of {rollout.steps} "
        f"after {how}: {'; '.join(b.words() for b in breaches)}. Canary removed; the "
        f"fleet stays on revision {rollout.control} until the engine config or "
        "specfleet.dev/retry changes."
    )
    if tick.act(
        ActionKind.ROLLOUT_ABORTED, "RolloutAborted", message, _evidence(rollout, analysis)
    ):
        tick.rollout = rollout.model_copy(
            update={
                "phase": RolloutPhase.ABORTED,
                "message": f"{first.klass} {first.signal}: {message}",
            }
        )


def _abort_stalled(tick: Tick, rollout: RolloutStatus, why: str) -> None:
    """A canary that never becomes available is never judged: its revision does not serve."""
    message = (
        f"Revision {rollout.revision} aborted at canary step {rollout.step} of {rollout.steps}: "
        f"its pods did not become available ({why}). Canary removed; the fleet stays on revision "
        f"{rollout.control} until the engine config or specfleet.dev/retry changes."
    )
    evidence = {**_evidence(rollout), "stalled": why}
    if tick.act(ActionKind.ROLLOUT_ABORTED, "RolloutAborted", message, evidence):
        tick.rollout = rollout.model_copy(
            update={"phase": RolloutPhase.ABORTED, "message": f"canary not available: {message}"}
        )


def _pass(tick: Tick, rollout: RolloutStatus) -> None:
    evidence = _evidence(rollout)
    if rollout.step >= rollout.steps:
        message = (
            f"Revision {rollout.revision} passed every canary step ({rollout.steps}): promoted, "
            "the whole fleet rolls to it and the canary is removed."
        )
        if tick.act(ActionKind.ROLLOUT_PROMOTED, "RolloutPromoted", message, evidence):
            tick.rollout = rollout.model_copy(
                update={"phase": RolloutPhase.PROMOTED, "message": message}
            )
            # the last good revision is now this one: later revisions are held to its windows
            min_requests = tick.situation.policy.guard.min_requests
            tick.guard.baseline = baseline(tick.situation.canary, min_requests)
        return
    message = (
        f"Revision {rollout.revision} passed canary step {rollout.step} of {rollout.steps} "
        f"after {rollout.good_windows} good windows against revision {rollout.control}."
    )
    if tick.act(ActionKind.ROLLOUT_STEP_PASSED, "RolloutStepPassed", message, evidence):
        tick.rollout = rollout.model_copy(
            update={
                "step": rollout.step + 1,
                "step_since": None,
                "good_windows": 0,
                "bad_windows": 0,
                "message": message,
            }
        )
