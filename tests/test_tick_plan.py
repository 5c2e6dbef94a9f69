"""Revisions and the serving plan: pure functions of spec, status, annotations and the clock."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from conftest import specmodel_doc
from specfleet.api import SpecModelStatus, parse_specmodel
from specfleet.api.status import KillSwitchStatus, RevisionRecord
from specfleet.render import revision_hash
from specfleet.tick.plan import plan, rollback_target

NOW = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)
EAGLE = {"method": "eagle3", "draftModel": "d"}


def specmodel(annotations: dict[str, str] | None = None, **spec: Any) -> Any:
    doc = specmodel_doc(**spec)
    doc["metadata"]["annotations"] = annotations or {}
    return parse_specmodel(doc)


def test_first_reconcile_creates_revision_1_on_probation() -> None:
    result = plan(specmodel(speculative=EAGLE), SpecModelStatus(), NOW)
    assert result.new_revision
    assert (result.desired.number, result.desired.verdict) == (1, "probation")
    assert result.active == result.desired
    assert result.speculation and result.speculation_source == "guard"


def test_same_spec_is_the_same_revision() -> None:
    first = plan(specmodel(speculative=EAGLE), SpecModelStatus(), NOW)
    status = SpecModelStatus(revisions=first.revisions)
    again = plan(specmodel(speculative=EAGLE, pod={"replicas": 4}), status, NOW)
    assert not again.new_revision and again.desired.number == 1


def test_engine_change_makes_the_next_revision() -> None:
    status = SpecModelStatus(revisions=plan(specmodel(), SpecModelStatus(), NOW).revisions)
    changed = plan(specmodel(quantization={"kvCacheDtype": "fp8"}), status, NOW)
    assert changed.new_revision and changed.desired.number == 2
    assert [r.number for r in changed.revisions] == [1, 2]


def bad_desired_status(sm: Any, retry_token: str | None = None) -> SpecModelStatus:
    digest = revision_hash(sm.engine_config())
    return SpecModelStatus(
        revisions=[
            RevisionRecord(number=1, hash="aaaaaaaaaa", verdict="good"),
            RevisionRecord(number=2, hash=digest, verdict="bad"),
        ],
        retry_token=retry_token,
    )


def test_bad_desired_revision_serves_the_last_good_until_retry() -> None:
    sm = specmodel(speculative=EAGLE)
    held = plan(sm, bad_desired_status(sm), NOW)
    assert held.rolled_back and held.active.number == 1 and held.desired.number == 2


def test_a_bad_revision_rolls_back_to_the_newest_that_served_clean() -> None:
    sm = specmodel(speculative=EAGLE)
    digest = revision_hash(sm.engine_config())
    records = [
        RevisionRecord(number=1, hash="aaaaaaaaaa", verdict="probation", served_clean=True),
        RevisionRecord(number=2, hash="bbbbbbbbbb", verdict="probation", served_clean=True),
        RevisionRecord(number=3, hash=digest, verdict="bad"),
    ]
    held = plan(sm, SpecModelStatus(revisions=records), NOW)
    assert held.rolled_back and held.active.number == 2
    assert rollback_target(records, 2) == records[0]


def test_a_revision_with_no_good_evidence_is_never_a_rollback_target() -> None:
    sm = specmodel(speculative=EAGLE)
    digest = revision_hash(sm.engine_config())
    records = [
        RevisionRecord(number=1, hash="aaaaaaaaaa", verdict="good"),
        RevisionRecord(number=2, hash="bbbbbbbbbb", verdict="probation"),  # never judged good
        RevisionRecord(number=3, hash="cccccccccc", verdict="bad", served_clean=True),
        RevisionRecord(number=4, hash=digest, verdict="bad"),
    ]
    assert plan(sm, SpecModelStatus(revisions=records), NOW).active.number == 1
    assert rollback_target(records[1:], 4) is None
    held = plan(sm, SpecModelStatus(revisions=records[1:]), NOW)
    assert held.active.number == 4 and not held.rolled_back  # nothing to return to


def test_retry_annotation_change_puts_the_bad_revision_back_on_probation() -> None:
    sm = specmodel({"specfleet.dev/retry": "2"}, speculative=EAGLE)
    retried = plan(sm, bad_desired_status(sm, retry_token="1"), NOW)
    assert not retried.rolled_back
    assert retried.desired.verdict == "probation" and retried.retry_token == "2"


def test_unchanged_retry_annotation_keeps_the_hold() -> None:
    sm = specmodel({"specfleet.dev/retry": "1"}, speculative=EAGLE)
    assert plan(sm, bad_desired_status(sm, retry_token="1"), NOW).rolled_back


@pytest.mark.parametrize(
    ("annotation", "mode", "guard_state", "expected", "source"),
    [
        ("engage", "on", "released", False, "annotation"),
        ("release", "off", "engaged", True, "annotation"),
        ("auto", "off", "released", False, "spec"),
        (None, "on", "engaged", True, "spec"),
        (None, "auto", "engaged", False, "guard"),
        ("auto", "auto", "released", True, "guard"),
        ("release", "auto", "trial", True, "annotation"),
    ],
)
def test_speculation_precedence(
    annotation: str | None, mode: str, guard_state: str, expected: bool, source: str
) -> None:
    annotations = {"specfleet.dev/kill-switch": annotation} if annotation else {}
    sm = specmodel(annotations, speculative=EAGLE, guard={"mode": mode})
    status = SpecModelStatus(kill_switch=KillSwitchStatus(state=guard_state, source="guard"))
    result = plan(sm, status, NOW)
    assert (result.speculation, result.speculation_source) == (expected, source)
    assert not result.canary  # only the guard's own trial runs a canary


def test_a_trial_keeps_the_fleet_off_and_runs_a_canary() -> None:
    sm = specmodel(speculative=EAGLE)
    trial = SpecModelStatus(kill_switch=KillSwitchStatus(state="trial", source="guard"))
    result = plan(sm, trial, NOW)
    assert (result.speculation, result.canary, result.speculation_source) == (False, True, "guard")
    released = SpecModelStatus(kill_switch=KillSwitchStatus(state="released", source="guard"))
    assert plan(sm, released, NOW).canary is False


def test_an_ended_override_hands_the_switch_back_to_the_guard_released() -> None:
    sm = specmodel(speculative=EAGLE)
    left_over = SpecModelStatus(kill_switch=KillSwitchStatus(state="engaged", source="annotation"))
    assert plan(sm, left_over, NOW).speculation is True


def test_no_speculative_config_means_no_speculation() -> None:
    sm = specmodel({"specfleet.dev/kill-switch": "release"})
    assert plan(sm, SpecModelStatus(), NOW).speculation is False


@pytest.mark.parametrize(
    ("verdicts", "active", "kept"),
    [
        (["good", *["bad"] * 9], 1, [1, *range(3, 12)]),
        (["probation"] * 10, 1, [1, *range(3, 12)]),
        (["good", "probation", *["bad"] * 8], 2, [1, 2, *range(4, 12)]),
        (["clean", "kept", *["bad"] * 8], 2, [1, 2, *range(4, 12)]),
    ],
    ids=["the-last-good", "serving-on-probation", "serving-and-last-good", "rollback-target"],
)
def test_revision_history_is_bounded_but_keeps_what_may_serve_again(
    verdicts: list[str], active: int, kept: list[int]
) -> None:
    """The revision serving (a canary's control), the last good and the rollback targets."""
    records = [
        RevisionRecord(
            number=n,
            hash=f"h{n:09d}",
            verdict="probation" if v == "clean" else v,
            served_clean=v == "clean",
        )
        for n, v in enumerate(verdicts, start=1)
    ]
    status = SpecModelStatus(active_revision=active, revisions=records)
    result = plan(specmodel(), status, NOW)
    assert [r.number for r in result.revisions] == kept


def rollout_status(
    active: int, revisions: list[tuple[int, str]], spec: dict[str, Any], **extra: Any
) -> SpecModelStatus:
    """Revision 1 .. n-1 as given; the spec's own config is the last, on probation."""
    own = revision_hash(specmodel(**spec).engine_config())
    records = [
        RevisionRecord(number=n, hash=own if n == revisions[-1][0] else f"h{n}", verdict=v)
        for n, v in revisions
    ]
    return SpecModelStatus(active_revision=active, revisions=records, **extra)


CANARY = {"speculative": EAGLE, "pod": {"replicas": 4}}


def test_a_new_revision_rolls_out_beside_the_fleet_on_the_one_it_served() -> None:
    status = rollout_status(1, [(1, "probation"), (2, "probation")], CANARY)
    result = plan(specmodel(**CANARY), status, NOW)
    assert result.active.number == 1 and result.desired.number == 2
    assert result.rollout and result.rollout.control == 1 and result.rollout_pods == 1
    assert (result.rollout.step, result.rollout.steps) == (1, 2)
    assert not result.rolled_back


@pytest.mark.parametrize(
    ("spec", "revisions", "active"),
    [
        ({**CANARY, "rollout": {"strategy": "direct"}}, [(1, "good"), (2, "probation")], 1),
        ({"speculative": EAGLE, "pod": {"replicas": 1}}, [(1, "good"), (2, "probation")], 1),
        (CANARY, [(1, "bad"), (2, "probation")], 1),  # a bad revision is no control
        (CANARY, [(1, "good"), (2, "probation")], 2),  # the fleet already serves it
    ],
    ids=["direct", "one-replica", "bad-control", "already-served"],
)
def test_without_a_canary_the_whole_fleet_serves_the_new_revision(
    spec: dict[str, Any], revisions: list[tuple[int, str]], active: int
) -> None:
    result = plan(specmodel(**spec), rollout_status(active, revisions, spec), NOW)
    assert result.active.number == 2 and result.rollout is None and not result.rollout_pods


def test_a_rollout_waits_while_a_trial_runs() -> None:
    trial = KillSwitchStatus(state="trial", source="guard")
    status = rollout_status(1, [(1, "good"), (2, "probation")], CANARY, kill_switch=trial)
    result = plan(specmodel(**CANARY), status, NOW)
    assert result.rollout and result.rollout.phase == "Waiting" and result.rollout_pods == 0
    assert result.active.number == 1 and result.canary
    assert "waits for the kill-switch trial" in result.rollout.message


def test_after_an_abort_the_fleet_stays_on_the_control_and_a_retry_starts_again() -> None:
    status = rollout_status(1, [(1, "probation"), (2, "probation")], CANARY)
    started = plan(specmodel(**CANARY), status, NOW)
    assert started.rollout
    aborted = started.rollout.model_copy(update={"phase": "Aborted"})
    bad = [
        r.model_copy(update={"verdict": "bad"}) if r.number == 2 else r for r in status.revisions
    ]
    after = status.model_copy(update={"rollout": aborted, "revisions": bad})
    result = plan(specmodel(**CANARY), after, NOW)
    assert result.active.number == 1 and result.rolled_back and result.rollout_pods == 0
    retried = plan(specmodel({"specfleet.dev/retry": "1"}, **CANARY), after, NOW)
    assert retried.rollout and retried.rollout.phase == "Progressing" and retried.rollout_pods == 1


def test_steps_default_to_one_pod_then_half_and_follow_the_spec() -> None:
    spec = {**CANARY, "pod": {"replicas": 10}, "rollout": {"steps": [{"pods": 5}, {"pods": 2}]}}
    status = rollout_status(1, [(1, "good"), (2, "probation")], spec)
    result = plan(specmodel(**spec), status, NOW)
    assert result.rollout and (result.rollout.pods, result.rollout.steps) == (2, 2)
    assert result.rollout.windows == 3


def test_without_a_guard_a_new_revision_rolls_out_directly() -> None:
    status = rollout_status(1, [(1, "good"), (2, "probation")], CANARY)
    result = plan(specmodel(**CANARY), status, NOW, guard_on=False)
    assert result.active.number == 2 and result.rollout is None
