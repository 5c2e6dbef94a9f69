"""The guard's policy: pure, deterministic, and conservative about evidence."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from conftest import specmodel_doc
from specfleet.api import parse_specmodel
from specfleet.api.status import (
    GuardStatus,
    KillSwitchStatus,
    LatencyBaseline,
    QualityBaseline,
    RevisionRecord,
)
from specfleet.guard import Decision, Policy, Situation
from specfleet.guard import decide as decide_every_class
from specfleet.guard.actions import PER_CLASS
from specfleet.guard.sequential import confidence_sequence
from specfleet.guard.speedup import (
    decode_steps,
    expected_speedup,
    expected_tokens_per_step,
    load_factor,
    paying_batch,
    speedup,
    wilson_interval,
)
from specfleet.telemetry.model import ClassWindow, Observation

T0 = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)
GOOD_REVISION = RevisionRecord(number=1, hash="aaaaaaaaaa", verdict="good")


FLOORS = [
    {"name": "code", "critical": True, "slo": {"minAcceptanceRate": 0.5}},
    {"name": "chat", "slo": {"minToolCallValidity": 0.9}},
]


def policy(
    override: str | None = None, classes: list[dict[str, Any]] = FLOORS, **guard: Any
) -> Policy:
    doc = specmodel_doc(
        speculative={"method": "eagle3", "draftModel": "d", "numSpeculativeTokens": 4},
        classes=classes,
        defaultClass="chat",
        guard={"consecutiveBreaches": 3, **guard},
    )
    return Policy.of(parse_specmodel(doc), override)


def window(alpha: float, requests: float = 200, **extra: Any) -> ClassWindow:
    """200 output tokens a request from EAGLE-3 drafting 4 tokens on every decode step, 1 + 4α
    tokens a step: output = steps + accepted."""
    output = requests * 200.0
    steps = output / (1 + 4 * alpha)
    fields: dict[str, Any] = {
        "requests": requests,
        "errors": 0.0,
        "draft_tokens": steps * 4,
        "accepted_tokens": steps * 4 * alpha,
        "steps": steps,
        "output_tokens": output,
        "mean_tpot_seconds": 0.02,
        "tpot_samples": requests,
    }
    return ClassWindow(**(fields | extra))


def observe(
    code: float, chat: float, speculation: bool = True, tpot: float = 0.02, **chat_extra: Any
) -> Observation:
    return Observation(
        at=T0,
        window_seconds=60,
        revision=1,
        speculation=speculation,
        classes={
            "code": window(code, mean_tpot_seconds=tpot),
            "chat": window(chat, mean_tpot_seconds=tpot, **chat_extra),
        },
    )


def decide(situation: Situation) -> Decision:
    """The fleet-wide decision: per-class decisions are tests/test_guard_classes.py's."""
    decision = decide_every_class(situation)
    decision.actions = [a for a in decision.actions if a.action not in PER_CLASS]
    return decision


def situation(observation: Observation | None, **changes: Any) -> Situation:
    base = Situation(
        policy=policy(),
        guard=GuardStatus(),
        kill_switch=KillSwitchStatus(),
        revision=GOOD_REVISION,
        has_last_good=True,
        speculation=True,
        settled=True,
        observation=observation,
        now=T0,
    )
    return replace(base, **changes)


FLEET_WITHOUT = observe(0.8, 0.8, speculation=False)


def run(
    start: Situation, observations: list[Observation | None], step: float = 15
) -> tuple[Situation, list[str]]:
    """Feeds observations tick by tick, carrying the decision's state forward. During a trial
    each observation is the canary's, beside a fleet without speculation (FLEET_WITHOUT)."""
    current, actions = start, []
    for index, observation in enumerate(observations):
        now = start.now + timedelta(seconds=step * index)
        tick = replace(current, observation=observation, now=now)
        if current.kill_switch.state == "trial":
            tick = replace(tick, observation=FLEET_WITHOUT, canary=observation)
        decision = decide(tick)
        actions += [a.action for a in decision.actions]
        revision = current.revision.model_copy(update={"verdict": decision.verdict})
        speculation = decision.kill_switch.state != "engaged" and current.speculation
        if current.policy.override is None:
            speculation = decision.kill_switch.state == "released"
        current = replace(
            current,
            guard=decision.guard,
            kill_switch=decision.kill_switch,
            revision=revision,
            speculation=speculation,
            now=now,
        )
    return current, actions


def test_speedup_formula() -> None:
    assert expected_tokens_per_step(0.8, 4) == pytest.approx(3.3616)
    assert expected_speedup(0.8, 4, 0.05) == pytest.approx(3.3616 / 1.2)
    assert expected_tokens_per_step(1.0, 4) == 5
    assert expected_speedup(0.05, 4, 0.1) < 1  # α below c: speculation cannot pay


def test_speedup_counts_the_decode_steps_that_drafted_nothing() -> None:
    # 10 decode steps, 4 of them drafting 3 tokens and accepting 2: 18 tokens for 10 forwards
    # and 12 draft tokens; the drafting steps alone show E = 3
    output, accepted, drafted = 18, 8, 12
    steps = decode_steps(output, accepted)
    assert steps == 10
    assert speedup(output / steps, drafted / steps, 0.1, 0.0) == pytest.approx(18 / (10 + 1.2))
    # every step drafting k: E / (1 + k·c), whatever E
    assert speedup(3.3616, 4, 0.05, 0.0) == pytest.approx(expected_speedup(0.8, 4, 0.05))
    assert decode_steps(5, 5) is None


def ngram_observation(drafted: float, accepted: float, output: float) -> Observation:
    counts = {"draft_tokens": drafted, "accepted_tokens": accepted, "output_tokens": output}
    classes = {
        name: window(0.0, steps=drafted / 3, **counts, mean_tpot_seconds=None)
        for name in ("code", "chat")
    }
    return Observation(at=T0, window_seconds=60, revision=1, speculation=True, classes=classes)


def ngram_policy(**speculative: Any) -> Policy:
    doc = specmodel_doc(
        speculative={"method": "ngram", "numSpeculativeTokens": 5, **speculative},
        classes=FLOORS,
        defaultClass="chat",
        guard={"minSpeedup": 1.3},
    )
    return Policy.of(parse_specmodel(doc), None)


def test_ngram_drafting_on_few_steps_is_judged_by_every_step() -> None:
    """vLLM's n-gram drafts only where the lookup matches: here 72% of the output comes from
    steps that drafted nothing. The drafting steps' E = 2.83 would say 2.83 / 1.05 = 2.7x;
    the target ran 32 758 forwards for 40 000 tokens."""
    drafting_steps, drafted = 3958.0, 11874.0
    accepted = 11200 - drafting_steps
    observed = ngram_observation(drafted, accepted, 40000)
    decision = decide(situation(observed, policy=ngram_policy()))
    evaluation = decision.evaluation
    assert evaluation is not None and evaluation.speculation_bad
    assert evaluation.speedup == pytest.approx(40000 / (40000 - accepted + 0.01 * drafted))
    code = next(v for v in evaluation.classes if v.name == "code")
    evidence = code.evidence()
    assert evidence["meanAcceptanceLength"] == pytest.approx(2.83, abs=0.01)
    assert evidence["draftsPerStep"] == pytest.approx(drafted / (40000 - accepted), abs=1e-4)
    # acceptance is judged on the drafting steps: 0.61 clears the 0.5 floor
    assert code.speculation_breaches == ["speedup 1.22 < 1.30"]


def test_a_drafter_that_drafted_nothing_is_no_collapse() -> None:
    """TensorRT-LLM above max_concurrency, a depth schedule at k = 0, n-gram finding no match:
    output but no drafts is no acceptance evidence, so no breach and no action."""
    idle = ngram_observation(0.0, 0.0, 40000)
    state, actions = run(situation(idle, policy=ngram_policy()), [idle] * 5)
    assert actions == [] and state.kill_switch.state != "engaged"
    evaluation = decide(situation(idle, policy=ngram_policy())).evaluation
    assert evaluation is not None and evaluation.speculation_bad is None
    assert {v.verdict for v in evaluation.classes} == {"inconclusive"}


def test_speculation_being_on_costs_every_step() -> None:
    """o = 0.35: a step with speculation on costs 1.35 forwards, drafts or none."""
    assert speedup(1.0, 0.0, 0.01, 0.35) == pytest.approx(1 / 1.35)
    assert speedup(18 / 10, 12 / 10, 0.1, 0.35) == pytest.approx(18 / (10 * 1.35 + 1.2))
    assert expected_speedup(0.8, 4, 0.05, 0.35) == pytest.approx(3.3616 / 1.55)


def test_a_drafter_that_drafted_nothing_still_pays_its_step_overhead() -> None:
    """The real vLLM with n-gram on and sampled prose: no drafts, and every step costs more.
    With stepOverhead set, enough decode steps are judged on speedup, 1 / (1 + o), while the
    acceptance rate (no drafts) stays unjudged: the breach is the speedup's, no collapse."""
    idle = ngram_observation(0.0, 0.0, 40000)
    costly = ngram_policy(stepOverhead=0.35)
    evaluation = decide(situation(idle, policy=costly)).evaluation
    assert evaluation is not None and evaluation.speculation_bad
    assert evaluation.speedup == pytest.approx(1 / 1.35)
    assert evaluation.decisive and not evaluation.below_acceptance_floor
    code = next(v for v in evaluation.classes if v.name == "code")
    assert code.speculation_breaches == ["speedup 0.74 < 1.30"]
    assert code.acceptance_bounds is None and not code.far_below_acceptance_floor
    evidence = code.evidence()
    assert evidence["acceptanceRate"] is None and evidence["stepOverhead"] == 0.35
    state, actions = run(situation(idle, policy=costly), [idle])
    assert actions == ["kill_switch_engaged"] and state.kill_switch.state == "engaged"


def test_few_decode_steps_without_drafts_stay_inconclusive() -> None:
    """Fewer decode steps than minDraftTokens is no evidence of the overhead either."""
    short = ngram_observation(0.0, 0.0, 400)
    evaluation = decide(situation(short, policy=ngram_policy(stepOverhead=0.35))).evaluation
    assert evaluation is not None and evaluation.speculation_bad is None
    assert {v.verdict for v in evaluation.classes} == {"inconclusive"}


def test_few_drafts_are_judged_between_none_and_every_draft_accepted() -> None:
    """100 drafts (under minDraftTokens) in 40 000 tokens: too few to read acceptance, not
    too few to bound the speedup: between all rejected and all accepted."""
    few = ngram_observation(100.0, 60.0, 40000)
    evaluation = decide(situation(few, policy=ngram_policy(stepOverhead=0.35))).evaluation
    assert evaluation is not None and evaluation.speculation_bad
    steps = 40000 - 60.0
    modelled = 40000 / (steps * 1.35 + 0.01 * 100)
    assert evaluation.speedup == pytest.approx(modelled)
    low, high = evaluation.speedup_bounds or (0.0, 0.0)
    assert low == pytest.approx(modelled * steps / 40000)
    assert high == pytest.approx(modelled * (steps + 100) / 40000)
    assert not evaluation.below_acceptance_floor


def test_load_factor_and_the_batch_where_speculation_stops_paying() -> None:
    assert load_factor(0, 4, 0.01) == 1.0
    assert load_factor(100, 4, 0.01) == pytest.approx(2 / 6)  # verify 5 tokens per request
    assert load_factor(100, 4, 0.0) == 1.0
    batch = paying_batch(2.5, 4, 0.01, 1.1)
    assert 2.5 * load_factor(batch, 4, 0.01) == pytest.approx(1.1)
    assert paying_batch(1.0, 4, 0.01, 1.1) == 0.0  # does not pay even without load
    assert paying_batch(2.5, 4, 0.0, 1.1) == float("inf")
    assert paying_batch(20.0, 4, 0.01, 1.1) == float("inf")  # k + 1 tokens cost at most 5x
    # a decode step verifies 1 + δ tokens a request, δ the drafts per step over all steps
    assert load_factor(100, 0.5, 0.01) == pytest.approx(2 / 2.5)
    assert paying_batch(2.5, 0.5, 0.01, 1.1) == float("inf")  # 1.5 tokens cost at most 1.5x
    assert 1.3 * load_factor(paying_batch(1.3, 0.5, 0.01, 1.1), 0.5, 0.01) == pytest.approx(1.1)


def loaded(alpha: float, in_flight: float, speculation: bool = True) -> Observation:
    """Both classes at `alpha`, with `in_flight` requests in flight on the one replica."""
    seconds = in_flight * 60 / 2
    classes = {name: window(alpha, request_seconds=seconds) for name in ("code", "chat")}
    return Observation(
        at=T0, window_seconds=60, revision=1, speculation=speculation, classes=classes
    )


def test_load_makes_healthy_speculation_lose_and_trials_wait_for_it_to_drop() -> None:
    # α 0.5 -> E = 3, speedup 3 / 1.2 = 2.5 without load; at 200 in flight x 3/11 = 0.68
    assert not run(situation(loaded(0.5, 10)), [loaded(0.5, 10)] * 5)[1]
    busy, quiet = loaded(0.5, 200), loaded(0.5, 30, speculation=False)
    state, actions = run(situation(busy), [busy] * 3)
    assert actions == ["kill_switch_engaged"]
    assert state.guard.trial_max_in_flight == pytest.approx(46.7)
    assert "lost to load (200 requests in flight per replica)" in state.kill_switch.reason
    still_busy = loaded(0.5, 100, speculation=False)
    state, actions = run(state, [still_busy] * 30)  # 450 s: past the 300 s cooldown
    assert actions == [] and state.kill_switch.state == "engaged"
    state, actions = run(state, [quiet])
    assert actions == ["trial_started"]


def test_a_trial_held_for_load_waits_at_most_max_cooldown_past_its_time() -> None:
    # Without speculation requests take longer, so in flight may never fall back under the
    # batch where speculation would pay: the trial goes ahead once maxCooldownSeconds is up.
    strict = policy(cooldownSeconds=300, maxCooldownSeconds=600)
    busy = loaded(0.5, 200)
    state, actions = run(situation(busy, policy=strict), [busy])  # engaged at 0 s
    assert actions == ["kill_switch_engaged"] and state.guard.trial_max_in_flight is not None
    still_busy = loaded(0.5, 100, speculation=False)
    state, actions = run(state, [still_busy] * 60)  # up to 885 s: due at 300 s, held to 900 s
    assert actions == [] and state.kill_switch.state == "engaged"
    state, actions = run(state, [still_busy] * 2)  # 885 s again, then 900 s
    assert actions == ["trial_started"]


def test_an_acceptance_collapse_under_load_is_not_blamed_on_load() -> None:
    collapsed = loaded(0.1, 200)
    state, actions = run(situation(collapsed), [collapsed] * 3)
    assert actions == ["kill_switch_engaged"] and state.guard.trial_max_in_flight is None


# code 0.36 against its 0.5 floor over 200 requests: upper bound 0.480 at error rate 0.05, under
# the floor but not under 0.45 (the floor less the 10% hysteresis band): a marginal breach
MARGINAL = observe(code=0.36, chat=0.8)


def test_three_marginal_windows_engage_the_kill_switch_two_do_not() -> None:
    state, actions = run(situation(MARGINAL), [MARGINAL, MARGINAL])
    assert actions == [] and state.kill_switch.state == "released"
    state, actions = run(situation(MARGINAL), [MARGINAL] * 3)
    assert actions == ["kill_switch_engaged"]
    assert state.kill_switch.state == "engaged" and state.kill_switch.source == "guard"
    assert "after 3 windows in a row" in state.kill_switch.reason


def test_one_decisive_window_engages_at_once() -> None:
    # code 0.1 over 200 requests: upper bound 0.19, far under 0.45
    state, actions = run(situation(observe(0.1, 0.1)), [observe(0.1, 0.1)])
    assert actions == ["kill_switch_engaged"]
    assert state.kill_switch.reason.startswith(
        "Speculation off after 1 decisive window: code: acceptance 0.10 < 0.50 "
        "(upper bound 0.19 at error rate 0.05, n=200)"
    )
    # without floors the speedup decides: α 0 gives (1 + 4 x 0.031) / 1.2 = 0.94 at its upper
    # bound over 200 requests, under minSpeedup but not by the band: three windows engage it;
    # α 0.02 gives 0.90 but a bound of 1.08, two windows do not
    no_floors = policy(classes=[{"name": "code", "critical": True}, {"name": "chat"}])
    useless, slow = observe(0.0, 0.0), observe(0.02, 0.02)
    _, actions = run(situation(useless, policy=no_floors), [useless] * 3)
    assert actions == ["kill_switch_engaged"]
    _, actions = run(situation(slow, policy=no_floors), [slow] * 2)
    assert actions == []
    decision = decide(situation(slow, policy=no_floors))
    assert decision.evaluation is not None and not decision.evaluation.decisive
    low, high = decision.evaluation.speedup_bounds or (0, 0)
    assert decision.evaluation.speedup == pytest.approx(0.9)
    assert low < 0.9 < high
    assert high == pytest.approx((1 + 4 * confidence_sequence(4, 200, 0.05)[1]) / 1.2)


def test_engage_decision_carries_its_evidence() -> None:
    bad = observe(code=0.1, chat=0.1)
    decision = decide(situation(bad, guard=GuardStatus(consecutive_bad=2)))
    [action] = decision.actions
    assert action.reason == "SpeculationNotPaying"
    evidence = action.evidence
    assert evidence["classes"]["code"]["acceptanceRate"] == 0.1
    assert evidence["classes"]["code"]["draftTokens"] == pytest.approx(200 * 200 / 1.4 * 4)
    assert evidence["classes"]["code"]["draftsPerStep"] == 4  # every decode step drafted
    assert evidence["minSpeedup"] == 1.0 and evidence["windowSeconds"] == 60
    # E = 1 + accepted / steps = 1.4: the model says 1.4 / 1.2; the critical floor decided
    assert evidence["speedup"] == pytest.approx(1.4 / 1.2, abs=1e-3)
    assert (
        "code: acceptance 0.10 < 0.50 (upper bound 0.19 at error rate 0.05, n=200)"
        in evidence["breaches"]
    )
    assert evidence["decisive"] and evidence["windows"] == 3
    assert evidence["classes"]["code"]["acceptanceRateBounds"] == [0.0428, 0.1878]
    assert decision.kill_switch.next_trial_after == (T0 + timedelta(seconds=60)).isoformat()


def test_a_good_window_resets_the_count() -> None:
    bad, good = MARGINAL, observe(0.8, 0.8)
    _, actions = run(situation(bad), [bad, bad, good, bad, bad])
    assert actions == []


def test_too_few_samples_is_inconclusive_never_bad() -> None:
    thin = Observation(
        at=T0,
        window_seconds=60,
        revision=1,
        speculation=True,
        classes={"code": window(0.05, requests=5), "chat": window(0.05, requests=5)},
    )
    state, actions = run(situation(thin), [thin] * 10)
    assert actions == [] and state.guard.consecutive_bad == 0
    decision = decide(situation(thin))
    assert {c.verdict for c in decision.classes} == {"inconclusive"}


def test_critical_class_breach_is_enough() -> None:
    critical_bad = observe(code=0.3, chat=0.9)  # weighted speedup fine, code below 0.5 floor
    _, actions = run(situation(critical_bad), [critical_bad] * 3)
    assert actions == ["kill_switch_engaged"]


def test_acceptance_floor_needs_confidence_over_requests() -> None:
    # code 0.45 against the 0.5 floor: 200 requests are not enough to be sure, 2000 are
    def dip(requests: float) -> Observation:
        code = window(0.45, requests=requests)
        return replace(observe(code=0.45, chat=0.9), classes={"code": code, "chat": window(0.9)})

    _, actions = run(situation(dip(200)), [dip(200)] * 5)
    assert actions == []
    _, actions = run(situation(dip(2000)), [dip(2000)] * 3)
    assert actions == ["kill_switch_engaged"]


def test_non_critical_breach_alone_is_not_enough() -> None:
    obs = observe(code=0.9, chat=0.3)
    _, actions = run(situation(obs), [obs] * 5)
    assert actions == []


def test_measured_tpot_overrides_the_model() -> None:
    # α = 0.6 models a speedup > 1, but measured TPOT with speculation is worse than without.
    obs = Observation(
        at=T0,
        window_seconds=60,
        revision=1,
        speculation=True,
        classes={
            "code": window(0.6, mean_tpot_seconds=0.03),
            "chat": window(0.6, mean_tpot_seconds=0.03),
        },
    )
    measured = GuardStatus(
        tpot_without_speculation={"code": 0.025, "chat": 0.025},
        tpot_measured_at=T0.isoformat(),
        tpot_revision=1,
    )
    decision = decide(situation(obs, guard=measured.model_copy(update={"consecutive_bad": 2})))
    assert [a.action for a in decision.actions] == ["kill_switch_engaged"]
    assert decision.actions[0].evidence["classes"]["code"]["speedupSource"] == "measured"
    assert not decide(situation(obs, guard=GuardStatus(consecutive_bad=2))).actions


def test_a_mean_tpot_of_too_few_streams_is_no_measure() -> None:
    # the same slow TPOT as above, from fewer streams than minRequests (most requests did not
    # stream): the model judges, and an off window that thin is not remembered either
    few = {"tpot_samples": 2.0, "mean_tpot_seconds": 0.03}
    obs = Observation(
        at=T0,
        window_seconds=60,
        revision=1,
        speculation=True,
        classes={"code": window(0.6, **few), "chat": window(0.6, **few)},
    )
    measured = GuardStatus(
        consecutive_bad=2,
        tpot_without_speculation={"code": 0.025, "chat": 0.025},
        tpot_measured_at=T0.isoformat(),
        tpot_revision=1,
    )
    decision = decide(situation(obs, guard=measured))
    assert decision.actions == []
    assert decision.evaluation and decision.evaluation.classes[0].source == "model"
    off = replace(obs, speculation=False)
    remembered = decide(situation(off, guard=GuardStatus())).guard
    assert remembered.tpot_without_speculation is None


def test_tpot_without_speculation_is_evidence_for_its_own_revision_alone() -> None:
    # revision 1 decoded at 0.025 s a token without speculation; revision 2 decodes 2.5 times
    # slower with it: its own slowdown, not speculation's, so the speedup model judges it
    slow = observe(0.6, 0.6, tpot=0.0625)
    old = GuardStatus(
        consecutive_bad=2,
        tpot_without_speculation={"code": 0.025, "chat": 0.025},
        tpot_measured_at=T0.isoformat(),
        tpot_revision=1,
    )
    decision = decide(replace(on_probation(guard=old), observation=slow))
    assert decision.actions == [] and decision.kill_switch.state == "released"
    assert decision.evaluation and decision.evaluation.classes[0].source == "model"
    # measured without speculation on revision 2, the old revision's numbers are dropped
    off = observe(0.6, 0.6, speculation=False, tpot=0.05)
    measured = decide(replace(on_probation(guard=old, speculation=False), observation=off)).guard
    assert measured.tpot_revision == 2
    assert measured.tpot_without_speculation == {"code": 0.05, "chat": 0.05}


def test_cooldown_trial_and_release_with_hysteresis() -> None:
    bad, good = observe(0.1, 0.1), observe(0.8, 0.8, tpot=0.008)
    off = observe(0.8, 0.8, speculation=False)
    state, actions = run(situation(bad), [bad] * 3)
    while state.kill_switch.state != "trial":  # the fleet without speculation, a cooldown
        state, more = run(replace(state, now=state.now + timedelta(seconds=15)), [off])
        actions += more
    state, more = run(replace(state, now=state.now + timedelta(seconds=15)), [good] * 6)
    assert actions + more == ["kill_switch_engaged", "trial_started", "kill_switch_released"]
    assert state.kill_switch.state == "released" and state.kill_switch.failed_trials == 0
    assert state.guard.tpot_without_speculation == {"code": 0.02, "chat": 0.02}


def test_failed_trial_doubles_the_cooldown() -> None:
    bad = observe(0.1, 0.1)
    off = observe(0.1, 0.1, speculation=False)
    state, actions = run(situation(bad), [bad] * 3 + [off] * 20 + [bad])  # fails on 1 window
    assert actions == ["kill_switch_engaged", "trial_started", "trial_failed"]
    assert state.kill_switch.failed_trials == 1
    due = datetime.fromisoformat(state.kill_switch.next_trial_after or "")
    assert due - state.now == timedelta(seconds=120)


def test_the_backoff_stops_at_half_an_hour_by_default() -> None:
    # a drafter that never fits: after five failed trials one canary every 30 minutes
    trial = KillSwitchStatus(state="trial", source="guard", failed_trials=4)
    failing = replace(situation(FLEET_WITHOUT, kill_switch=trial), canary=observe(0.1, 0.1))
    decision = decide(failing)
    assert [a.action for a in decision.actions] == ["trial_failed"]
    assert decision.kill_switch.failed_trials == 5
    due = datetime.fromisoformat(decision.kill_switch.next_trial_after or "")
    assert due - T0 == timedelta(seconds=1800)  # 60 s x 2^5 = 1920 s, capped


def test_trial_needs_the_stricter_threshold() -> None:
    # speedup (1 + 4 x 0.06) / 1.2 = 1.03: above minSpeedup 1.0, below 1.0 + releaseMargin 0.1;
    # no acceptance floors, so only the stricter threshold can fail the trial, once the canary's
    # evidence shows the speedup's upper bound under it
    marginal = observe(0.06, 0.06)
    no_floors = policy(classes=[{"name": "code", "critical": True}, {"name": "chat"}])
    guard = GuardStatus(consecutive_bad=2)
    running = decide(situation(marginal, policy=no_floors, guard=guard))
    assert running.actions == [] and running.kill_switch.state != "engaged"
    trial = KillSwitchStatus(state="trial", source="guard", failed_trials=0)
    # the fleet beside the canary measures TPOT without speculation in the same window: 1.03x
    fleet = observe(0.06, 0.06, speculation=False, tpot=0.0206)
    beside = replace(
        situation(fleet, policy=no_floors, kill_switch=trial, guard=guard), canary=marginal
    )
    decision = decide(beside)
    assert decision.actions == [] and decision.kill_switch.state == "trial"  # not shown yet
    ticks = 1
    while not decision.actions and ticks < 120:  # its evidence grows a quarter window a tick
        now = T0 + timedelta(seconds=15 * ticks)
        state = replace(beside, guard=decision.guard, kill_switch=decision.kill_switch, now=now)
        decision = decide(state)
        ticks += 1
    [failed] = decision.actions
    assert failed.action == "trial_failed" and ticks * 15 < 1800  # before its deadline
    assert failed.message.startswith("Trial failed on the canary: code: speedup 1.03 < 1.10; ")
    assert failed.evidence["classes"]["code"]["speedupSource"] == "measured"
    assert decision.guard.tpot_without_speculation == {"code": 0.0206, "chat": 0.0206}


def trial_without_floors() -> Situation:
    """A trial that has just started, no acceptance floors (code is critical)."""
    return situation(
        FLEET_WITHOUT,
        policy=policy(classes=[{"name": "code", "critical": True}, {"name": "chat"}]),
        kill_switch=KillSwitchStatus(state="trial", source="guard"),
        guard=GuardStatus(trial_since=T0.isoformat()),
        speculation=False,
    )


def test_a_paying_canary_releases_once_held_a_marginal_one_once_its_evidence_shows_it() -> None:
    start = trial_without_floors()
    state, actions = run(start, [observe(0.8, 0.8, tpot=0.008)] * 5)  # 2.5x, lower bound 2.2x
    assert actions == ["kill_switch_released"]  # held for a window (60 s, the fifth tick)
    assert "shown on 120 s of its serving (traffic-weighted speedup 2.50 (lower bound" in (
        state.kill_switch.reason or ""
    )
    # α 0.1: 1.17x measured, over 1.1, its lower bound on one window 0.98x, under minSpeedup:
    # the evidence grows until the bound reaches it
    marginal = observe(0.1, 0.1, tpot=0.02 * 1.2 / 1.4)
    _, actions = run(start, [marginal] * 4)
    assert actions == []
    state, actions = run(start, [marginal] * 60)  # 15 minutes, within the trial's deadline
    assert actions == ["kill_switch_released"]
    assert state.kill_switch.evidence is None  # released: the judgement ended


def test_a_trial_is_judged_only_once_every_critical_class_is_judged_on_the_canary() -> None:
    start = trial_without_floors()
    paying = observe(0.8, 0.8, tpot=0.008)
    thin_code = replace(
        paying,
        classes={**paying.classes, "code": window(0.8, requests=5, mean_tpot_seconds=0.008)},
    )
    # code, critical, shows five requests a window: too few to judge, so the trial waits
    # however well chat pays; its evidence adds a quarter of a window a tick, so code is judged
    # once twenty have served and the trial is released
    state, actions = run(start, [thin_code] * 8)
    assert actions == [] and state.kill_switch.evidence is not None
    assert state.kill_switch.evidence.judged["code"]["requests"] < 20
    _, actions = run(start, [thin_code] * 14)
    assert actions == ["kill_switch_released"]
    # a canary bad on the classes it could judge waits for the critical one: the canary's
    # share of a class's traffic is thin, and the speedup over some classes is not the fleet's
    collapsed_chat = replace(
        thin_code, classes={**thin_code.classes, "chat": window(0.02, mean_tpot_seconds=0.03)}
    )
    state, actions = run(start, [collapsed_chat] * 4)
    assert actions == [] and state.kill_switch.state == "trial"
    judged = replace(
        collapsed_chat,
        classes={**collapsed_chat.classes, "code": window(0.1, mean_tpot_seconds=0.02)},
    )
    state, actions = run(replace(state, now=state.now + timedelta(seconds=15)), [judged])
    assert actions == ["trial_failed"]
    assert (state.kill_switch.reason or "").startswith("Trial failed on the canary: code: ")
    # a critical class shown short fails the trial at once, whatever the others show
    short = window(0.01, mean_tpot_seconds=0.03)  # 0.67x measured
    _, actions = run(start, [replace(paying, classes={**paying.classes, "code": short})])
    assert actions == ["trial_failed"]


def quiet_trial(deadline: int) -> tuple[Situation, Observation]:
    """A trial whose canary shows one request of each class a window, marginal: its evidence
    grows but shows neither way; and that window."""
    quiet = replace(
        policy(trialDeadlineSeconds=deadline), classes=trial_without_floors().policy.classes
    )
    start = replace(trial_without_floors(), policy=quiet)
    marginal = observe(0.1, 0.1, tpot=0.02 / 1.05)  # over minSpeedup, under 1.1
    few = replace(
        marginal, classes={n: replace(w, requests=20.0) for n, w in marginal.classes.items()}
    )
    return start, few


def test_a_quiet_trial_ends_at_its_deadline_failed_inconclusive_its_backoff_not_doubled() -> None:
    """One request of each class a window on the canary, marginal: its evidence grows but shows
    neither; at trialDeadlineSeconds the trial fails inconclusive, named TrialDeadline in its
    decision and alert, and the next one waits the cooldown it waited before."""
    start, few = quiet_trial(deadline=300)
    start = replace(start, kill_switch=start.kill_switch.model_copy(update={"failed_trials": 2}))
    state, actions = run(start, [few] * 20)  # 285 s
    assert actions == [] and state.kill_switch.trial and state.kill_switch.evidence
    pending = state.kill_switch.evidence.pending  # what status says it still needs
    assert pending[0].startswith("traffic-weighted speedup 1.05 (needs 1.10): lower bound ")
    assert state.kill_switch.evidence.deadline == (T0 + timedelta(seconds=300)).isoformat()
    state, actions = run(replace(state, now=T0 + timedelta(seconds=300)), [few])
    assert actions == ["trial_failed"]
    switch = state.kill_switch
    assert switch.state == "engaged" and switch.failed_trials == 2  # not doubled again
    assert switch.next_trial_after == (T0 + timedelta(seconds=300 + 60 * 4)).isoformat()
    assert switch.reason.startswith("Trial ended at its deadline (300 s) undecided")
    decision = decide(
        replace(start, observation=FLEET_WITHOUT, canary=None, now=T0 + timedelta(seconds=300))
    )
    # a canary that never served (no window at all) ends at the deadline too
    [ended] = decision.actions
    assert (ended.action, ended.reason) == ("trial_failed", "TrialDeadline")
    assert ended.evidence["deadline"] is True and ended.evidence["evidenceSeconds"] == 0


def test_the_next_trial_adds_to_the_evidence_of_one_that_ended_undecided() -> None:
    """A quiet canary needs more than one trial's deadline to show what a release needs: the
    next trial of the same revision counts on from what the last one saw, with a deadline of its
    own; a trial of another revision starts from nothing."""
    start, few = quiet_trial(deadline=300)
    state, _ = run(start, [few] * 20)
    state, actions = run(replace(state, now=T0 + timedelta(seconds=300)), [few])
    assert actions == ["trial_failed"] and state.kill_switch.evidence is not None
    counted = state.kill_switch.evidence.seconds
    requests = state.kill_switch.evidence.judged["code"]["requests"]
    due = datetime.fromisoformat(state.kill_switch.next_trial_after or "")
    state, actions = run(replace(state, now=due), [FLEET_WITHOUT, few, few])
    assert actions == ["trial_started"] and state.kill_switch.evidence is not None
    grown = state.kill_switch.evidence
    assert grown.seconds == pytest.approx(counted + 60 + 15)  # a whole first window, a quarter
    assert grown.judged["code"]["requests"] == pytest.approx(requests + 20 + 5)
    assert grown.deadline == (due + timedelta(seconds=300)).isoformat()
    # another revision serves by the next trial: what the last one saw is not its evidence
    state, _ = run(replace(state, now=due + timedelta(seconds=45)), [few] * 18)  # to due + 300
    assert state.kill_switch.state == "engaged" and state.kill_switch.evidence is not None
    later = datetime.fromisoformat(state.kill_switch.next_trial_after or "")
    newer = state.revision.model_copy(update={"number": 2})
    state, actions = run(replace(state, now=later, revision=newer), [FLEET_WITHOUT])
    assert actions == ["trial_started"] and state.kill_switch.evidence is None


def blind_for(state: Situation, ticks: int) -> tuple[Situation, list[str]]:
    """Ticks every 15 s after `state.now` with no data at all (Prometheus down)."""
    actions = []
    for _ in range(ticks):
        now = state.now + timedelta(seconds=15)
        decision = decide(replace(state, observation=None, canary=None, now=now))
        actions += [a.action for a in decision.actions]
        state = replace(state, guard=decision.guard, kill_switch=decision.kill_switch, now=now)
    return state, actions


def test_a_trial_deadline_that_passes_while_the_guard_is_blind_moves_back_by_what_it_missed() -> (
    None
):
    """The trial counts its canary for 60 s, then the guard has no data for 315 s (blind): its
    300 s deadline passes meanwhile, and nothing ends it. Back, the deadline moves back by the
    255 s no window covered (the silence less the window the first tick back reads) and the
    trial ends there, inconclusive, having had the 300 s of serving its deadline gives it."""
    start, few = quiet_trial(deadline=300)
    state, actions = run(start, [few] * 5)  # T0 to T0 + 60
    state, blind = blind_for(state, 21)  # to T0 + 375
    assert actions == [] and blind == ["metrics_blind"] and state.kill_switch.trial
    state, actions = run(replace(state, now=T0 + timedelta(seconds=375)), [few] * 12)
    assert actions == ["metrics_restored"] and state.kill_switch.evidence
    assert state.kill_switch.evidence.deadline == (T0 + timedelta(seconds=555)).isoformat()
    _, actions = run(replace(state, now=T0 + timedelta(seconds=555)), [few])
    assert actions == ["trial_failed"]


def test_a_trial_is_judged_on_its_canary_alone() -> None:
    trial = KillSwitchStatus(state="trial", source="guard")
    collapsed = observe(0.1, 0.1)
    # the fleet runs without speculation; until the canary has served it is not judged at all
    waiting = decide(situation(FLEET_WITHOUT, kill_switch=trial, guard=GuardStatus()))
    assert waiting.actions == [] and waiting.kill_switch.state == "trial"
    judged = decide(replace(situation(FLEET_WITHOUT, kill_switch=trial), canary=collapsed))
    assert [a.action for a in judged.actions] == ["trial_failed"]
    assert judged.acceptance == "0.10"  # status shows the canary's window, what was judged
    # a canary is one pod: its requests in flight are per replica as they are
    busy = {n: replace(w, request_seconds=600.0) for n, w in collapsed.classes.items()}
    heavy = decide(
        replace(
            situation(FLEET_WITHOUT, kill_switch=trial), canary=replace(collapsed, classes=busy)
        )
    )
    assert heavy.evaluation is not None and heavy.evaluation.in_flight == pytest.approx(20.0)


def test_no_data_is_inconclusive_then_blind_then_restored() -> None:
    start = situation(None, guard=GuardStatus(consecutive_bad=2, last_data=T0.isoformat()))
    state, actions = run(start, [None] * 10)  # 135 s of nothing; blindAfterSeconds 120
    assert actions == ["metrics_blind"]
    assert state.guard.blind and state.guard.consecutive_bad == 2
    assert state.kill_switch.state == "released"
    _, actions = run(state, [observe(0.8, 0.8)])
    assert actions == ["metrics_restored"]


def test_blind_observation_reason_is_reported() -> None:
    blind = Observation(
        at=T0, window_seconds=60, revision=1, speculation=True, blind="connection refused"
    )
    start = situation(blind, guard=GuardStatus(last_data=(T0 - timedelta(seconds=500)).isoformat()))
    [action] = decide(start).actions
    assert action.action == "metrics_blind" and "connection refused" in action.message


def test_rollout_in_progress_is_inconclusive() -> None:
    bad = observe(0.1, 0.1)
    state, actions = run(situation(bad, settled=False), [bad] * 6)
    assert actions == [] and state.guard.consecutive_bad == 0


def on_probation(**changes: Any) -> Situation:
    return situation(
        None, revision=RevisionRecord(number=2, hash="b" * 10, verdict="probation"), **changes
    )


def test_bad_tool_calls_on_probation_roll_back() -> None:
    broken = observe(0.8, 0.8, tool_calls_valid=70.0, tool_calls_invalid=30.0)
    state, actions = run(on_probation(), [broken] * 3)
    assert actions == ["rolled_back"]
    assert state.revision.verdict == "bad"


def quiet_window(**chat: Any) -> Observation:
    """Four requests of each class a window, tool calls valid unless `chat` says otherwise."""
    valid = {"tool_calls_valid": 4.0, "tool_calls_invalid": 0.0} | chat
    return replace(
        observe(0.8, 0.8),
        classes={"code": window(0.8, requests=4.0), "chat": window(0.8, requests=4.0, **valid)},
    )


def test_a_quiet_revision_is_judged_on_its_evidence_not_on_windows_it_never_fills() -> None:
    """Four requests a window never make one conclusive (twenty needed); the probation's
    evidence adds a quarter window a tick: a revision breaking half its tool calls is rolled back
    on it, a good one is promoted once every signal is shown within its limits."""
    broken = quiet_window(tool_calls_valid=2.0, tool_calls_invalid=2.0)
    state, actions = run(on_probation(), [broken] * 120)
    assert actions == ["rolled_back"]
    fine = quiet_window()
    state, actions = run(on_probation(), [fine] * 240)  # an hour
    assert actions == ["revision_promoted"]
    assert state.guard.probation_evidence is not None
    assert state.guard.probation_evidence.judged["chat"]["requests"] > 20


def test_a_revision_its_probation_never_judges_is_kept_unproven_at_the_deadline() -> None:
    """Two requests a window, tool calls 90% valid against a 0.9 floor: never shown under it,
    never shown within it. At probationDeadlineSeconds the revision is kept: verdict `kept`,
    a ProbationDeadline decision and alert, and it is no rollback target."""
    quiet = on_probation(policy=policy(probationDeadlineSeconds=900))
    marginal = quiet_window(tool_calls_valid=3.6, tool_calls_invalid=0.4)
    state, actions = run(quiet, [marginal] * 60)  # 885 s
    assert actions == [] and state.revision.verdict == "probation"
    decision = decide(replace(state, observation=marginal, now=T0 + timedelta(seconds=900)))
    [kept] = decision.actions
    assert (kept.action, kept.reason, decision.verdict) == (
        "revision_kept",
        "ProbationDeadline",
        "kept",
    )
    assert kept.message.startswith("Revision 2 kept unproven: its probation reached its deadline")
    assert kept.evidence["deadline"] is True and kept.evidence["evidenceSeconds"] > 800


def test_quality_is_judged_against_the_last_good_revision_too() -> None:
    slightly_worse = observe(0.8, 0.8, tool_calls_valid=88.0, tool_calls_invalid=12.0)
    baseline = GuardStatus(baseline=QualityBaseline(tool_call_validity=0.99))
    _, actions = run(on_probation(guard=baseline), [slightly_worse] * 3)
    assert actions == ["rolled_back"]
    _, actions = run(on_probation(), [slightly_worse] * 3)  # above the 0.9 floor, no baseline
    assert actions == []


def test_answers_cut_off_over_the_last_good_revisions_roll_back() -> None:
    cut = observe(0.8, 0.8, choices=200.0, truncated=60.0)
    _, actions = run(on_probation(), [cut] * 3)  # no maxTruncationRate, no baseline
    assert actions == []
    baseline = GuardStatus(baseline=QualityBaseline(truncation_rate={"chat": 0.01}))
    state, actions = run(on_probation(guard=baseline), [cut] * 2)
    third = replace(state, observation=cut, now=state.now + timedelta(seconds=30))
    [action] = decide(third).actions
    assert action.action == "rolled_back"
    assert action.evidence["classes"]["chat"]["truncationRate"] == 0.3
    assert action.evidence["breaches"] == ["chat: truncationRate 0.300 > 0.030 (n=200)"]


def test_truncation_within_the_margin_or_on_too_few_choices_passes_probation() -> None:
    baseline = GuardStatus(baseline=QualityBaseline(truncation_rate={"chat": 0.01}))
    within = observe(0.8, 0.8, choices=200.0, truncated=5.0)
    few = observe(0.8, 0.8, choices=15.0, truncated=10.0)
    for window in (within, few):
        _, actions = run(on_probation(guard=baseline), [window] * 3)
        assert actions == []


def test_truncation_over_the_slo_rolls_back_without_a_baseline() -> None:
    classes = [*FLOORS[:1], {"name": "chat", "slo": {"maxTruncationRate": 0.05}}]
    cut = observe(0.8, 0.8, choices=200.0, truncated=24.0)
    _, actions = run(on_probation(policy=policy(classes=classes)), [cut] * 3)
    assert actions == ["rolled_back"]


def test_quality_evidence_says_how_many_checks_were_left_out_and_why() -> None:
    # Checks against schemas a sane validator cannot check are no samples: hundreds of them
    # beside 100 valid calls move nothing.
    left_out = {"remote_ref": 40.0, "unsatisfiable": 460.0}
    crafted = observe(
        0.8, 0.8, tool_calls_valid=100.0, tool_calls_invalid=0.0, tool_calls_unjudged=left_out
    )
    _, actions = run(on_probation(), [crafted] * 3)
    assert actions == []
    broken = replace(crafted, classes={**crafted.classes})
    broken.classes["chat"] = replace(
        crafted.classes["chat"], tool_calls_valid=70.0, tool_calls_invalid=30.0
    )
    state, actions = run(on_probation(), [broken] * 2)
    assert actions == []
    third = replace(state, observation=broken, now=state.now + timedelta(seconds=30))
    [action] = decide(third).actions
    assert action.action == "rolled_back"
    chat = action.evidence["classes"]["chat"]
    assert chat["toolCallValidity"] == 0.7
    assert chat["toolCallsUnjudged"] == {"remote_ref": 40.0, "unsatisfiable": 460.0}
    assert "structuredOutputsUnjudged" not in chat
    assert any("n=100, 500 unjudged" in b for b in action.evidence["breaches"])


def test_without_a_good_revision_a_quality_breach_only_alerts() -> None:
    broken = observe(0.8, 0.8, tool_calls_valid=50.0, tool_calls_invalid=50.0)
    state, actions = run(on_probation(has_last_good=False), [broken] * 3)
    assert actions == ["quality_breach"] and state.revision.verdict == "probation"


def test_probation_needs_evidence_not_just_time() -> None:
    thin = Observation(
        at=T0,
        window_seconds=60,
        revision=2,
        speculation=True,
        classes={"code": window(0.8, requests=3), "chat": window(0.8, requests=3)},
    )
    state, actions = run(on_probation(policy=policy(probationSeconds=60)), [thin] * 20)
    assert actions == [] and state.revision.verdict == "probation"


def test_a_revision_that_keeps_breaching_is_never_promoted() -> None:
    broken = observe(0.8, 0.8, tool_calls_valid=50.0, tool_calls_invalid=50.0)
    start = on_probation(has_last_good=False, policy=policy(probationSeconds=60))
    state, actions = run(start, [broken] * 12)
    assert "revision_promoted" not in actions and actions.count("quality_breach") == 4
    assert state.revision.verdict == "probation"


def test_probation_passes_and_records_the_baseline() -> None:
    fine = observe(0.8, 0.8, tool_calls_valid=99.0, tool_calls_invalid=1.0)
    state, actions = run(on_probation(policy=policy(probationSeconds=60)), [fine] * 6)
    assert actions == ["revision_promoted"]
    assert state.revision.verdict == "good"
    assert state.guard.baseline and state.guard.baseline.tool_call_validity == 0.99
    assert state.guard.baseline.truncation_rate == {}  # no finish reasons read


def test_the_baseline_keeps_each_class_truncation_rate_on_enough_choices() -> None:
    fine = observe(0.8, 0.8, choices=200.0, truncated=4.0)
    fine.classes["code"] = replace(fine.classes["code"], choices=10.0, truncated=5.0)
    state, _ = run(on_probation(policy=policy(probationSeconds=60)), [fine] * 6)
    assert state.guard.baseline and state.guard.baseline.truncation_rate == {"chat": 0.02}


def test_overrides_alert_but_never_act() -> None:
    bad = observe(0.1, 0.1)
    state, actions = run(situation(bad, policy=policy(override="annotation")), [bad] * 3)
    assert actions == ["alert"]
    assert state.kill_switch.state == "released"


def test_dry_run_decides_and_records_but_does_not_act() -> None:
    bad = observe(0.1, 0.1)
    start = situation(bad, policy=policy(dryRun=True))
    decision = decide(replace(start, guard=GuardStatus(consecutive_bad=2)))
    [action] = decision.actions
    assert action.action == "kill_switch_engaged" and action.dry_run and not action.acts
    assert "dry run" in action.message
    assert decision.kill_switch.state == "released"


def test_too_many_actions_latch_flapping() -> None:
    recent = [(T0 - timedelta(minutes=m)).isoformat() for m in range(1, 7)]
    bad = observe(0.1, 0.1)
    decision = decide(situation(bad, guard=GuardStatus(consecutive_bad=2, action_times=recent)))
    assert [a.action for a in decision.actions] == ["kill_switch_engaged", "flapping"]
    assert decision.guard.flapping and decision.kill_switch.state == "engaged"
    off = observe(0.8, 0.8, speculation=False)
    later = replace(
        situation(off),
        guard=decision.guard,
        kill_switch=decision.kill_switch.model_copy(update={"next_trial_after": T0.isoformat()}),
        now=T0 + timedelta(hours=2),
    )
    assert not decide(later).actions  # latched: no trial


def test_decide_is_deterministic() -> None:
    bad = observe(0.1, 0.1)
    start = situation(bad, guard=GuardStatus(consecutive_bad=2))
    assert decide(start) == decide(start)


def test_status_classes_and_acceptance_summary() -> None:
    decision = decide(situation(observe(0.8, 0.6)))
    classes = {c.name: c for c in decision.classes}
    assert classes["code"].acceptance_rate == 0.8 and classes["code"].verdict == "good"
    assert classes["code"].expected_speedup == pytest.approx(
        speedup(1 + 4 * 0.8, 4, 0.05, 0.0), abs=1e-3
    )
    assert decision.acceptance == "0.70"


def test_measured_tpot_expires() -> None:
    obs = observe(0.6, 0.6, tpot=0.03)
    stale = GuardStatus(
        consecutive_bad=2,
        tpot_without_speculation={"code": 0.025, "chat": 0.025},
        tpot_measured_at=(T0 - timedelta(hours=2)).isoformat(),
        tpot_revision=1,
    )
    assert not decide(situation(obs, guard=stale)).actions


def test_a_noisy_dip_in_validity_is_not_a_breach() -> None:
    dip = observe(0.8, 0.8, tool_calls_valid=22.0, tool_calls_invalid=3.0)  # 0.88 of 25, floor 0.9
    _, actions = run(on_probation(), [dip] * 4)
    assert actions == []
    low, high = wilson_interval(22, 25)
    assert low < 0.88 < 0.9 < high


def test_every_call_valid_meets_a_floor_of_one() -> None:
    """The Wilson upper bound of 60 out of 60 rounds to 0.9999999999999999: judged by it alone,
    a perfect window would breach a floor of 1.0."""
    strict = [
        {"name": "code", "critical": True},
        {"name": "chat", "slo": {"minToolCallValidity": 1}},
    ]
    perfect = observe(0.8, 0.8, tool_calls_valid=60.0, tool_calls_invalid=0.0)
    _, actions = run(on_probation(policy=policy(classes=strict)), [perfect] * 4)
    assert actions == []
    assert wilson_interval(60, 60)[1] < 1.0
    one_bad = observe(0.8, 0.8, tool_calls_valid=59.0, tool_calls_invalid=1.0)
    _, actions = run(on_probation(policy=policy(classes=strict)), [one_bad] * 3)
    assert actions == ["rolled_back"]


def test_a_few_errors_are_not_a_breach() -> None:
    flaky = observe(0.8, 0.8, errors=4.0)  # 2% of 200 requests, but only 4 errors
    _, actions = run(on_probation(), [flaky] * 4)
    assert actions == []
    broken = observe(0.8, 0.8, errors=20.0)
    _, actions = run(on_probation(), [broken] * 3)
    assert actions == ["rolled_back"]


def test_scheduled_trials_do_not_count_as_flapping() -> None:
    bad = observe(0.1, 0.1)
    off = observe(0.1, 0.1, speculation=False)
    cycle = [off] * 20 + [bad]
    start = situation(bad, policy=policy(maxActionsPerHour=2, maxCooldownSeconds=300))
    _, actions = run(start, [bad] * 3 + cycle * 3)
    assert "flapping" not in actions
    assert actions.count("trial_failed") == 3


LATENCY = [
    {
        "name": "code",
        "critical": True,
        "slo": {"minAcceptanceRate": 0.5, "maxP95TpotSeconds": 0.05},
    },
    {"name": "chat", "slo": {"minToolCallValidity": 0.9}},
]


def timed(alpha: float, p95_tpot: float, speculation: bool = True) -> Observation:
    """Both classes at acceptance α with this p95 TPOT (code's SLO: 0.05 s)."""
    classes = {name: window(alpha, p95_tpot_seconds=p95_tpot) for name in ("code", "chat")}
    return Observation(
        at=T0, window_seconds=60, revision=2, speculation=speculation, classes=classes
    )


def with_slos(**changes: Any) -> Situation:
    """Revision 2 on probation, revision 1 to roll back to, code's p95 TPOT at most 0.05 s."""
    return on_probation(**{"policy": policy(classes=LATENCY), "rollback_target": 1, **changes})


def nth_decision(start: Situation, observation: Observation, n: int = 3) -> Decision:
    """The decision on the n-th window of the same observation."""
    state, _ = run(start, [observation] * (n - 1))
    return decide(replace(state, observation=observation, now=state.now + timedelta(seconds=15)))


def test_a_slow_revision_on_probation_rolls_back_on_its_latency_slo() -> None:
    slow = timed(0.8, 0.15)  # speculation pays; the revision decodes three times too slowly
    state, actions = run(with_slos(), [slow] * 3)
    assert actions == ["rolled_back"] and state.revision.verdict == "bad"
    assert state.kill_switch.state == "released"
    [action] = nth_decision(with_slos(), slow).actions
    assert "code: p95TpotSeconds 0.150 > 0.050 (n=200)" in action.message
    assert "rolled back to revision 1" in action.message
    assert action.evidence["rollbackTo"] == 1


def test_a_latency_breach_without_a_rollback_target_alerts_and_is_never_promoted() -> None:
    start = with_slos(has_last_good=False, rollback_target=None)
    start = replace(start, policy=policy(classes=LATENCY, probationSeconds=60))
    state, actions = run(start, [timed(0.8, 0.15)] * 12)
    assert actions == ["quality_breach"] * 4 and state.revision.verdict == "probation"


def test_latency_is_judged_against_the_last_good_revision_alike() -> None:
    # 0.04 s meets the 0.05 s SLO but is twice the last good revision's 0.02 s
    slower = timed(0.8, 0.04)
    remembered = LatencyBaseline(p95_tpot_seconds=0.02, requests=180, speculation=True)
    guard = GuardStatus(baseline=QualityBaseline(latency={"code": remembered}))
    _, actions = run(with_slos(guard=guard), [slower] * 3)
    assert actions == ["rolled_back"]
    [breach] = nth_decision(with_slos(guard=guard), slower).actions
    assert "code: p95TpotSeconds 0.040 > 0.030 (n=200; last good 0.020, n=180)" in breach.message
    # measured without speculation, the last good revision's latency is no comparison
    plain = remembered.model_copy(update={"speculation": False})
    guard = GuardStatus(baseline=QualityBaseline(latency={"code": plain}))
    _, actions = run(with_slos(guard=guard), [slower] * 3)
    assert actions == []


def test_a_slowdown_speculation_explains_is_the_kill_switchs() -> None:
    # acceptance 0.02: speedup 1.08 / 1.2 = 0.9, so plain decoding would show 0.9 x 0.052 s,
    # within the SLO: speculation, not the revision, is to blame
    collapsed = timed(0.02, 0.052)
    decision = decide(replace(with_slos(), observation=collapsed))
    assert [a.action for a in decision.actions] == ["kill_switch_engaged"]
    assert decision.guard.quality_bad == 0


def test_a_slowdown_speculation_does_not_explain_rolls_back_and_the_kill_switch_waits() -> None:
    # plain decoding would still show 0.9 x 0.15 s: the revision is to blame
    slow = timed(0.02, 0.15)
    state, actions = run(with_slos(), [slow] * 3)
    assert actions == ["rolled_back"] and state.kill_switch.state == "released"
    [breach] = nth_decision(with_slos(), slow).actions
    assert (
        "code: p95TpotSeconds 0.150 > 0.050 (0.135 without speculation) (n=200)" in breach.message
    )
    # with nothing to roll back to, the kill switch is the only remedy left
    alone = with_slos(has_last_good=False, rollback_target=None)
    assert [a.action for a in decide(replace(alone, observation=slow)).actions] == [
        "kill_switch_engaged"
    ]


def test_probation_records_the_latency_it_passed_with() -> None:
    fine = timed(0.8, 0.02)
    state, actions = run(with_slos(policy=policy(classes=LATENCY, probationSeconds=60)), [fine] * 6)
    assert actions == ["revision_promoted"]
    baseline = state.guard.baseline
    assert baseline and baseline.latency["code"] == LatencyBaseline(
        p95_tpot_seconds=0.02, requests=200, speculation=True
    )


def test_n_good_windows_in_a_row_make_a_revision_served_clean() -> None:
    fine, broken = timed(0.8, 0.02), timed(0.8, 0.15)
    state, _ = run(with_slos(), [fine] * 2)
    assert not decide(replace(state, observation=broken)).served_clean
    assert decide(
        replace(state, observation=fine, now=state.now + timedelta(seconds=15))
    ).served_clean
