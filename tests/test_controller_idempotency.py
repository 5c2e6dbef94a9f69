"""Decisions carry an idempotency key: their Events are named by it, so a decision is told
once however many replicas try, and a replica that starts acting tells the recent decisions the
last leader wrote to status but did not live to tell."""

from __future__ import annotations

from datetime import timedelta
from typing import cast

from conftest import specmodel_doc
from specfleet.api import parse_specmodel
from specfleet.api.status import Decision
from specfleet.controller import idempotency
from specfleet.controller.kube import Kube
from specfleet.controller.reconcile import tell_untold
from specfleet.render import ServingPlan
from test_controller_reconcile import NOW, SPEC, FakeKube, body, live, state, trial_due

UID = "3f1c-uid"


def decision(minutes_ago: float, reason: str, message: str = "") -> Decision:
    at = (NOW - timedelta(minutes=minutes_ago)).isoformat()
    return Decision(time=at, action="kill_switch_engaged", reason=reason, message=message)


def test_a_key_names_one_decision_of_one_object() -> None:
    key = idempotency.decision_key(UID, NOW.isoformat(), "alert", "ClassBreach", "code: ttft")
    assert key == idempotency.decision_key(
        UID, NOW.isoformat(), "alert", "ClassBreach", "code: ttft"
    )
    others = {
        idempotency.decision_key(
            "other-uid", NOW.isoformat(), "alert", "ClassBreach", "code: ttft"
        ),
        idempotency.decision_key(UID, NOW.isoformat(), "alert", "ClassBreach", "chat: ttft"),
        idempotency.decision_key(
            UID, "2026-11-21T12:00:05+00:00", "alert", "ClassBreach", "code: ttft"
        ),
    }
    assert key not in others and len(others) == 3
    assert len(idempotency.event_name("x" * 300, key)) <= 253


def test_the_decisions_the_last_leader_did_not_tell_are_told_once() -> None:
    specmodel = parse_specmodel(specmodel_doc(**SPEC))
    children = live(specmodel, ServingPlan(speculation=False))
    told, untold, old = decision(1, "Told"), decision(2, "Untold"), decision(11, "LongAgo")
    status = state(specmodel, "engaged", children).model_copy(
        update={"decisions": [old, untold, told]}
    )
    the_body = body(status)
    the_body["metadata"]["uid"] = UID
    kube = FakeKube()
    kube.named[idempotency.event_name("m", idempotency.key_of(UID, told))] = "Told"
    assert tell_untold(cast(Kube, kube), the_body, status, NOW) == 1
    assert kube.events == ["Untold"]  # the one told already and the one too old: not again
    assert tell_untold(cast(Kube, kube), the_body, status, NOW) == 0
    assert kube.events == ["Untold"]


def test_a_decision_s_event_is_named_by_its_key_and_a_repeated_attempt_posts_none() -> None:
    kube = FakeKube()
    assert [a.reason for a in trial_due(kube, UID).actions] == ["TrialStarted"]
    assert list(kube.named.values()) == ["TrialStarted"]  # named by its key
    assert kube.events.count("TrialStarted") == 1
    # The same step again (its status write lost with the leader that made it): the same key,
    # the API server's 409, no second Event.
    assert [a.reason for a in trial_due(kube, UID, first=True).actions] == ["TrialStarted"]
    assert kube.events.count("TrialStarted") == 1
