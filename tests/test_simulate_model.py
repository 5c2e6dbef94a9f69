"""The replay's pieces: fleet physics, common random numbers, rollouts, revisions and windows."""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from specfleet.api.status import KillSwitchState, KillSwitchStatus
from specfleet.guard import Situation
from specfleet.guard.speedup import decode_steps, expected_tokens_per_step, speedup
from specfleet.scenario import parse_scenario
from specfleet.scenario.drafting import draw
from specfleet.scenario.timing import TimingModel
from specfleet.simulate import physics
from specfleet.simulate.control import Operator
from specfleet.simulate.draws import ClassDraw, binomial, poisson
from specfleet.simulate.fleet import Fleet
from specfleet.simulate.inputs import build_world, load_specmodel_document
from specfleet.simulate.outcome import realize, window
from specfleet.simulate.plot import Points
from specfleet.simulate.replay import serve
from specfleet.simulate.world import Setting, World
from specfleet.telemetry.model import Observation

LLAMA = Path(__file__).resolve().parent.parent / "examples/llama-3.1-8b-eagle3-fp8.yaml"
QWEN_NGRAM = LLAMA.parent / "qwen2.5-coder-7b-ngram.yaml"


def world(**scenario: Any) -> World:
    base = {
        "duration_s": 600,
        "traffic_rps": 4,
        "classes": {"code": {"share": 1.0, "acceptance": 0.8, "output_tokens": 200}},
    }
    return build_world(load_specmodel_document(LLAMA), parse_scenario(base | scenario))


def test_tokens_per_step_match_the_simulator() -> None:
    for alpha in (0.0, 0.3, 0.8, 1.0):
        assert physics.tokens_per_step(alpha, 4) == pytest.approx(
            expected_tokens_per_step(alpha, 4)
        )
    rng = random.Random(1)
    sampled = sum(1 + draw(0.7, 5, rng, 0.9) for _ in range(40_000)) / 40_000
    assert physics.tokens_per_step(0.7, 5, 0.9) == pytest.approx(sampled, rel=0.01)


def test_prompt_lookup_steps_match_the_engine_simulator() -> None:
    """n-gram drafts only on a match, 1 to k tokens alike (the engine simulator's rule): the
    moments over every decode step agree with sampling that rule."""
    rng, n = random.Random(3), 40_000
    tokens = drafted = verify = 0
    for _ in range(n):
        tokens += 1
        if rng.random() < 0.3:
            length = rng.randint(1, 4)
            tokens += draw(0.8, length, rng)
            drafted, verify = drafted + length, verify + 1
    assert physics.tokens_per_step(0.8, 4, match=0.3) == pytest.approx(tokens / n, rel=0.01)
    assert physics.drafts_per_step(4, 0.3) == pytest.approx(0.75)
    assert physics.drafting_share(4, 0.3) == pytest.approx(0.3)
    rate = physics.engine_acceptance_rate(0.8, 4, match=0.3)
    assert rate == pytest.approx((tokens - n) / drafted, rel=0.02)
    modelled = physics.modelled_speedup(0.8, 4, 0.01, 0.0, match=0.3)
    assert modelled == pytest.approx(speedup(tokens / n, drafted / n, 0.01, 0.0), rel=0.01)
    drafting_steps_only = (1 + (tokens - n) / verify) / (1 + 4 * 0.01)
    assert modelled < 0.6 * drafting_steps_only


def test_a_prompt_lookup_slice_counts_like_the_engines() -> None:
    """Verify steps are the drafting share of the decode steps; the guard's model of the
    slice's counters is the true speedup, not the drafting steps' E / (1 + k·c)."""
    classes = {"chat": {"share": 1.0, "acceptance": 0.8, "output_tokens": 300}}
    classes["chat"]["draft_match_rate"] = 0.3
    scenario = {"duration_s": 600, "traffic_rps": 1, "classes": classes}
    w = build_world(load_specmodel_document(QWEN_NGRAM), parse_scenario(scenario))
    on = w.conditions(0, Setting(w.changes[0].config, True))
    served = realize(on, on.classes[0], ClassDraw(400, 0.0, 0.0, 0.5, 0.5, 0.5, 0.5, 0.5))
    steps = decode_steps(served.output_tokens, served.accepted_tokens)
    assert steps is not None
    assert served.steps == pytest.approx(0.3 * (steps - 400), rel=0.01)  # 400 prefills
    assert served.draft_tokens / served.steps == pytest.approx(3.0, rel=0.01)  # 1..5 alike
    observed = speedup(served.output_tokens / steps, served.draft_tokens / steps, 0.01, 0.0)
    assert observed == pytest.approx(
        physics.modelled_speedup(0.8, 5, 0.01, 0.0, 1.0, 0.3), rel=0.03
    )
    engines_length = 1 + served.accepted_tokens / served.steps
    assert observed < 0.6 * engines_length / 1.05


def test_engine_acceptance_rate_is_accepted_over_drafted_not_alpha() -> None:
    assert physics.engine_acceptance_rate(0.8, 4) == pytest.approx((3.3616 - 1) / 4)
    assert physics.engine_acceptance_rate(0.4, 4) < 0.17
    assert physics.engine_acceptance_rate(0.5, 0) == 0.0


def test_concurrency_solves_littles_law() -> None:
    timing = TimingModel()
    demand = 4 * 300 / 2.3 / 2  # rps · tokens / E / replicas
    batch = physics.concurrency(timing, demand, 4, 0.06, 256)
    assert batch == pytest.approx(demand * physics.step_seconds(timing, batch, 4, 0.06))
    assert physics.concurrency(timing, 1e6, 4, 0.06, 256) == 256  # saturated
    assert physics.concurrency(timing, 1e-6, 0, 0.0, 256) == 1.0


def test_every_step_with_speculation_on_pays_the_step_overhead() -> None:
    """The timing model's o is the guard's: nothing drafted still costs 1 + o a step."""
    timing = TimingModel(step_overhead=0.35)
    plain = timing.decode_seconds(1, 0, 0.0)
    idle = timing.decode_seconds(1, 0, timing.cost("ngram"), timing.overhead("ngram"))
    assert idle / plain == pytest.approx(1.35) and timing.overhead(None) == 0.0
    assert plain / idle == pytest.approx(speedup(1.0, 0.0, 0.01, 0.35))
    # a scenario sets the world's o; speculation off pays none
    free, costly = world(traffic_rps=0.01), world(traffic_rps=0.01, timing={"step_overhead": 0.35})
    config = free.changes[0].config
    on, on_costly = (w.conditions(0, Setting(config, True)) for w in (free, costly))
    drafted = on.drafts_per_step * TimingModel().cost("eagle3")
    assert on_costly.step_seconds / on.step_seconds == pytest.approx(
        (1.35 + drafted) / (1 + drafted)
    )
    off, off_costly = (w.conditions(0, Setting(config, False)) for w in (free, costly))
    assert off_costly.step_seconds == off.step_seconds


def test_poisson_and_binomial_quantiles() -> None:
    grid = [(i + 0.5) / 2000 for i in range(2000)]
    assert sum(poisson(12.0, u) for u in grid) / len(grid) == pytest.approx(12.0, rel=0.01)
    assert sum(poisson(900.0, u) for u in grid) / len(grid) == pytest.approx(900.0, rel=0.01)
    assert sum(binomial(50, 0.2, u) for u in grid) / len(grid) == pytest.approx(10.0, rel=0.01)
    assert binomial(50, 0.0, 0.99) == 0 and binomial(50, 1.0, 0.01) == 50
    assert binomial(5000, 0.7, 0.5) == pytest.approx(3500, abs=2)


def test_common_random_numbers_never_favour_the_worse_setting() -> None:
    for u in (0.05, 0.3, 0.7, 0.95):
        assert binomial(100, 0.15, u) >= binomial(100, 0.01, u)
        assert poisson(30.0, u) >= poisson(20.0, u)


def test_fleet_rollouts_move_one_pod_at_a_time_and_the_latest_target_wins() -> None:
    on, off, other = Setting("a", True), Setting("a", False), Setting("b", True)
    fleet = Fleet(serving=on).request(off, 100.0, 60.0, replicas=2)
    assert [fleet.moved(t) for t in (100.0, 129.0, 130.0, 159.0)] == [0, 0, 1, 1]
    assert not fleet.settled and fleet.advance(159.0).serving == on
    assert fleet.advance(160.0) == Fleet(serving=off, switched_at=160.0)
    restarted = fleet.request(other, 130.0, 60.0, replicas=2)
    assert restarted.rollout and restarted.rollout.ready_at == 190.0
    assert restarted.pending == other and restarted.moved(130.0) == 0
    assert fleet.request(on, 120.0, 60.0, replicas=2).settled  # no pod moved yet: cancelled
    back = fleet.request(on, 140.0, 60.0, replicas=2)  # one pod moved: it moves back
    assert back.pending == on and back.moved(140.0) == 1 and back.moved(170.0) == 2
    assert back.advance(170.0) == Fleet(serving=on, switched_at=170.0)
    assert fleet.request(off, 120.0, 60.0, replicas=2) is fleet  # the same target: nothing to do


def test_a_rolling_fleet_serves_the_new_setting_from_the_pods_that_moved() -> None:
    w = world()
    config = w.changes[0].config
    on, off = Setting(config, True), Setting(config, False)
    fleet = Fleet(serving=on).request(off, 0.0, 60.0, replicas=2)
    draws = {"code": ClassDraw(30, 0.0, 0.0, 0.5, 0.5, 0.5, 0.5, 0.5)}
    counted = {"code": 1}  # round robin continues: the moved pod takes requests 2, 4, ... 30
    before = serve(w, fleet, 29.0, draws, counted, 0.15)
    assert before.moved is None and before.fleet["code"].requests == 30
    half = serve(w, fleet, 30.0, draws, counted, 0.15)
    assert half.moved is not None
    assert (half.fleet["code"].requests, half.moved["code"].requests) == (15, 15)
    assert half.fleet["code"].draft_tokens > 0 and half.moved["code"].draft_tokens == 0
    assert half.total["code"].requests == 30


def judged(operator: Operator, observation: Observation, fleet: Fleet, now: datetime) -> Situation:
    """What the guard judges at a tick at `now` (the operator as it was before it)."""
    situation = operator.ticked(observation, fleet, now)[1].situation
    assert situation is not None
    return situation


def test_the_operator_judges_only_a_full_window_after_the_rollout() -> None:
    w = world()
    config = w.changes[0].config
    specmodel = w.changes[0].specmodel
    fleet = Fleet(serving=Setting(config, True))
    start = datetime(2026, 1, 1, tzinfo=UTC)
    operator = Operator.start(specmodel, fleet, start - timedelta(hours=1))
    observation = Observation(at=start, window_seconds=60, revision=1, speculation=True)
    assert judged(operator, observation, fleet, start).settled
    engaged = KillSwitchStatus(state=KillSwitchState.ENGAGED, source="guard")
    engaging = operator.status.model_copy(update={"kill_switch": engaged})
    operator = replace(operator, status=engaging).reconciled(fleet, start)
    moving = fleet.request(operator.target, 0.0, 60.0, replicas=2)
    assert moving.pending == Setting(config, False)
    operator = operator.reconciled(moving, start)
    assert not judged(operator, observation, moving, start + timedelta(seconds=30)).settled
    done = moving.advance(60.0)
    operator = operator.reconciled(done, start + timedelta(seconds=60))
    assert not judged(operator, observation, done, start + timedelta(seconds=105)).settled
    assert judged(operator, observation, done, start + timedelta(seconds=120)).settled


def test_a_trial_runs_a_canary_judged_one_interval_after_it_serves() -> None:
    w = world()
    config, specmodel = w.changes[0].config, w.changes[0].specmodel
    start = datetime(2026, 1, 1, tzinfo=UTC)
    fleet = Fleet(serving=Setting(config, False))
    trial = KillSwitchStatus(state=KillSwitchState.TRIAL, source="guard")
    operator = Operator.start(specmodel, fleet, start - timedelta(hours=1))
    trying = operator.status.model_copy(update={"kill_switch": trial})
    operator = replace(operator, status=trying).reconciled(fleet, start)
    assert operator.target == Setting(config, False)  # the fleet stays without
    assert operator.canary == Setting(config, True)
    starting = fleet.request(operator.target, 0.0, 60.0, replicas=2)
    starting = starting.request_canary(operator.canary, 0.0, 60.0, replicas=2)
    assert starting.settled and starting.serving == fleet.serving  # the fleet is not touched
    operator = operator.reconciled(starting, start)
    assert operator.status.canary and operator.status.canary.state == "Starting"
    canary = Observation(at=start, window_seconds=60, revision=1, speculation=True)
    beside = Observation(at=start, window_seconds=60, revision=1, speculation=False, canary=canary)
    assert judged(operator, beside, starting, start + timedelta(seconds=29)).canary is None
    serving = starting.advance(30.0)
    assert serving.canary_serving == Setting(config, True)
    operator = operator.reconciled(serving, start + timedelta(seconds=30))
    assert operator.status.canary and operator.status.canary.state == "Serving"
    situation = judged(operator, beside, serving, start + timedelta(seconds=44))
    assert situation.settled and situation.canary is None
    assert judged(operator, beside, serving, start + timedelta(seconds=45)).canary is canary
    # a cooldown shorter than the window could leave an earlier canary in it: a full window
    quick = specmodel.model_copy(deep=True)
    quick.spec.guard.cooldown_seconds = 30
    operator = replace(operator, specmodel=quick)
    assert judged(operator, beside, serving, start + timedelta(seconds=75)).canary is None
    assert judged(operator, beside, serving, start + timedelta(seconds=90)).canary is canary
    assert serving.request_canary(None, 100.0, 60.0, replicas=2).canary is None  # removed at once


def test_a_canary_takes_every_third_request_and_speculates_on_its_share_only() -> None:
    w = world()
    config = w.changes[0].config
    fleet = Fleet(serving=Setting(config, False))
    fleet = fleet.request_canary(Setting(config, True), 0, 0, replicas=2)
    fleet = fleet.advance(0.0)
    draws = {"code": ClassDraw(30, 0.0, 0.0, 0.5, 0.5, 0.5, 0.5, 0.5)}
    counted = {"code": 1}  # round robin continues over the slices: requests 2, 5, 8, ... 29
    served = serve(w, fleet, 0.0, draws, counted, 0.15)
    assert served.canary is not None
    assert (served.fleet["code"].requests, served.canary["code"].requests) == (20, 10)
    assert served.fleet["code"].draft_tokens == 0 and served.canary["code"].draft_tokens > 0
    assert served.total["code"].requests == 30
    # no credit for the canary's capacity: every pod runs at the fleet's load without it
    assert served.conditions == w.conditions(0, Setting(config, False))


def test_revision_effects_follow_the_revision_environment_effects_everyone() -> None:
    rollouts = [
        {"t": 100, "spec": {}, "effects": {"error_rate": 0.02}},
        {
            "t": 200,
            "spec": {"quantization": {"weights": "none"}},
            "effects": {"tool_call_validity": 0.5, "tpot_factor": 0.8},
        },
    ]
    w = world(rollouts=rollouts)
    first, second = (r.config for r in sorted(w.revisions.values(), key=lambda r: r.number))
    assert len(w.revisions) == 2 and w.changes[-1].config == second
    assert w.effects(50, first).error_rate == 0.0
    assert w.effects(150, first).error_rate == 0.02
    assert w.effects(300, first).tool_call_validity is None  # rolled back: its effects end
    assert w.effects(300, second).tool_call_validity == 0.5
    assert w.effects(300, second).error_rate == 0.02
    fast = w.conditions(300, Setting(second, True)).step_seconds
    assert fast < w.conditions(300, Setting(first, True)).step_seconds


def test_a_slice_counts_like_the_engines() -> None:
    w = world()
    config = w.changes[0].config
    noise = ClassDraw(400, 0.0, 0.0, 0.5, 0.5, 0.5, 0.5, 0.5)
    on = w.conditions(0, Setting(config, True))
    served = realize(on, on.classes[0], noise)
    assert served.draft_tokens == 4 * served.steps
    assert served.accepted_tokens / served.draft_tokens == pytest.approx(
        physics.engine_acceptance_rate(0.8, 4), abs=0.01
    )
    off = w.conditions(0, Setting(config, False))
    plain = realize(off, off.classes[0], noise)
    assert plain.draft_tokens == 0 and plain.output_tokens == served.output_tokens
    observed_on = window([served], True, False)
    observed_off = window([plain], False, False)
    assert observed_off.draft_tokens is None and observed_on.tool_calls_valid is None
    assert observed_on.mean_tpot_seconds and observed_off.mean_tpot_seconds
    assert observed_on.mean_tpot_seconds < observed_off.mean_tpot_seconds


def test_a_revision_cutting_off_answers_truncates_only_while_it_serves() -> None:
    rollouts = [
        {
            "t": 200,
            "spec": {"quantization": {"weights": "none"}},
            "effects": {"truncation_rate": {"code": 0.3}},
        }
    ]
    w = world(rollouts=rollouts)
    second = w.changes[-1].config
    on = w.conditions(300, Setting(second, True))
    cut = realize(on, on.classes[0], ClassDraw(400, 0.0, 0.0, 0.5, 0.5, 0.5, 0.5, 0.5))
    assert (cut.choices, cut.truncated) == (400, 120)
    observed = window([cut], True, False)
    assert observed.truncation_rate == pytest.approx(0.3)
    assert w.conditions(300, Setting(w.changes[0].config, True)).classes[0].truncation_rate == 0


def test_long_timelines_draw_block_means() -> None:
    view = Points([], [], 60.0, stride=3)
    assert view.line([1.0, None, 3.0, None, None, None, 5.0]) == pytest.approx(
        [2.0, float("nan"), 5.0], nan_ok=True
    )
