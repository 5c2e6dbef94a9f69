"""Probation: a new revision that breaks quality floors (tool-call / structured-output validity,
error rate) N evaluations in a row is rolled back to the last good revision; after
probationSeconds without breach, and N good evaluations, it becomes the last good."""

from __future__ import annotations

from datetime import datetime

from specfleet.api.status import QualityBaseline, RevisionVerdict
from specfleet.guard.actions import ActionKind, named
from specfleet.guard.tick import Tick
from specfleet.guard.verdict import Evaluation
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
    quality_bad = evaluation.quality_bad
    if quality_bad:
        guard.quality_bad, guard.quality_good = guard.quality_bad + 1, 0
    elif quality_bad is False:
        guard.quality_bad, guard.quality_good = 0, guard.quality_good + 1
    needed = situation.policy.guard.consecutive_breaches
    if guard.quality_bad >= needed:
        _quality_breach(tick, evaluation)
        return
    since = datetime.fromisoformat(guard.probation_since or tick.stamp)
    served = (situation.now - since).total_seconds() >= situation.policy.guard.probation_seconds
    # Time alone proves nothing: the last N windows must have judged the revision good.
    if served and guard.quality_good >= needed:
        tick.verdict = RevisionVerdict.GOOD
        guard.baseline = _baseline(situation.observation)
        tick.act(
            ActionKind.REVISION_PROMOTED,
            "RevisionPromoted",
            f"Revision {revision.number} passed probation and is the last good revision.",
            evaluation.evidence(),
        )


def _quality_breach(tick: Tick, evaluation: Evaluation) -> None:
    breaches = named(evaluation, lambda v: v.quality_breaches)
    evidence = {**evaluation.evidence(), "breaches": breaches}
    tick.guard.quality_bad = 0
    number = tick.situation.revision.number
    if not tick.situation.has_last_good:
        tick.act(
            ActionKind.QUALITY_BREACH,
            "QualityBreach",
            f"Revision {number} breaks quality floors ({'; '.join(breaches)}) and there is "
            "no earlier good revision to roll back to.",
            evidence,
        )
        return
    if tick.act(
        ActionKind.ROLLED_BACK,
        "RolledBack",
        f"Revision {number} breaks quality floors ({'; '.join(breaches)}): rolled back to "
        "the last good revision until the engine config or specfleet.dev/retry changes.",
        evidence,
    ):
        tick.verdict = RevisionVerdict.BAD


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
