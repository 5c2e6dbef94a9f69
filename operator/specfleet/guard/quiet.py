"""A quiet fleet: classes a window holds too few requests of to judge are judged on the fleet's
evidence since its judgement began (`guard.evidence`), so a collapse at a few requests a minute is
found, late but found. The judgement begins anew when what serves changes (revision,
speculation), once its evidence shows every class judged good and speculation paying at the
stated error rate (so an old healthy past never drowns a new collapse), and after
QUIET_HORIZON_SECONDS undecided. A fleet whose windows judge every class keeps no such
evidence: it costs nothing."""

from __future__ import annotations

from collections.abc import Callable

from specfleet.api.status import Evidence
from specfleet.guard import evidence as accumulated
from specfleet.guard.policy import QUIET_HORIZON_SECONDS
from specfleet.guard.situation import QuietJudgement, Tick
from specfleet.guard.verdict import Evaluation
from specfleet.telemetry.model import Observation


def judged(
    tick: Tick, window: Evaluation, evaluate: Callable[[Observation], Evaluation]
) -> Evaluation:
    """The window's evaluation, each class it could not judge (and, when it judged speculation
    on none, speculation itself) judged on the fleet's evidence instead."""
    observation = tick.situation.observation
    if observation is None or all(v.conclusive for v in window.classes):
        if tick.guard.fleet_evidence is not None:
            tick.guard.fleet_evidence = None
        return window
    evidence = _grown(tick, observation)
    if evidence is None:
        return window
    summed_window = accumulated.observation(evidence, observation, latency=False)
    summed = evaluate(summed_window)
    shown = summed.speculation_bad is False and summed.decisive
    if shown and all(v.verdict == "good" for v in summed.classes):
        tick.guard.fleet_evidence = None  # settled: the next judgement starts afresh
    pairs = zip(window.classes, summed.classes, strict=True)
    on_evidence = {s.name: s for w, s in pairs if not w.conclusive}
    tick.quiet = QuietJudgement(summed_window, on_evidence)
    classes = [on_evidence.get(w.name, w) for w in window.classes]
    if window.speculation_bad is None:
        return summed._replace(classes=classes)
    return window._replace(classes=classes)


def _grown(tick: Tick, observation: Observation) -> Evidence | None:
    """The fleet's evidence with this window added; a new judgement when what serves changed or
    the horizon passed."""
    serving = f"revision {observation.revision}, speculation {observation.speculation}"
    now, evidence = tick.situation.now, tick.guard.fleet_evidence
    if evidence is None or evidence.serving != serving or accumulated.overdue(evidence, now):
        evidence = accumulated.begin(now, QUIET_HORIZON_SECONDS, serving)
    grown = accumulated.added(evidence, observation, now)
    tick.guard.fleet_evidence = grown or evidence
    return grown
