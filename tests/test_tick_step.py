"""The one tick (`tick.step`) that reconcile runs and `specfleet simulate` replays: the
guard's decision and the plan that follows it come from one planning of the revisions."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from conftest import specmodel_doc
from specfleet.api import SpecModel, SpecModelStatus, parse_specmodel
from specfleet.api.status import RevisionRecord
from specfleet.render import RenderSettings, revision_hash
from specfleet.tick.next_tick import DUE_SLACK_SECONDS, Arm, NextTick
from specfleet.tick.observed import Observed
from specfleet.tick.step import GuardTick, step

NOW = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)


def specmodel(k: int) -> SpecModel:
    speculative = {"method": "eagle3", "draftModel": "d", "numSpeculativeTokens": k}
    return parse_specmodel(specmodel_doc(speculative=speculative))


def record(model: SpecModel, number: int, verdict: str) -> RevisionRecord:
    digest = revision_hash(model.engine_config())
    return RevisionRecord(number=number, hash=digest, verdict=verdict, created=NOW.isoformat())


def test_a_revision_first_seen_on_a_guard_tick_is_kept_for_rollbacks() -> None:
    before, after = specmodel(4), specmodel(2)
    status = SpecModelStatus(revisions=[record(before, 1, "good")])
    configs = {r.hash: m.engine_config() for r, m in [(record(before, 1, "good"), before)]}
    the_step = step(after, status, Observed(), GuardTick(None), configs, NOW)
    revision = the_step.revision()
    assert the_step.plan.desired.number == 2 and revision is not None
    assert revision["metadata"]["name"] == f"m-{the_step.plan.desired.hash}"
    assert revision["data"] == after.engine_config().canonical()


def test_a_rollback_is_judged_and_served_with_the_last_good_revisions_config() -> None:
    good, bad = specmodel(4), specmodel(2)
    status = SpecModelStatus(revisions=[record(good, 1, "good"), record(bad, 2, "bad")])
    configs = {revision_hash(m.engine_config()): m.engine_config() for m in (good, bad)}
    the_step = step(bad, status, Observed(), GuardTick(None), configs, NOW)
    assert the_step.plan.active.number == 1 and the_step.plan.rolled_back
    assert the_step.situation is not None and the_step.situation.policy.k == 4
    engine = next(m for m in the_step.children(RenderSettings()) if m["kind"] == "Deployment")
    args = " ".join(engine["spec"]["template"]["spec"]["containers"][0]["args"])
    assert '"num_speculative_tokens":4' in args.replace(" ", "")


def test_an_unreadable_active_revision_is_named_and_degrades_status() -> None:
    good, bad = specmodel(4), specmodel(2)
    status = SpecModelStatus(revisions=[record(good, 1, "good"), record(bad, 2, "bad")])
    configs = {revision_hash(bad.engine_config()): bad.engine_config()}
    the_step = step(bad, status, Observed(), None, configs, NOW)
    with pytest.raises(ValueError, match=r"revision 1 .* unreadable"):
        the_step.children(RenderSettings())
    failed = the_step.failed("the engine config of revision 1 is unreadable")
    degraded = next(c for c in failed.conditions if c.type == "Degraded")
    assert (degraded.status, degraded.reason) == ("True", "ApplyFailed")
    assert the_step.actions == [] and the_step.decision is None


def test_the_step_says_when_the_next_guard_tick_is_due_and_what_it_reads() -> None:
    """`Step.next_tick`, what the operator's guard loop acts on: the fleet's pods as planned, due
    at once until the guard first evaluates, then an interval (less the slack) after."""
    model = specmodel(4)
    guard = model.spec.guard
    first = step(model, SpecModelStatus(), Observed(), None, {}, NOW)
    assert first.next_tick == NextTick(None, guard.window_seconds, Arm(1, True))
    assert first.next_tick.due(NOW)
    judged = step(model, first.status, Observed(), GuardTick(None), {}, NOW)
    due_at = NOW + timedelta(seconds=guard.interval_seconds - DUE_SLACK_SECONDS)
    assert judged.next_tick == NextTick(due_at, guard.window_seconds, Arm(1, True))
    assert not judged.next_tick.due(due_at - timedelta(microseconds=1))
    assert judged.next_tick.due(due_at)
    assert judged.failed("boom").guard == judged.status.guard  # a failed apply says the same
