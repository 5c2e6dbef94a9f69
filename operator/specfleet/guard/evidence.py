"""Evidence that accumulates: a pending judgement (a canary step) sums the
counts the guard's windows show, from when it began to its deadline, and is judged on the sum at
every tick. A quiet class that shows five requests a window is judged on a hundred after twenty
windows, instead of never.

Telemetry sends no other query: each tick reads its window, and the judgement adds the part of
it not yet counted, pro rata (a window of 60 s read 15 s after the last adds a quarter of its
counts), so no request counts twice and the cadence stays the tick's. Counter resets inside a
window are Prometheus's `increase()`'s to handle. What no window covered while the guard had no
data at all (Prometheus down) is no evidence, and the judgement's deadline moves back by as much:
it bounds the serving a judgement may take to be decided, not the outages of its telemetry.
While the guard is blind it judges nothing, so no deadline ends a judgement then. A p95 does not
add up: the sum carries the last window's. The mean TPOT and TTFT are summed as their totals
and counts.
"""

from __future__ import annotations

from dataclasses import fields, replace
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any

from specfleet.api.status import (
    ClassSwitchState,
    Evidence,
    RevisionVerdict,
    RolloutPhase,
    SpecModelStatus,
)
from specfleet.telemetry.model import ClassWindow, Observation

LATEST = ("p95_ttft_seconds", "p95_tpot_seconds")
"""Read from the last window: quantiles do not add."""
MEANS = {
    "mean_tpot_seconds": ("tpot_samples", "tpot_seconds"),
    "mean_ttft_seconds": ("ttft_samples", "ttft_seconds"),
}
"""Each mean, its samples and the key of its stored total (mean × samples)."""
TOTALS = tuple(total for _, total in MEANS.values())
SUMMED = tuple(
    f.name
    for f in fields(ClassWindow)
    if f.name not in (*LATEST, *MEANS) and f.type in ("float | None", float | None)
)
"""The counts that add up across windows."""


@lru_cache(maxsize=4)
def stamp(now: datetime) -> str:
    """`now` as status fields record it: one tick's decisions share their clock, and isoformat
    would cost as much as a class's judgement."""
    return now.isoformat()


def begin(now: datetime, deadline_seconds: float, serving: str = "") -> Evidence:
    deadline = now + timedelta(seconds=deadline_seconds)
    return Evidence(since=now.isoformat(), deadline=deadline.isoformat(), serving=serving)


def overdue(evidence: Evidence, now: datetime) -> bool:
    return now >= datetime.fromisoformat(evidence.deadline)


def resumed(
    evidence: Evidence, now: datetime, silent_since: datetime, window_seconds: float
) -> Evidence:
    """The evidence, its deadline later by the time since it began or last counted in which the
    guard had no data at all (`silent_since`: when it last had any), less the window a tick
    reads back over: the judgement saw nothing of it, so it spends none of its deadline."""
    counted = datetime.fromisoformat(evidence.through or evidence.since)
    unseen = (now - max(counted, silent_since)).total_seconds() - window_seconds
    if unseen <= 0.0:
        return evidence
    deadline = datetime.fromisoformat(evidence.deadline) + timedelta(seconds=unseen)
    return evidence.model_copy(update={"deadline": deadline.isoformat()})


def past_deadline(status: SpecModelStatus, now: datetime, grace_seconds: float) -> list[str]:
    """The judgements still pending more than `grace_seconds` after their deadline: none, as
    the guard promises (the replay records this at every tick, and the tests hold it to it).
    While the guard has no data its silence so far spends no deadline (`resumed`)."""
    late = now - timedelta(seconds=grace_seconds)
    last_data = status.guard.last_data if status.guard else None
    silent_since = datetime.fromisoformat(last_data) if last_data else now
    return [
        name
        for name, found in _pending(status)
        if overdue(resumed(found, now, silent_since, 0.0), late)
    ]


def _pending(status: SpecModelStatus) -> list[tuple[str, Evidence]]:
    found: list[tuple[str, Evidence | None]] = []
    rollout, switch, guard = status.rollout, status.kill_switch, status.guard
    if rollout is not None and rollout.phase == RolloutPhase.PROGRESSING:
        found.append(("canary step", rollout.evidence))
    if switch is not None and switch.trial:
        found.append(("trial", switch.evidence))
    active = next((r for r in status.revisions if r.number == status.active_revision), None)
    if guard is not None and active is not None and active.verdict == RevisionVerdict.PROBATION:
        found.append(("probation", guard.probation_evidence))
    if guard is not None:
        trials = [s for s in guard.class_switches if s.state == ClassSwitchState.TRIAL]
        found += [(f"class trial of {s.name}", s.evidence) for s in trials]
    return [(name, evidence) for name, evidence in found if evidence is not None]


def added(
    evidence: Evidence,
    window: Observation | None,
    now: datetime,
    control: Observation | None = None,
) -> Evidence | None:
    """The evidence with the part of this window (read at `now`) not yet counted added, and the
    control's over the same window; None when nothing of it is new (or there is no window)."""
    if window is None:
        return None
    fresh = _fresh(evidence, window.window_seconds, now)
    if fresh <= 0.0:
        return None
    update: dict[str, object] = {
        "through": stamp(now),
        "seconds": evidence.seconds + fresh * window.window_seconds,
        "judged": _summed(evidence.judged, window, fresh),
    }
    if control is not None:
        update["control"] = _summed(evidence.control, control, fresh)
    return evidence.model_copy(update=update)


def _fresh(evidence: Evidence, seconds: float, now: datetime) -> float:
    """The share of the window after what was counted: all of it at first (a judgement's first
    window may reach back before it began: its side's series are its own, a canary's new, a
    fleet's earlier pods labelled with another revision or speculation)."""
    if not seconds:
        return 0.0
    if evidence.through is None:
        return 1.0
    new = (now - datetime.fromisoformat(evidence.through)).total_seconds()
    return min(new / seconds, 1.0)


def observation(
    evidence: Evidence, template: Observation, control: bool = False, latency: bool = True
) -> Observation:
    """The summed counts as one long window (the template's revision and speculation, over the
    seconds counted). `latency`: with the last window's p95s (a canary beside its control on
    the same window); without, latency is left to the windows."""
    counts = evidence.control if control else evidence.judged
    return replace(
        template,
        window_seconds=evidence.seconds,
        classes={name: _window(found, latency) for name, found in counts.items()},
        canary=None,
    )


def _summed(
    counts: dict[str, dict[str, float]], window: Observation, share: float
) -> dict[str, dict[str, float]]:
    total = {name: dict(found) for name, found in counts.items()}
    for name, klass in window.classes.items():
        into = total.setdefault(name, {})
        for attr in SUMMED:
            value = getattr(klass, attr)
            if value is not None:
                into[attr] = into.get(attr, 0.0) + value * share
        for mean, (samples, key) in MEANS.items():
            value, count = getattr(klass, mean), getattr(klass, samples)
            if value is not None and count:
                into[key] = into.get(key, 0.0) + value * count * share
        for attr in LATEST:
            value = getattr(klass, attr)
            if value is not None:
                into[attr] = value
    return total


def _window(counts: dict[str, float], latency: bool) -> ClassWindow:
    known: dict[str, Any] = dict(counts)
    for attr in TOTALS if latency else (*TOTALS, *LATEST):
        known.pop(attr, None)
    for mean, (samples, key) in MEANS.items():
        count = counts.get(samples)
        if key in counts and count:
            known[mean] = counts[key] / count
    return ClassWindow(**known)
