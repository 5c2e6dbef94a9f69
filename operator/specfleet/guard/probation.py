"""Probation: a new revision that breaches a class's quality limits (tool-call / structured-output
validity, truncation, error rate) or latency SLOs (p95 TTFT and TPOT, against the SLO and the last
good revision's) N evaluations in a row is rolled back to the rollback target; after
probationSeconds without breach, and N good evaluations, it becomes the last good.

Attribution: a latency breach that speculation explains (it does not pay, and plain decoding
would meet the limit) is the kill switch's to answer, not the revision's; one it does not
explain is the revision's, and while it can be rolled back the kill switch waits. N good
evaluations in a row make the revision a rollback target (it served clean) before it passes.
"""

from __future__ import annotations

from datetime import datetime

from specfleet.api.status import (
    DecisionReason,
    LatencyBaseline,
    QualityBaseline,
    RevisionVerdict,
)
from specfleet.guard.actions import ActionKind, named
from specfleet.guard.situation import Tick
from specfleet.guard.verdict import Evaluation
from specfleet.signals import EMPTY_ANSWER_RATE, TRUNCATION_RATE, Signal
from specfleet.telemetry.model import Observation

PROBATION = RevisionVerdict.PROBATION
"""Read once (as `killswitch.TRIAL`)."""


def judge_revision(tick: Tick, evaluation: Evaluation) -> None:
    situation, guard = tick.situation, tick.guard
    revision = situation.revision
    if revision.verdict != PROBATION:
        return
    if guard.probation_revision != revision.number:
        guard.probation_revision, guard.probation_since = revision.number, tick.stamp
        guard.quality_bad, guard.quality_good, guard.flapping = 0, 0, False
    bad = evaluation.revision_bad
    if bad:
        guard.quality_bad, guard.quality_good = guard.quality_bad + 1, 0
        tick.revision_suspect = situation.has_last_good
    elif bad is False:
        guard.quality_bad, guard.quality_good = 0, guard.quality_good + 1
    needed = situation.policy.guard.consecutive_breaches
    if guard.quality_bad >= needed:
        _breach(tick, evaluation)
        return
    tick.served_clean = guard.quality_good >= needed
    since = datetime.fromisoformat(guard.probation_since or tick.stamp)
    served = (situation.now - since).total_seconds() >= situation.policy.guard.probation_seconds
    # Time alone proves nothing: the last N windows must have judged the revision good.
    if served and tick.served_clean:
        tick.verdict = RevisionVerdict.GOOD
        guard.baseline = baseline(situation.observation, situation.policy.guard.min_requests)
        tick.act(
            ActionKind.REVISION_PROMOTED,
            DecisionReason.REVISION_PROMOTED,
            f"Revision {revision.number} passed probation and is the last good revision.",
            evaluation.evidence(),
        )


def _breach(tick: Tick, evaluation: Evaluation) -> None:
    breaches = named(evaluation, lambda v: v.revision_breaches(evaluation.speculation_bad))
    evidence = {**evaluation.evidence(), "breaches": breaches}
    tick.guard.quality_bad = 0
    situation = tick.situation
    number, target = situation.revision.number, situation.rollback_target
    if not situation.has_last_good:
        tick.act(
            ActionKind.QUALITY_BREACH,
            DecisionReason.QUALITY_BREACH,
            f"Revision {number} breaches its SLOs ({'; '.join(breaches)}) and there is no "
            "earlier revision that served clean to roll back to.",
            evidence,
        )
        return
    to = f"revision {target}" if target is not None else "the last good revision"
    if tick.act(
        ActionKind.ROLLED_BACK,
        DecisionReason.ROLLED_BACK,
        f"Revision {number} breaches its SLOs ({'; '.join(breaches)}): rolled back to {to} "
        "until the engine config or specfleet.dev/retry changes.",
        {**evidence, "rollbackTo": target},
    ):
        tick.verdict = RevisionVerdict.BAD


def baseline(observation: Observation | None, min_requests: int) -> QualityBaseline | None:
    """The last good revision's quality and latency, from a window it served."""
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
        latency={
            name: LatencyBaseline(
                p95_ttft_seconds=w.p95_ttft_seconds,
                p95_tpot_seconds=w.p95_tpot_seconds,
                requests=w.requests or 0.0,
                speculation=observation.speculation,
            )
            for name, w in observation.classes.items()
            if (w.requests or 0.0) >= min_requests
        },
        truncation_rate=_per_class(observation, TRUNCATION_RATE, min_requests),
        empty_answer_rate=_per_class(observation, EMPTY_ANSWER_RATE, min_requests),
    )


def _per_class(observation: Observation, signal: Signal, min_samples: int) -> dict[str, float]:
    """The signal's value of each class with enough samples: classes differ (long answers are
    cut more often)."""
    found = {}
    for name, window in observation.classes.items():
        value = signal.value(window)
        if value is not None and signal.samples(window) >= min_samples:
            found[name] = value
    return found
