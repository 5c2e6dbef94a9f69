"""`make demo` in its short form, as CI runs it: the newcomer's path must keep working."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from e2e import demo_picture
from e2e.cluster.harness import LocalCluster
from e2e.demo_picture import GitChange
from e2e.demo_waits import LOAD_FACTOR, Budgets, StepTimeout, story_times, summary, wait
from specfleet.api.spec import GuardSpec

ROOT = Path(__file__).resolve().parent.parent


def test_demo_short(local_cluster: LocalCluster) -> None:
    env = {**os.environ, "KUBECONFIG": str(local_cluster.kubeconfig)}
    done = subprocess.run(
        [sys.executable, "-m", "e2e.demo", "--short"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Kill switch engaged" in done.stdout and "Aborted on its canary" in done.stdout
    assert "derived from the guard's settings" in done.stdout
    assert "waiting for revision_promoted on demo/llama31-8b: " in done.stdout  # outlasts 12 s
    timeline = ROOT / "out/demo/timeline.png"
    assert timeline.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and timeline.stat().st_size > 20_000
    alerts = json.loads((ROOT / "out/demo/alerts.json").read_text())
    names = {a["labels"]["alertname"] for a in alerts}
    assert {"SpecfleetKillSwitchEngaged", "SpecfleetRolledBack"} & names, names


GUARD = GuardSpec(
    interval_seconds=5,
    window_seconds=15,
    consecutive_breaches=2,
    cooldown_seconds=40,
    probation_seconds=30,
)


def test_the_story_happens_after_promotion_and_recovers_after_the_first_trial() -> None:
    times = story_times(GUARD)
    assert times.collapse == 15 + 5 + 30 + 15
    assert times.recover - times.collapse == 2 * (15 + 2 * 5) + 40


def test_tools_collapses_once_code_is_judged_back_and_recovers_before_its_trial() -> None:
    times = story_times(GUARD)
    engaged = times.collapse + 15 + 2 * 5
    first_trial_judged = engaged + 40 + 15 + 2 * 5
    released = first_trial_judged + 2 * 40 + 15 + 2 * 5
    assert times.tools_collapse >= released + (15 + 5) + (15 + 2 * 5)
    routed_off = times.tools_collapse + 15 + 2 * 5
    assert routed_off < times.tools_recover <= routed_off + 40  # its first class trial


def test_budgets_grow_with_the_guard_settings_and_the_measured_pod_start() -> None:
    brisk, slow = Budgets(GUARD, 10), Budgets(GUARD.model_copy(update={"window_seconds": 60}), 10)
    later = Budgets(GUARD, 60)
    for step in ("promotion", "not_paying", "abort", "class_back"):
        assert getattr(slow, step)() > getattr(brisk, step)() < getattr(later, step)(), step
    assert brisk.pool_start() < later.pool_start()
    assert brisk.not_paying() == LOAD_FACTOR * (15 + 2 * 5) + 2 * 10


def test_a_class_comes_back_after_the_cooldown_with_room_for_one_failed_trial() -> None:
    assert Budgets(GUARD, 10).class_back() == 40 + 80 + LOAD_FACTOR * 2 * (15 + 2 * 5) + 20


def test_release_waits_out_the_doubled_cooldown_of_each_trial_before_recovery() -> None:
    budgets = Budgets(GUARD, 10)
    trial = 10 + 15 + 2 * 5
    assert budgets.release(0) == 40 + LOAD_FACTOR * trial + 20
    # the first trial (canary Ready at 50s) fails; the second comes 80s after it is judged
    assert budgets.release(60) == 40 + 80 + LOAD_FACTOR * 2 * trial + 20
    capped = Budgets(GUARD.model_copy(update={"max_cooldown_seconds": 50}), 10)
    assert capped.release(60) == 40 + 50 + LOAD_FACTOR * 2 * trial + 20


def test_a_wait_says_what_it_waits_for_and_gives_up_with_the_status() -> None:
    said: list[str] = []
    status = {"phase": "Ready", "replicas": {"ready": 2, "desired": 2}, "acceptance": "0.81"}
    with pytest.raises(StepTimeout, match="no rolled_back within 2s; phase Ready; pods 2/2"):
        wait("rolled_back", 2.5, lambda: (None, status), said.append, every_s=1)
    assert said and all(
        "waiting for rolled_back" in line and "acceptance 0.81" in line for line in said
    )
    assert wait("x", 10, lambda: ("found", status), said.append) == "found"


def test_a_wait_names_the_classes_routed_off_alone_not_those_the_kill_switch_holds() -> None:
    def classes(*states: str) -> list[dict[str, str]]:
        names = ("code", "tools", "chat")
        return [{"name": n, "state": s} for n, s in zip(names, states, strict=True)]

    routed = {
        "classesSpeculating": "2/3",
        "classSpeculation": classes("speculating", "plain", "speculating"),
    }
    assert "classes speculating 2/3 (tools plain)" in summary(routed)
    held = {"classesSpeculating": "0/3", "classSpeculation": classes("plain", "plain", "plain")}
    assert "classes speculating" not in summary(held)


def test_the_picture_breaks_a_line_where_prometheus_had_no_samples() -> None:
    times, values = demo_picture._broken([(0, 1.0), (5, 1.0), (60, 0.1), (65, 0.1)])
    assert times[:2] == [0, 5] and times[3:] == [60, 65]
    assert math.isnan(values[2])


def test_the_picture_shades_each_kill_switch_trial_and_canary_until_it_ended() -> None:
    decisions = [
        {"action": "kill_switch_engaged", "t": 10},
        {"action": "trial_started", "t": 40},
        {"action": "trial_failed", "t": 55},
        {"action": "kill_switch_released", "t": 90},
        {"action": "rollout_aborted", "t": 130},
    ]
    changes = [GitChange(95, "routing on", False), GitChange(100, "new revision", True)]
    story = demo_picture.Story("s", decisions, {}, {}, changes=changes)
    assert [(a, b, color) for a, b, color, _, _ in demo_picture.spans(story, 200)] == [
        (10, 90, "tab:red"),
        (40, 55, "tab:orange"),
        (100, 130, "tab:blue"),
    ]
    unfinished = demo_picture.Story("s", decisions[:1], {}, {})
    assert [(a, b) for a, b, _, _, _ in demo_picture.spans(unfinished, 200)] == [(10, 200)]


def test_the_picture_shades_a_class_on_the_plain_pool_until_that_class_is_back() -> None:
    def switched(action: str, t: float, klass: str) -> dict[str, Any]:
        return {"action": action, "t": t, "evidence": {"class": klass}}

    decisions = [
        switched("class_speculation_off", 10, "tools"),
        switched("class_speculation_off", 20, "json"),
        switched("class_trial_started", 50, "tools"),
        switched("class_trial_failed", 60, "tools"),
        switched("class_trial_started", 140, "tools"),
        switched("class_speculation_on", 150, "json"),
        switched("class_speculation_on", 160, "tools"),
    ]
    story = demo_picture.Story("s", decisions, {}, {})
    assert [(a, b, name) for a, b, _, _, name in demo_picture.spans(story, 200)] == [
        (10, 160, "tools on plain pool"),
        (20, 150, "json on plain pool"),
        (50, 60, "tools class trial"),
        (140, 160, "tools class trial"),
    ]
