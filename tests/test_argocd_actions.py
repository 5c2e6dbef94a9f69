"""The Argo CD resource actions (charts/specfleet/files/argocd-actions.yaml), run as Argo CD runs
them (Lua 5.1 in its sandbox, tests/argocd_lua.py): which are offered in which state, the patch
each sends (one annotation, nothing else), and the operator acting on that annotation."""

from __future__ import annotations

import re
from copy import deepcopy
from pathlib import Path
from typing import Any

import pytest
import yaml

from argocd_lua import ACTION, ACTIONS, FILES, act, apply_patch, discover, display_names
from specfleet.api import (
    KILL_SWITCH_ANNOTATION,
    RETRY_ANNOTATION,
    ROLLOUT_ANNOTATION,
    parse_specmodel,
)
from specfleet.guard.killswitch import ANNOTATION_SPECULATION
from specfleet.tick.rollouts import OVERRIDES
from test_guard import observe
from test_guard_loop import Loop
from test_guard_loop import specmodel as guarded
from test_tick_rollout import started, window

KILL = ("kill-switch-engage", "kill-switch-release", "kill-switch-auto")
ROLLOUT = ("promote", "abort", "clear-rollout-override")
EVERY = {*ROLLOUT, "retry", *KILL}
EAGLE = {"method": "eagle3", "draftModel": "d", "numSpeculativeTokens": 4}
FIXED = "2026-11-28T13:00:00Z"


def fixture(name: str, **annotations: str) -> dict[str, Any]:
    """A status shape from the health check's fixtures, on a SpecModel that speculates."""
    obj: dict[str, Any] = yaml.safe_load(
        (FILES / f"argocd-health/testdata/{name}.yaml").read_text()
    )
    obj["spec"]["speculative"] = EAGLE
    if annotations:
        obj["metadata"]["annotations"] = annotations
    return obj


def live(loop: Loop) -> dict[str, Any]:
    """The SpecModel as Argo CD reads it from the cluster: spec, annotations and status."""
    return {**loop.specmodel.to_wire(), "status": loop.status.to_wire()}


def run_action(loop: Loop, action: str) -> dict[str, str]:
    """Argo CD runs the action and patches the live object; the operator reconciles it."""
    obj = live(loop)
    patched = apply_patch(obj, act(obj, action))
    del patched["status"]
    loop.change(parse_specmodel(patched))
    return dict(loop.specmodel.metadata.annotations)


def enabled(obj: dict[str, Any]) -> set[str]:
    offered = discover(obj)
    assert set(offered) == EVERY
    return {name for name, disabled in offered.items() if not disabled}


STATES = [
    ("healthy", {}, {"kill-switch-engage", "kill-switch-release"}),
    ("canary_step", {}, {"promote", "abort", "kill-switch-engage", "kill-switch-release"}),
    (
        "canary_step",
        {ROLLOUT_ANNOTATION: "promote"},  # left from an earlier rollout: cannot act again
        {"abort", "clear-rollout-override", "kill-switch-engage", "kill-switch-release"},
    ),
    ("canary_step", {ROLLOUT_ANNOTATION: "none"}, {"promote", "abort", *KILL[:2]}),
    ("rolled_back", {}, {"retry", "kill-switch-engage", "kill-switch-release"}),
    (
        "canary_aborted",
        {ROLLOUT_ANNOTATION: "abort"},
        {"retry", "clear-rollout-override", *KILL[:2]},
    ),
    ("kill_switch_engaged", {}, {"kill-switch-engage", "kill-switch-release"}),
    (
        "kill_switch_annotation",
        {KILL_SWITCH_ANNOTATION: "engage"},
        {"kill-switch-release", "kill-switch-auto"},
    ),
    ("healthy", {KILL_SWITCH_ANNOTATION: "release"}, {"kill-switch-engage", "kill-switch-auto"}),
    ("healthy", {KILL_SWITCH_ANNOTATION: "auto"}, {"kill-switch-engage", "kill-switch-release"}),
    ("new", {}, {"kill-switch-engage", "kill-switch-release"}),
]


@pytest.mark.parametrize(
    ("name", "annotations", "expected"),
    STATES,
    ids=[f"{n}-{'-'.join(a.values()) or 'plain'}" for n, a, _ in STATES],
)
def test_discovery_offers_what_the_state_allows(
    name: str, annotations: dict[str, str], expected: set[str]
) -> None:
    assert enabled(fixture(name, **annotations)) == expected


def test_without_speculation_the_kill_switch_is_offered_only_back_to_auto() -> None:
    obj = fixture("healthy")
    del obj["spec"]["speculative"]
    assert enabled(obj) == set()
    obj["metadata"]["annotations"] = {KILL_SWITCH_ANNOTATION: "engage"}
    assert enabled(obj) == {"kill-switch-auto"}


def test_every_action_has_a_name_argo_cd_shows() -> None:
    names = display_names(fixture("healthy"))
    assert set(names) == EVERY and all(names.values())
    assert {d["name"] for d in ACTIONS["definitions"]} == EVERY


SETS = {
    "promote": (ROLLOUT_ANNOTATION, "promote"),
    "abort": (ROLLOUT_ANNOTATION, "abort"),
    "clear-rollout-override": (ROLLOUT_ANNOTATION, "none"),
    "kill-switch-engage": (KILL_SWITCH_ANNOTATION, "engage"),
    "kill-switch-release": (KILL_SWITCH_ANNOTATION, "release"),
    "kill-switch-auto": (KILL_SWITCH_ANNOTATION, "auto"),
    "retry": (RETRY_ANNOTATION, FIXED),
}


@pytest.mark.parametrize("action", sorted(EVERY))
@pytest.mark.parametrize("before", [None, {"kopf.zalando.org/last-handled-configuration": "{}"}])
def test_each_action_patches_one_annotation_and_nothing_else(
    action: str, before: dict[str, str] | None
) -> None:
    obj = fixture("canary_step")
    if before is not None:
        obj["metadata"]["annotations"] = dict(before)
    untouched = deepcopy(obj)
    key, value = SETS[action]
    assert act(obj, action, date=lambda _: FIXED) == {"metadata": {"annotations": {key: value}}}
    assert obj == untouched


def test_the_values_set_are_the_ones_the_operator_reads() -> None:
    assert {SETS[a][1] for a in ("promote", "abort")} == set(OVERRIDES)
    assert SETS["clear-rollout-override"][1] not in OVERRIDES
    assert {SETS[a][1] for a in KILL[:2]} == set(ANNOTATION_SPECULATION)
    assert SETS["kill-switch-auto"][1] not in ANNOTATION_SPECULATION


def test_a_retry_is_a_new_value_each_time_even_within_one_second() -> None:
    obj = fixture("rolled_back")
    tokens = []
    for _ in range(3):
        patch = act(obj, "retry", date=lambda _: FIXED)
        obj = apply_patch(obj, patch)
        tokens.append(obj["metadata"]["annotations"][RETRY_ANNOTATION])
    assert tokens == [FIXED, f"{FIXED}-2", f"{FIXED}-3"]
    # the operator acted on this second's first retry and the annotation was changed since
    obj["status"]["retryToken"] = FIXED
    obj["metadata"]["annotations"][RETRY_ANNOTATION] = f"{FIXED}-2"
    patch = act(obj, "retry", date=lambda _: FIXED)
    assert patch["metadata"]["annotations"][RETRY_ANNOTATION] == f"{FIXED}-3"


def test_a_retry_on_the_real_clock_is_the_utc_time_in_a_format_argo_cd_renders() -> None:
    patch = act(fixture("rolled_back"), "retry")
    token = patch["metadata"]["annotations"][RETRY_ANNOTATION]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", token)
    # Argo CD's os.date (util/lua/oslib_safe.go) knows these conversions and prints any other
    # as it is; the retry's format uses only these
    known = set("aAbBcdFHIImMpPSxXyYzZw")
    [fmt] = re.findall(r'os\.date\("([^"]*)"\)', ACTION["retry"])
    assert fmt.startswith("!") and set(re.findall(r"%(.)", fmt)) <= known


def test_no_script_reaches_for_what_argo_cd_does_not_load() -> None:
    scripts = [ACTIONS["discovery.lua"], *ACTION.values()]
    for script in scripts:
        assert not re.search(r"\b(string|math|io|debug)\.|:\w+\(", script), script
        assert "os." not in script.replace('local os = require("os")', "").replace("os.date", "")


def test_the_chart_documents_the_actions_beside_the_health_check() -> None:
    root = Path(__file__).resolve().parent.parent
    notes = (root / "charts/specfleet/templates/NOTES.txt").read_text()
    assert "resource.customizations.actions.specfleet.dev_SpecModel" in notes
    assert "files/argocd-actions.yaml" in notes
    readme = (root / "README.md").read_text()
    assert "charts/specfleet/files/argocd-actions.yaml" in readme
    assert "resource.customizations.actions.specfleet.dev_SpecModel" in readme


# The operator reading what the actions set: a rollout, a rollback, the kill switch.


def test_promote_from_argo_cd_promotes_the_running_rollout() -> None:
    loop = started()
    assert enabled(live(loop)) >= {"promote", "abort"}
    run_action(loop, "promote")
    assert loop.status.decisions[-1].action == "rollout_promoted"
    assert loop.last and loop.last.plan.active.number == 2
    assert not {"promote", "abort"} & enabled(live(loop))


def test_after_one_rollout_was_promoted_the_next_is_promoted_once_cleared() -> None:
    loop = started()
    run_action(loop, "promote")
    doc = loop.specmodel.to_wire()  # Git: the next revision; the live annotations stay
    doc["spec"]["speculative"]["numSpeculativeTokens"] = 2
    loop.change(parse_specmodel(doc))
    assert loop.specmodel.metadata.annotations[ROLLOUT_ANNOTATION] == "promote"
    assert loop.status.rollout and loop.status.rollout.phase == "Progressing"
    assert enabled(live(loop)) >= {"abort", "clear-rollout-override"}
    assert "promote" not in enabled(live(loop))
    run_action(loop, "clear-rollout-override")
    assert loop.status.rollout.phase == "Progressing" and loop.status.rollout_override == "none"
    run_action(loop, "promote")
    assert loop.status.decisions[-1].action == "rollout_promoted"
    assert loop.last and loop.last.plan.active.number == 3


def test_abort_from_argo_cd_aborts_and_retry_tries_the_revision_again() -> None:
    loop = started()
    run_action(loop, "abort")
    assert loop.status.decisions[-1].action == "rollout_aborted"
    assert loop.condition("RolledBack")[0] == "True"
    assert "retry" in enabled(live(loop))
    run_action(loop, "retry")
    assert loop.status.revisions[-1].verdict == "probation"
    assert loop.status.retry_token == loop.specmodel.metadata.annotations[RETRY_ANNOTATION]


def test_a_retry_after_a_rollback_by_the_guard() -> None:
    loop = started(warm=False)
    loop.tick(*[window({"p95_tpot_seconds": 0.05}, tpot=0.05)] * 2)
    assert loop.condition("RolledBack") == ("True", "CanaryAborted")
    assert enabled(live(loop)) == {"retry", "kill-switch-engage", "kill-switch-release"}
    run_action(loop, "retry")
    assert loop.status.revisions[-1].verdict == "probation"
    assert "retry" not in enabled(live(loop))


def test_the_kill_switch_from_argo_cd_engages_releases_and_hands_back_to_the_guard() -> None:
    loop = Loop(guarded())
    loop.tick(observe(0.8, 0.8))
    run_action(loop, "kill-switch-engage")
    assert loop.last and not loop.last.plan.speculation
    assert loop.condition("SpeculationActive") == ("False", "DisabledByAnnotation")
    assert enabled(live(loop)) == {"kill-switch-release", "kill-switch-auto"}
    run_action(loop, "kill-switch-release")
    assert loop.last.plan.speculation
    run_action(loop, "kill-switch-auto")
    loop.tick(observe(0.1, 0.1))  # the guard decides again: a collapse engages it
    assert loop.actions[-1] == "kill_switch_engaged"
    assert loop.condition("SpeculationActive") == ("False", "KillSwitchEngaged")
