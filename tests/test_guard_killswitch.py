"""Why speculation is off: the precedence of config, annotation, spec mode and guard, and what an
override does to the guard's kill switch."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from conftest import specmodel_doc
from specfleet.api import parse_specmodel
from specfleet.api.spec import GuardSpec
from specfleet.api.status import KillSwitchState, KillSwitchStatus, SpeculationSource
from specfleet.guard import killswitch

NOW = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)
EAGLE = {"method": "eagle3", "draftModel": "d"}
ENGAGED = KillSwitchStatus(state=KillSwitchState.ENGAGED, source=SpeculationSource.GUARD)
TRIAL = KillSwitchStatus(state=KillSwitchState.TRIAL, source=SpeculationSource.GUARD)


@pytest.mark.parametrize(
    ("state", "source", "held_by", "engaged", "trial"),
    [
        ("released", "guard", None, False, False),
        ("engaged", "guard", "guard", True, False),
        ("trial", "guard", "guard", True, True),  # the fleet is still without
        ("engaged", "annotation", "annotation", False, False),  # a human's, not the guard's
        ("engaged", "spec", "spec", False, False),
        ("released", "annotation", None, False, False),
        ("engaged", "", None, False, False),
    ],
)
def test_who_holds_speculation_off(
    state: str, source: str, held_by: str | None, engaged: bool, trial: bool
) -> None:
    """The one reading of the switch: whose it is while it holds speculation off, the guard's
    (engaged, in a trial too), and whether the guard is in a trial."""
    switch = KillSwitchStatus(state=state, source=source)
    assert (switch.held_by, switch.engaged, switch.trial) == (held_by, engaged, trial)


def specmodel(annotation: str | None = None, mode: str = "auto", **spec: Any) -> Any:
    doc = specmodel_doc(guard={"mode": mode}, **spec)
    doc["metadata"]["annotations"] = {"specfleet.dev/kill-switch": annotation} if annotation else {}
    return parse_specmodel(doc)


@pytest.mark.parametrize(
    ("annotation", "mode", "kill_switch", "expected"),
    [
        (None, "auto", None, (True, "guard")),
        (None, "auto", ENGAGED, (False, "guard")),
        (None, "auto", TRIAL, (False, "guard")),
        (None, "off", None, (False, "spec")),
        (None, "on", ENGAGED, (True, "spec")),
        ("engage", "on", None, (False, "annotation")),
        ("release", "off", ENGAGED, (True, "annotation")),
        ("auto", "off", None, (False, "spec")),
    ],
)
def test_annotation_then_spec_mode_then_guard(
    annotation: str | None, mode: str, kill_switch: KillSwitchStatus | None, expected: Any
) -> None:
    decided = killswitch.speculation(specmodel(annotation, mode, speculative=EAGLE), kill_switch)
    assert decided == expected


def test_no_speculative_config_is_off_whatever_overrides_say() -> None:
    assert killswitch.speculation(specmodel("release", "on"), None) == (False, "config")


def test_an_override_set_by_a_human_is_not_the_guards_to_clear() -> None:
    held = KillSwitchStatus(state=KillSwitchState.ENGAGED, source=SpeculationSource.ANNOTATION)
    assert killswitch.speculation(specmodel(speculative=EAGLE), held) == (True, "guard")


def test_only_annotation_and_spec_override_the_guard() -> None:
    assert [killswitch.override(s) for s in SpeculationSource] == ["annotation", "spec", None, None]


def test_a_canary_runs_only_in_the_guards_trial() -> None:
    assert killswitch.runs_canary(SpeculationSource.GUARD, TRIAL)
    assert not killswitch.runs_canary(SpeculationSource.GUARD, ENGAGED)
    assert not killswitch.runs_canary(SpeculationSource.SPEC, TRIAL)


def test_an_override_discards_the_guards_kill_switch() -> None:
    held = KillSwitchStatus(state=KillSwitchState.RELEASED, source=SpeculationSource.SPEC)
    assert killswitch.after_decision(SpeculationSource.SPEC, held, ENGAGED) is held
    assert killswitch.after_decision(SpeculationSource.ANNOTATION, None, ENGAGED).state == (
        KillSwitchState.RELEASED
    )
    assert killswitch.after_decision(SpeculationSource.GUARD, held, ENGAGED) is ENGAGED


def test_an_override_sets_the_switch_and_keeps_it_while_unchanged() -> None:
    set_ = killswitch.after_plan(SpeculationSource.ANNOTATION, False, ENGAGED, NOW)
    assert (set_.state, set_.source, set_.since) == ("engaged", "annotation", NOW.isoformat())
    assert set_.reason == "set by the annotation"
    later = NOW + timedelta(minutes=5)
    assert killswitch.after_plan(SpeculationSource.ANNOTATION, False, set_, later) is set_


def test_an_ended_override_hands_the_switch_back_to_the_guard_released() -> None:
    held = KillSwitchStatus(state=KillSwitchState.ENGAGED, source=SpeculationSource.SPEC)
    assert killswitch.after_plan(SpeculationSource.GUARD, True, held, NOW) == KillSwitchStatus()
    assert killswitch.after_plan(SpeculationSource.GUARD, False, ENGAGED, NOW) is ENGAGED
    assert killswitch.after_plan(SpeculationSource.CONFIG, False, None, NOW) == KillSwitchStatus()


@pytest.mark.parametrize(
    ("cooldown", "served", "judged"),
    [(300, 29, False), (300, 30, True), (30, 59, False), (30, 60, True)],
)
def test_a_canary_is_judged_after_an_interval_or_a_window_after_a_short_cooldown(
    cooldown: int, served: int, judged: bool
) -> None:
    guard = GuardSpec(interval_seconds=30, window_seconds=60, cooldown_seconds=cooldown)
    ready = (NOW - timedelta(seconds=served)).isoformat()
    assert killswitch.canary_judged(ready, guard, NOW) is judged
