"""Probation: one judgement on what the new revision has shown since it began (`guard.evidence`:
the fleet's windows summed, a tick at a time). A revision whose evidence breaches a class's
quality limits (tool-call / structured-output validity, truncation, error rate) or latency SLOs
(p95 TTFT and TPOT of the last window, against the SLO and the last good revision's) N
evaluations in a row is rolled back to the rollback target; after probationSeconds without
breach, N good evaluations, and every judged class's quality shown within its limits (the
converse of a breach, at the same error rate), it becomes the last good. Undecided at
probationDeadlineSeconds it is kept, unproven (`kept`): it serves on and the guard says so.

Attribution: a latency breach that speculation explains (it does not pay, and plain decoding
would meet the limit) is the kill switch's to answer, not the revision's; one it does not
explain is the revision's, and while it can be rolled back the kill switch waits. N good
evaluations in a row make the revision a rollback target (it served clean) before it passes.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from specfleet.api.status import (
    DecisionReason,
    LatencyBaseline,
    QualityBaseline,
    RevisionVerdict,
)
from specfleet.guard import evidence as accumulated
from specfleet.guard.actions import ActionKind, named
from specfleet.guard.situation import Tick
from specfleet.guard.verdict import Evaluation
from specfleet.signals import EMPTY_ANSWER_RATE, TRUNCATION_RATE, Signal
from specfleet.telemetry.model import Observation

PROBATION = RevisionVerdict.PROBATION
"""Read once (as `killswitch.TRIAL`)."""


def judge_revision(
    tick: Tick, window: Evaluation, evaluate: Callable[[Observation], Evaluation]
) -> None:
    """`window`: this tick's window judged; `evaluate`: the guard's evaluation, which judges the
    evidence so far. Either may show a breach: the window a sudden one, the evidence a quiet
    revision's; the promotion's proof is the evidence's (one window rarely holds enough)."""
    situation, guard = tick.situation, tick.guard
    revision = situation.revision
    if revision.verdict != PROBATION or situation.observation is None:
        return
    if guard.probation_revision != revision.number:
        guard.probation_revision, guard.probation_since = revision.number, tick.stamp
        guard.quality_bad, guard.quality_good, guard.flapping = 0, 0, False
        guard.probation_evidence = None
    since = datetime.fromisoformat(guard.probation_since or tick.stamp)
    deadline = situation.policy.guard.probation_deadline_seconds
    evidence = tick.resumed(guard.probation_evidence or accumulated.begin(since, deadline))
    grown = accumulated.added(evidence, situation.observation, situation.now)
    guard.probation_evidence = grown or evidence
    summed = None
    if grown is not None:
        summed = evaluate(accumulated.observation(grown, situation.observation, latency=False))
    _judge(tick, window, summed, since)
    if tick.verdict == PROBATION and accumulated.overdue(guard.probation_evidence, situation.now):
        _keep(tick)


def _judge(tick: Tick, window: Evaluation, summed: Evaluation | None, since: datetime) -> None:
    """`since`: when probation began."""
    situation, guard = tick.situation, tick.guard
    revision = situation.revision
    shown = [window.revision_bad, summed.revision_bad if summed else None]
    bad = True if True in shown else (False if False in shown else None)
    if bad:
        guard.quality_bad, guard.quality_good = guard.quality_bad + 1, 0
        tick.revision_suspect = situation.has_last_good
    elif bad is False:
        guard.quality_bad, guard.quality_good = 0, guard.quality_good + 1
    needed = situation.policy.guard.consecutive_breaches
    if guard.quality_bad >= needed:
        _breach(tick, window if window.revision_bad or summed is None else summed)
        return
    tick.served_clean = guard.quality_good >= needed
    served = (situation.now - since).total_seconds() >= situation.policy.guard.probation_seconds
    # Time alone proves nothing: the last N evaluations must have judged the revision good, and
    # its evidence shown every quality signal within its limits.
    if served and tick.served_clean and summed is not None and not summed.revision_unproven:
        tick.verdict = RevisionVerdict.GOOD
        guard.baseline = baseline(situation.observation, situation.policy.guard.min_requests)
        tick.act(
            ActionKind.REVISION_PROMOTED,
            DecisionReason.REVISION_PROMOTED,
            f"Revision {revision.number} passed probation and is the last good revision.",
            window.evidence(),
        )


def _keep(tick: Tick) -> None:
    """Probation's deadline passed undecided: the revision serves on, unproven."""
    guard, situation = tick.guard, tick.situation
    evidence = guard.probation_evidence
    seconds = evidence.seconds if evidence else 0.0
    deadline = situation.policy.guard.probation_deadline_seconds
    message = (
        f"Revision {situation.revision.number} kept unproven: its probation reached its "
        f"deadline ({deadline} s) undecided, its evidence {seconds:.0f} s of quiet serving. It "
        "serves on and is "
        "no rollback target until it has served clean; a breach the guard sees later is the "
        "kill switch's and the classes' to name."
    )
    facts = {"deadline": True, "evidenceSeconds": round(seconds)}
    if tick.act(ActionKind.REVISION_KEPT, DecisionReason.PROBATION_DEADLINE, message, facts):
        tick.verdict = RevisionVerdict.KEPT


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
