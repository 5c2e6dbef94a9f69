"""`specfleet simulate` end to end: the real guard in a closed loop on the example scenarios."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from specfleet.guard.actions import PER_CLASS
from specfleet.scenario import load_scenario, parse_scenario
from specfleet.simulate import baselines, report
from specfleet.simulate.inputs import build_world, load_specmodel_document, load_world
from specfleet.simulate.simulation import Result, SimulationSettings, simulate
from specfleet.simulate.world import WHOLE

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "examples/scenarios"
LLAMA = ROOT / "examples/llama-3.1-8b-eagle3-fp8.yaml"
DETECTION_BOUND = 90.0


def run(scenario: str, specmodel: Path = LLAMA, **settings: Any) -> Result:
    world = load_world(specmodel, SCENARIOS / f"{scenario}.yaml")
    return simulate(world, SimulationSettings(**settings))


def actions(result: Result) -> list[tuple[float, str]]:
    """The fleet-wide actions; `named` has the per-class decisions."""
    return [(d["t"], d["action"]) for d in result.run.decisions if d["action"] not in PER_CLASS]


def named(result: Result) -> list[tuple[float, str, str, str]]:
    return [
        (d["t"], d["action"], d["evidence"]["class"], d["evidence"]["signal"])
        for d in result.run.decisions
        if d["action"] in PER_CLASS
    ]


@pytest.fixture(scope="module")
def collapse() -> Result:
    return run("acceptance-collapse")


def test_collapse_engages_the_kill_switch_within_the_detection_bound(collapse: Result) -> None:
    engaged = [t for t, a in actions(collapse) if a == "kill_switch_engaged"]
    assert engaged and 600 < engaged[0] <= 600 + DETECTION_BOUND
    [episode] = collapse.episodes
    assert (episode.start, episode.end) == (600.0, 1500.0)
    assert episode.latency is not None and episode.latency <= DETECTION_BOUND
    assert collapse.false_actions == [] and collapse.missed == []


def test_collapse_releases_after_recovery_and_speculation_runs_again(collapse: Result) -> None:
    timeline = actions(collapse)
    released = [t for t, a in timeline if a == "kill_switch_released"]
    assert len(released) == 1 and released[0] > 1500
    trial = max(t for t, a in timeline if a == "trial_started" and t < released[0])
    base, canary = collapse.base, collapse.run.canary
    served = next(i for i in range(base.index(trial), len(canary)) if canary[i] is not None)
    assert base.time(served) >= 1500  # the canary that passed served after the recovery only
    assert all(a != "trial_failed" or t < 1500 for t, a in timeline)
    assert collapse.run.serving[-1].speculation
    off = [s.speculation for s in collapse.run.serving[750 // 15 : 1000 // 15]]
    assert not any(off)  # the fleet really stopped drafting once the switch rolled out


def test_collapse_trials_run_on_a_canary_and_never_roll_the_fleet(collapse: Result) -> None:
    timeline, run, base = actions(collapse), collapse.run, collapse.base
    engaged = next(t for t, a in timeline if a == "kill_switch_engaged")
    released = next(t for t, a in timeline if a == "kill_switch_released")
    assert not any(
        s.speculation for s in run.serving[base.index(engaged + 60) : base.index(released)]
    )
    for started in [t for t, a in timeline if a == "trial_started"]:
        # one pod starts, rollout_seconds / replicas = 30 s, then it takes traffic
        first = base.index(started)
        assert run.canary[first : first + 2] == [None, None]
        assert run.canary[base.index(started + 30)] is not None
    for ended in [t for t, a in timeline if a in ("trial_failed", "kill_switch_released")]:
        assert run.canary[base.index(ended)] is None  # removed at once
    served = [
        (fleet, canary) for fleet, canary in zip(run.slices, run.canary, strict=True) if canary
    ]
    on_canary = sum(s.requests for _, canary in served for s in canary.values())
    on_fleet = sum(s.requests for fleet, _ in served for s in fleet.values())
    assert on_canary / (on_canary + on_fleet) == pytest.approx(1 / 3, abs=0.01)
    assert all(s.draft_tokens == 0 for fleet, _ in served for s in fleet.values())


def test_collapse_goodput_beats_both_fixed_policies(collapse: Result) -> None:
    rates = {name: g.rate for name, g in collapse.goodput.items()}
    assert rates["guarded"] > max(rates["always_on"], rates["always_off"])
    assert rates["oracle"] >= rates["guarded"]


def test_bad_quantization_rolls_back_and_the_revision_effects_stop() -> None:
    result = run("bad-quantization", SCENARIOS / "bad-quantization.specmodel.yaml")
    timeline = actions(result)
    assert [a for _, a in timeline] == ["revision_promoted", "rolled_back"]
    promoted, rolled_back = (t for t, _ in timeline)
    rollout, settle, breaches = 60, 60, 3 * 15  # the operator judges a full window after Ready
    assert promoted < 300 < rolled_back <= 300 + rollout + settle + breaches
    numbers = [result.world.revisions[s.config].number for s in result.run.serving]
    assert numbers[-1] == 1 and 2 in numbers
    validity = {tick.t: tick.observed_validity["tools"] for tick in result.run.ticks}
    on_bad = [v for t, v in validity.items() if 360 < t <= rolled_back and v is not None]
    after = [v for t, v in validity.items() if t > rolled_back + 120 and v is not None]
    assert on_bad and max(on_bad) < 0.92
    assert after and min(after) > 0.95
    assert result.goodput["guarded"].slo_violation_seconds < 200
    assert result.goodput["always_on"].slo_violation_seconds > 1000


def test_slow_and_broken_revisions_are_aborted_on_their_canaries_the_third_promoted() -> None:
    result = run("canary-rollouts", SCENARIOS / "canary-rollouts.specmodel.yaml")
    timeline = [(t, a) for t, a in actions(result) if a != "revision_promoted"]
    assert [a for _, a in timeline] == [
        *("rollout_aborted", "rollout_aborted", "rollout_step_passed", "rollout_promoted")
    ]
    slow, broken = (t for t, a in timeline if a == "rollout_aborted")
    assert 300 < slow <= 300 + 60 and 900 < broken <= 900 + 60
    bad = report.summary(result)["badRevisions"]
    assert [b["revision"] for b in bad] == [2, 3]
    assert all(b["shareOfRequestsAfterChange"] < 0.05 for b in bad)
    numbers = {result.world.revisions[s.config].number for s in result.run.serving}
    assert numbers == {1, 4}  # the fleet never served a bad revision
    on_canaries = {result.world.revisions[r[0].config].number for r in result.run.rollout if r}
    assert on_canaries == {2, 3, 4}
    assert all(t.kill_switch == "released" for t in result.run.ticks)
    assert result.false_actions == [] and result.missed == []


def test_a_minor_class_collapse_is_named_and_the_fleet_keeps_speculating() -> None:
    result = run("minor-class-collapse", SCENARIOS / "minor-class-collapse.specmodel.yaml")
    [(breached, *breach), (back, *recovery)] = named(result)
    # named on what breached first: its speedup (three windows), or its acceptance floor
    assert breach[:2] == ["class_breach", "translation"]
    assert breach[2] in ("speedup", "acceptanceRate")
    assert recovery[:2] == ["class_recovered", "translation"]
    assert 600 < breached <= 600 + DETECTION_BOUND and 1500 < back <= 1500 + DETECTION_BOUND
    assert result.acting == [] and all(s.speculation for s in result.run.serving)


def test_a_slow_revision_rolls_back_and_never_engages_the_kill_switch() -> None:
    result = run("slow-revision", SCENARIOS / "slow-revision.specmodel.yaml")
    timeline = actions(result)
    assert [a for _, a in timeline] == ["revision_promoted", "rolled_back"]
    promoted, rolled_back = (t for t, _ in timeline)
    rollout, settle, breaches = 60, 60, 3 * 15
    assert promoted < 300 < rolled_back <= 300 + rollout + settle + breaches
    [rollback] = [d for d in result.run.decisions if d["action"] == "rolled_back"]
    assert "code: p95TpotSeconds" in rollback["message"] and rollback["rollbackTarget"] == 1
    numbers = [result.world.revisions[s.config].number for s in result.run.serving]
    assert numbers[-1] == 1 and 2 in numbers
    assert all(s.speculation for s in result.run.serving)
    assert result.false_actions == [] and result.missed == []


def test_a_revision_broken_during_probation_rolls_back_to_the_one_before() -> None:
    result = run("broken-during-probation", SCENARIOS / "broken-during-probation.specmodel.yaml")
    timeline = actions(result)
    assert [a for _, a in timeline] == ["rolled_back", "revision_promoted"]
    [rollback] = [d for d in result.run.decisions if d["action"] == "rolled_back"]
    assert (rollback["revision"], rollback["rollbackTarget"]) == (3, 2)
    assert 540 < rollback["t"] <= 540 + 60 + 60 + 3 * 15
    numbers = [result.world.revisions[s.config].number for s in result.run.serving]
    assert numbers[-1] == 2 and 3 in numbers
    validity = {tick.t: tick.observed_validity["tools"] for tick in result.run.ticks}
    after = [v for t, v in validity.items() if t > rollback["t"] + 120 and v is not None]
    assert after and min(after) > 0.95
    assert result.false_actions == [] and result.missed == []


def canary_step_blind(effects: dict[str, Any]) -> Result:
    """canary-rollouts's fleet and one revision at t=300 (its step's pods ready at 315), with a
    step deadline of 240 s; Prometheus is down for five minutes from t=330, so the deadline
    (555) falls inside the outage."""
    document = yaml.safe_load((SCENARIOS / "canary-rollouts.yaml").read_text())
    revision = {"t": 300, "spec": {"model": {"maxModelLen": 16384}}, "effects": effects}
    document.update(duration_s=1200, rollouts=[revision], prometheus_down=[[330, 630]])
    specmodel = load_specmodel_document(SCENARIOS / "canary-rollouts.specmodel.yaml")
    specmodel["spec"]["rollout"] = {"stepDeadlineSeconds": 240}
    return simulate(build_world(specmodel, parse_scenario(document)))


def reasons(result: Result) -> list[tuple[float, str]]:
    """The fleet-wide decisions by reason, probation's promotions left out."""
    left_out = (*PER_CLASS, "revision_promoted")
    return [(d["t"], d["reason"]) for d in result.run.decisions if d["action"] not in left_out]


@pytest.mark.parametrize(
    ("effects", "decided"),
    [
        ({}, ["RolloutStepPassed", "RolloutPromoted"]),
        ({"tool_call_validity": 0.8}, ["RolloutAborted"]),
    ],
)
def test_prometheus_down_five_minutes_through_a_canary_step_then_the_step_is_judged(
    effects: dict[str, Any], decided: list[str]
) -> None:
    """Blind from blindAfterSeconds after the last data, no action while blind, restored at the
    first tick with data. The step's deadline passed while blind: it moved back by the time no
    window covered, so the step is judged on its evidence (a good revision is not aborted at a
    deadline it could not use, a bad one is aborted on its tool calls, not the deadline)."""
    result = canary_step_blind(effects)
    timeline = reasons(result)
    assert [r for _, r in timeline] == ["MetricsBlind", "MetricsRestored", *decided]
    (blind, _), (restored, _), (judged, _) = timeline[:3]
    assert 330 < blind <= 315 + 120 and 630 < restored <= 630 + 15
    assert judged - restored <= (60 if effects else 180)
    assert result.false_actions == [] and result.missed == []
    assert [(t.t, t.past_deadline) for t in result.run.ticks if t.past_deadline] == []


def test_prometheus_down_five_minutes_through_trials_then_each_trial_is_judged() -> None:
    """The collapse's first trial (735) is blind from 750 to 1050: at the first tick back it
    fails on its canary's evidence. The trial that starts at 1485, as acceptance recovers, is
    blind from 1530 to 1830: back, it goes on from the evidence it had and releases."""
    document = yaml.safe_load((SCENARIOS / "acceptance-collapse.yaml").read_text())
    document["prometheus_down"] = [[750, 1050], [1530, 1830]]
    result = simulate(build_world(load_specmodel_document(LLAMA), parse_scenario(document)))
    timeline = [(t, r) for t, r in reasons(result) if t > 750]
    assert [r for _, r in timeline[:3]] == ["MetricsBlind", "MetricsRestored", "TrialFailed"]
    assert timeline[1][0] == timeline[2][0] <= 1050 + 15
    *_, blind, restored, released = timeline
    assert [r for _, r in (blind, restored, released)] == [
        *("MetricsBlind", "MetricsRestored", "SpeculationPays")
    ]
    assert blind[0] > 1530 and 1830 < restored[0] <= 1830 + 15 and released[0] - restored[0] < 120
    assert result.false_actions == [] and result.missed == []
    assert [(t.t, t.past_deadline) for t in result.run.ticks if t.past_deadline] == []


def truncating(specmodel: str) -> Result:
    """bad-quantization's traffic; at t=300 a revision that cuts off 30% of chat's answers at
    max_tokens (1% before), everything else as good."""
    document = yaml.safe_load((SCENARIOS / "bad-quantization.yaml").read_text())
    document["duration_s"] = 900
    document["classes"]["chat"]["truncation_rate"] = 0.01
    document["rollouts"][0]["effects"] = {"truncation_rate": {"chat": 0.3}}
    world = build_world(load_specmodel_document(SCENARIOS / specmodel), parse_scenario(document))
    return simulate(world)


def test_a_revision_truncating_a_class_is_aborted_on_its_canary() -> None:
    result = truncating("canary-rollouts.specmodel.yaml")
    [aborted] = [d for d in result.run.decisions if d["action"] == "rollout_aborted"]
    pod_start, breaches = 15, 3 * 15  # its canary pod serves a fourth of chat: not decisive
    assert 300 < aborted["t"] <= 300 + pod_start + 60 + breaches
    signals = {(b["class"], b["signal"]) for b in aborted["evidence"]["breaches"]}
    assert signals == {("chat", "truncationRate")}
    assert "chat: truncationRate" in aborted["message"]
    numbers = {result.world.revisions[s.config].number for s in result.run.serving}
    assert numbers == {1}
    assert result.false_actions == [] and result.missed == []


def test_a_revision_truncating_a_class_rolls_back_in_probation() -> None:
    result = truncating("bad-quantization.specmodel.yaml")
    assert [a for _, a in actions(result)] == ["revision_promoted", "rolled_back"]
    [rollback] = [d for d in result.run.decisions if d["action"] == "rolled_back"]
    assert rollback["t"] <= 300 + 60 + 60 + 3 * 15
    assert [b.split(" ")[:2] for b in rollback["evidence"]["breaches"]] == [
        ["chat:", "truncationRate"]
    ]
    assert result.run.serving[-1] == result.run.serving[0]
    assert result.false_actions == [] and result.missed == []


def test_noisy_healthy_two_hours_takes_no_action() -> None:
    document = yaml.safe_load((SCENARIOS / "noisy-healthy-24h.yaml").read_text())
    document["duration_s"] = 2 * 3600
    specmodel = load_specmodel_document(SCENARIOS / "noisy-healthy-24h.specmodel.yaml")
    result = simulate(build_world(specmodel, parse_scenario(document)))
    assert result.acting == [] and result.episodes == []
    assert [a for _, a in actions(result)] == ["revision_promoted"]


def test_a_collapse_at_low_traffic_is_found_on_the_fleets_evidence() -> None:
    """At 0.15 req/s per class no window holds enough requests to judge (the episode is not
    "detectable" a window at a time); the fleet's evidence adds them up and the kill switch
    engages within minutes of the collapse, on the critical class's floor, and nothing else
    acts falsely."""
    result = run("low-traffic")
    engaged = result.acting[0]
    assert engaged["action"] == "kill_switch_engaged" and 600 < engaged["t"] < 600 + 300
    assert "code: acceptance" in engaged["message"]
    [episode] = result.episodes
    assert not episode.detectable and episode.detected_at == engaged["t"]
    assert result.false_actions == [] and result.missed == []


def test_the_summary_names_the_rule_with_the_true_speedup_beside_it(collapse: Result) -> None:
    """A critical class under its floor is not "speculation not paying" when it pays."""
    [floor] = run("low-traffic").episodes
    assert floor.rule == "criticalFloor" and floor.true_speedup and floor.true_speedup[0] > 1.3
    text = report.text(run("low-traffic"))
    assert "critical class under its acceptance floor (code acceptance" in text
    assert "while speculation pays (true speedup 1." in text and "not paying" not in text
    [both] = collapse.episodes
    assert both.rule == "notPayingAndCriticalFloor"
    [engaged] = [a for a in report.summary(collapse)["actions"] if "basis" in a][:1]
    assert engaged["action"] == "kill_switch_engaged"
    basis = engaged["basis"]
    assert basis["rule"] == "criticalFloor" and basis["guardSpeedup"] >= basis["minSpeedup"]
    assert basis["trueSpeedup"] < 1 and basis["breaches"][0].startswith("code: acceptance")


def test_same_seed_same_decisions_other_seed_other_draws() -> None:
    first = run("bad-quantization", SCENARIOS / "bad-quantization.specmodel.yaml")
    again = run("bad-quantization", SCENARIOS / "bad-quantization.specmodel.yaml")
    assert first.run.decisions == again.run.decisions
    assert first.goodput == again.goodput
    other = run("bad-quantization", SCENARIOS / "bad-quantization.specmodel.yaml", seed=99)
    assert other.run.ticks[5].observed_rates != first.run.ticks[5].observed_rates


def test_the_scenario_seed_is_the_default(collapse: Result) -> None:
    assert collapse.seed == load_scenario(SCENARIOS / "acceptance-collapse.yaml").seed == 7


def test_committed_example_outputs_are_current(collapse: Result) -> None:
    """examples/scenarios/<name>/ is regenerated by bench/simulate_goodput.py --write-examples."""
    committed = json.loads((SCENARIOS / "acceptance-collapse/decisions.json").read_text())
    assert committed == report.decisions(collapse)
    summary = json.loads((SCENARIOS / "acceptance-collapse/summary.json").read_text())
    assert summary == json.loads(json.dumps(report.summary(collapse)))


def test_the_canary_rollouts_picture_names_each_revision_and_why() -> None:
    """What timeline.png draws: rollout canaries in the canary lane with their revisions,
    aborts labelled with the signal that decided them, labels that never overlap."""
    from specfleet.simulate import plot

    result = run("canary-rollouts", SCENARIOS / "canary-rollouts.specmodel.yaml")
    lanes = {plot._canary_lane(result, i) for i in range(len(result.run.serving))}
    assert {("rollout", 2), ("rollout", 3), ("rollout", 4)} <= lanes
    texts = [plot.describe(d) for d in result.run.decisions]
    assert "rev 2 canary aborted: p95 TTFT, p95 TPOT (chat)" in texts
    assert "rev 3 canary aborted: tool-call validity (tools)" in texts
    assert "rev 4 canary promoted" in texts
    labels = plot._labels(result, 60.0)
    xlim = (-0.4, 40.4)
    rows = plot.label_rows(labels, xlim)
    for i, a in enumerate(labels):
        for j, b in enumerate(labels[:i]):
            if rows[i] == rows[j]:
                (a0, a1), (b0, b1) = plot._extent(a, xlim), plot._extent(b, xlim)
                assert a0 > b1 or b0 > a1, (a.text, b.text)
    view = plot.Points(result.run.ticks, result.truths, 60.0)
    canary_tpot = [v for v in view.seen("canary", "p95_tpot", "code") if v == v]
    assert max(canary_tpot) > 0.05  # the slow revision's canary is drawn, over the 50 ms SLO


def test_the_oracle_keeps_speculation_from_a_critical_class_under_its_acceptance_floor() -> None:
    """low-traffic: code (critical, floor 0.5) collapses to α 0.2 from 600 s to 1500 s while
    chat pays for speculation: always-on has the most goodput, but the SpecModel says no
    speculation serves code under its floor, so the oracle turns it off, as the guard must."""
    world = load_world(LLAMA, SCENARIOS / "low-traffic.yaml")
    oracle = baselines.oracle(world)
    before, during, after = (oracle(t, WHOLE) for t in (300.0, 900.0, 1800.0))
    assert before.speculation and after.speculation and not during.speculation
    code = {c.name: c for c in world.conditions(900.0, replace(during, speculation=True)).classes}
    assert code["code"].acceptance_floor == 0.5
    assert code["chat"].acceptance_floor is None  # not critical: no floor to keep


def quiet(scenario: str, rps: float, hours: float, specmodel: Path = LLAMA) -> Result:
    """An example scenario at `rps` for `hours`, its changes where they were."""
    document = yaml.safe_load((SCENARIOS / f"{scenario}.yaml").read_text())
    document |= {"traffic_rps": [[0, rps]], "duration_s": hours * 3600}
    world = build_world(load_specmodel_document(specmodel), parse_scenario(document))
    return simulate(world, SimulationSettings())


@pytest.mark.parametrize(
    ("result", "deadline"),
    [
        (
            lambda: quiet("canary-rollouts", 0.15, 2, SCENARIOS / "canary-rollouts.specmodel.yaml"),
            "StepDeadline",
        ),
        (lambda: quiet("low-traffic", 0.1, 3), "TrialDeadline"),
        (
            lambda: quiet(
                "broken-during-probation",
                0.1,
                3,
                SCENARIOS / "broken-during-probation.specmodel.yaml",
            ),
            None,
        ),
    ],
    ids=["canary steps", "trials", "probation"],
)
def test_no_judgement_stays_pending_past_its_deadline(result: Any, deadline: str | None) -> None:
    """Quiet fleets, where evidence comes slowly: at every tick of the replay each pending
    canary step, trial and probation is decided by a tick after its deadline at the latest."""
    run = result().run
    assert [(t.t, t.past_deadline) for t in run.ticks if t.past_deadline] == []
    reasons = {d["reason"] for d in run.decisions}
    assert deadline is None or deadline in reasons  # the deadlines did come into play


def test_a_class_switchs_decisions_name_their_class() -> None:
    from specfleet.simulate import plot

    def switched(action: str, **evidence: Any) -> dict[str, Any]:
        return {"action": action, "evidence": {"class": "tools", **evidence}}

    texts = [
        plot.describe(switched("class_speculation_off", signals=["speedup"])),
        plot.describe(switched("class_trial_started")),
        plot.describe(switched("class_trial_failed")),
        plot.describe(switched("class_speculation_on")),
    ]
    assert texts == [
        "tools routed to the plain pool: speedup",
        "tools class trial",
        "tools class trial failed",
        "tools back on speculation",
    ]
