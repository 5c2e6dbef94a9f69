"""Canary analysis (`guard.analysis`) and a rollout's steps (`guard.rollout`): the canary against
the control on the same window, per class and signal, inconclusive never bad."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

from specfleet.api.status import KillSwitchStatus, RevisionRecord, RolloutStatus
from specfleet.guard.analysis import analyse
from specfleet.telemetry.model import Observation
from specfleet.tick import rollouts
from test_guard import T0, decide, observe, policy, situation, window

CHAT = {
    "p95_tpot_seconds": 0.02,
    "tool_calls_valid": 98.0,
    "tool_calls_invalid": 2.0,
    "choices": 200.0,
    "truncated": 2.0,
}
CONTROL = observe(0.8, 0.8, **CHAT)


def canary(tpot: float = 0.02, **chat: Any) -> Observation:
    """The canary's window: `tpot` is every class's mean TPOT."""
    return replace(observe(0.8, 0.8, tpot=tpot, **(CHAT | chat)), revision=2)


def rollout(**changes: Any) -> RolloutStatus:
    base = RolloutStatus(
        revision=2,
        control=1,
        step=1,
        steps=2,
        pods=1,
        windows=3,
        phase="Progressing",
        started=T0.isoformat(),
        step_since=(T0 - timedelta(minutes=5)).isoformat(),
    )
    return base.model_copy(update=changes)


def test_a_canary_like_its_control_is_good() -> None:
    assert analyse(policy(), canary(), CONTROL).verdict == "good"


def test_a_canary_decoding_2_5x_slower_than_its_control_breaches_decisively() -> None:
    analysis = analyse(policy(), canary(0.05, p95_tpot_seconds=0.05), CONTROL)
    [breach] = analysis.breaches
    assert analysis.verdict == "bad" and analysis.decisive
    assert (breach.klass, breach.signal) == ("chat", "p95TpotSeconds")
    assert (breach.canary, breach.control) == (0.05, 0.02)
    assert (breach.canary_samples, breach.control_samples) == (200, 200)


def spread(observation: Observation, samples: float, tpot: float, cv: float = 0.3) -> Observation:
    """Every class's TPOT over `samples` of its requests that streamed, `cv` of the mean apart,
    as the gateway's sum of squares tells it."""
    squares = samples * tpot * tpot * (1.0 + cv * cv)
    classes = {
        name: replace(w, tpot_samples=samples, tpot_squares=squares)
        for name, w in observation.classes.items()
    }
    return replace(observation, classes=classes)


def test_a_slower_canary_breaches_on_latency_only_once_its_mean_tpot_is_shown_slower() -> None:
    control = spread(CONTROL, 400, 0.02)
    slow = canary(0.05, p95_tpot_seconds=0.05)
    assert analyse(policy(), spread(slow, 20, 0.05), control).verdict != "bad"  # not yet shown
    analysis = analyse(policy(), spread(slow, 40, 0.05), control)
    assert analysis.verdict == "bad"
    assert [(b.klass, b.signal) for b in analysis.breaches] == [("chat", "p95TpotSeconds")]


def test_a_canary_passes_only_once_its_mean_tpot_is_shown_within_the_controls() -> None:
    control = spread(CONTROL, 400, 0.02)
    few = analyse(policy(), spread(canary(), 25, 0.02), control)
    assert few.verdict == "inconclusive"
    assert {(u.klass, u.signal) for u in few.unproven} == {
        ("code", "meanTpotSeconds"),
        ("chat", "meanTpotSeconds"),
    }
    assert "not yet shown within" in few.unproven[0].words()
    assert analyse(policy(), spread(canary(), 60, 0.02), control).verdict == "good"
    # streams that differ twice as much need more of them
    assert analyse(policy(), spread(canary(), 60, 0.02, cv=0.9), control).verdict == "inconclusive"


def test_a_slowdown_within_the_tolerance_is_no_breach() -> None:
    assert analyse(policy(), canary(0.023, p95_tpot_seconds=0.023), CONTROL).verdict == "good"


def test_a_tpot_p95_over_the_controls_with_the_mean_unmoved_is_bucket_noise() -> None:
    # a fresh pod's few slow tokens put its p95 high in the 10-25 ms bucket; its mean is the
    # control's (the local cluster aborted a good revision on 18 ms against 10 ms)
    fast = replace(CONTROL, classes={**CONTROL.classes, "chat": window(0.8, p95_tpot_seconds=0.01)})
    assert analyse(policy(), canary(p95_tpot_seconds=0.018), fast).verdict == "good"
    assert analyse(policy(), canary(0.021, p95_tpot_seconds=0.018), fast).verdict == "good"
    assert analyse(policy(), canary(0.03, p95_tpot_seconds=0.018), fast).verdict == "bad"


def test_two_small_latencies_far_apart_in_ratio_but_not_in_seconds_are_no_breach() -> None:
    fast = replace(CONTROL, classes={**CONTROL.classes, "chat": window(0.8, p95_ttft_seconds=0.03)})
    assert analyse(policy(), canary(p95_ttft_seconds=0.068), fast).verdict == "good"
    assert analyse(policy(), canary(p95_ttft_seconds=0.2), fast).decisive


def test_over_the_slo_breaches_only_where_the_control_meets_it() -> None:
    classes = [
        {"name": "code", "critical": True},
        {"name": "chat", "slo": {"maxP95TtftSeconds": 1}},
    ]
    slow = canary(p95_ttft_seconds=1.1)
    within = replace(
        CONTROL, classes={**CONTROL.classes, "chat": window(0.8, p95_ttft_seconds=1.0)}
    )
    over = replace(CONTROL, classes={**CONTROL.classes, "chat": window(0.8, p95_ttft_seconds=1.05)})
    [breach] = analyse(policy(classes=classes), slow, within).breaches
    assert breach.signal == "p95TtftSeconds" and breach.limit == 1 and not breach.decisive
    assert analyse(policy(classes=classes), slow, over).verdict == "good"


def test_broken_tool_calls_breach_against_the_control() -> None:
    analysis = analyse(policy(), canary(tool_calls_valid=70.0, tool_calls_invalid=30.0), CONTROL)
    [breach] = analysis.breaches
    assert (breach.klass, breach.signal, breach.canary) == ("chat", "toolCallValidity", 0.7)
    assert breach.control == 0.98 and breach.control_samples == 100
    assert "vs control 0.980" in breach.words()


def test_a_few_invalid_tool_calls_are_noise_not_a_breach_nor_yet_proof() -> None:
    """Two invalid of 25 is no breach; nor is it shown within the limit: the step waits for more
    evidence (the burden of proof is the same both ways), and with enough it is good."""
    few = canary(tool_calls_valid=23.0, tool_calls_invalid=2.0)
    analysis = analyse(policy(), few, CONTROL)
    assert analysis.verdict == "inconclusive" and not analysis.breaches
    [unproven] = analysis.unproven
    assert (unproven.klass, unproven.signal) == ("chat", "toolCallValidity")
    assert unproven.bound < unproven.needed
    assert "toolCallValidity 0.920 on the canary, not yet shown within" in unproven.words()
    more = canary(tool_calls_valid=490.0, tool_calls_invalid=10.0)
    assert analyse(policy(), more, CONTROL).verdict == "good"


def test_answers_cut_off_at_max_tokens_breach_against_the_control() -> None:
    analysis = analyse(policy(), canary(truncated=60.0), CONTROL)
    [breach] = analysis.breaches
    assert (breach.klass, breach.signal) == ("chat", "truncationRate")
    assert breach.control is not None
    assert (round(breach.canary, 3), round(breach.control, 3)) == (0.3, 0.01)
    assert breach.control < breach.limit < 0.1 and analysis.decisive
    assert "truncationRate 0.300 on the canary vs control 0.010" in breach.words()


def test_truncation_within_the_margin_or_on_too_few_choices_is_no_breach() -> None:
    assert analyse(policy(), canary(truncated=5.0), CONTROL).verdict == "good"
    assert analyse(policy(), canary(choices=15.0, truncated=10.0), CONTROL).verdict == "good"


def test_truncation_over_the_slo_breaches_only_where_the_control_meets_it() -> None:
    classes = [
        {"name": "code", "critical": True},
        {"name": "chat", "slo": {"maxTruncationRate": 0.05}},
    ]
    cut = canary(truncated=24.0)
    within = replace(
        CONTROL, classes={**CONTROL.classes, "chat": window(0.8, **CHAT | {"truncated": 8.0})}
    )
    over = replace(
        CONTROL, classes={**CONTROL.classes, "chat": window(0.8, **CHAT | {"truncated": 12.0})}
    )
    [breach] = analyse(policy(classes=classes), cut, within).breaches
    assert breach.signal == "truncationRate" and round(breach.limit, 3) == 0.05
    assert analyse(policy(classes=classes), cut, over).verdict == "good"


def test_too_few_requests_on_the_canary_is_inconclusive_never_bad() -> None:
    thin = Observation(T0, 60, 2, True, {"code": window(0.8, requests=5), "chat": window(0.1, 5)})
    assert analyse(policy(), thin, CONTROL) == ("inconclusive", [], ["code", "chat"], [], True)


def test_a_window_is_good_only_once_each_class_the_control_serves_is_judged_on_the_canary() -> None:
    # one canary pod of three sees a third of a small class: too few of its tool calls to judge
    # (the local cluster promoted a revision that broke them, judged on the other classes alone)
    thin_chat = replace(canary(), classes={**canary().classes, "chat": window(0.8, requests=5)})
    assert analyse(policy(), thin_chat, CONTROL) == ("inconclusive", [], ["chat"], [], True)
    # a class nobody sent in the window waits for nothing (code is critical: it always does)
    quiet = replace(CONTROL, classes={"code": CONTROL.classes["code"]})
    assert analyse(policy(), thin_chat, quiet).verdict == "good"


def test_errors_breach_over_twice_the_controls_rate() -> None:
    failing = canary(errors=20.0)
    [breach] = analyse(policy(), failing, CONTROL).breaches
    assert breach.signal == "errorRate" and breach.canary == 0.1


def test_an_acceptance_drop_the_control_does_not_show_breaches() -> None:
    drop = replace(canary(), classes={**canary().classes, "code": window(0.3)})
    signals = {(b.klass, b.signal) for b in analyse(policy(), drop, CONTROL).breaches}
    assert signals == {("code", "acceptanceRate")}


def judged(
    the_rollout: RolloutStatus,
    observed: Observation,
    control: Observation = CONTROL,
    **changes: Any,
) -> Any:
    """The decision's actions and judgement, and the rollout as the judgement leaves it (the
    guard only reads the rollout's status; `tick.rollouts.judged` writes it)."""
    decision = decide(
        situation(
            control,
            canary=observed,
            rollout=the_rollout,
            revision=RevisionRecord(number=1, hash="aaaaaaaaaa", verdict="good"),
            **changes,
        )
    )
    after = rollouts.judged(the_rollout, decision.rollout_step)
    return SimpleNamespace(actions=decision.actions, step=decision.rollout_step, rollout=after)


def test_one_decisive_window_aborts_with_the_evidence() -> None:
    decision = judged(rollout(), canary(0.05, p95_tpot_seconds=0.05))
    [action] = decision.actions
    assert action.action == "rollout_aborted" and action.acts
    assert decision.rollout.phase == "Aborted"
    [breach] = action.evidence["breaches"]
    assert breach["class"] == "chat" and breach["signal"] == "p95TpotSeconds"
    assert (breach["canary"], breach["control"]) == (0.05, 0.02)
    assert "chat p95TpotSeconds" in decision.rollout.message


def test_an_abort_names_the_breach_that_decided_it_first() -> None:
    """Seen on the local cluster: a marginally slower canary that broke tool calls was aborted
    on the tool calls, but its status (and the condition, shortened) named the latency first."""
    slow_and_broken = canary(
        0.03, p95_tpot_seconds=0.03, tool_calls_valid=50.0, tool_calls_invalid=50.0
    )
    decision = judged(rollout(), slow_and_broken)
    [action] = decision.actions
    assert [b["signal"] for b in action.evidence["breaches"]] == [
        "p95TpotSeconds",
        "toolCallValidity",
    ]
    assert decision.rollout.message.startswith("chat toolCallValidity: ")
    assert "after 1 decisive window: chat: toolCallValidity" in decision.rollout.message


def test_a_marginal_breach_aborts_after_n_windows_in_a_row() -> None:
    marginal = canary(0.03, p95_tpot_seconds=0.03)
    decision = judged(rollout(), marginal)
    assert decision.actions == [] and decision.rollout.bad_windows == 1
    decision = judged(rollout(bad_windows=2), marginal)
    assert [a.action for a in decision.actions] == ["rollout_aborted"]


def test_a_step_passes_after_its_good_windows_and_the_last_promotes() -> None:
    decision = judged(rollout(good_windows=2), canary())
    assert [a.action for a in decision.actions] == ["rollout_step_passed"]
    assert decision.rollout.step == 2 and decision.rollout.step_since is None
    decision = judged(rollout(step=2, good_windows=2), canary())
    assert [a.action for a in decision.actions] == ["rollout_promoted"]
    assert decision.rollout.phase == "Promoted"


def test_a_step_lasts_at_least_a_guard_window() -> None:
    fresh = rollout(good_windows=5, step_since=(T0 - timedelta(seconds=30)).isoformat())
    assert judged(fresh, canary()).actions == []


def test_inconclusive_windows_count_neither_way() -> None:
    thin = Observation(T0, 60, 2, True, {"code": window(0.8, requests=5)})
    decision = judged(rollout(good_windows=2, bad_windows=0), thin)
    assert decision.actions == [] and decision.rollout.good_windows == 2
    assert decision.rollout.last_analysis.verdict == "inconclusive"


def test_a_dry_run_says_it_would_abort_and_aborts_nothing() -> None:
    dry = policy(dryRun=True)
    decision = judged(rollout(), canary(0.05, p95_tpot_seconds=0.05), policy=dry)
    [action] = decision.actions
    assert action.dry_run and decision.rollout.phase == "Progressing"
    assert decision.step.ended is None and decision.rollout.bad_windows == 1  # counted, no more


def test_a_trial_waits_for_the_rollout() -> None:
    engaged = {"state": "engaged", "source": "guard", "next_trial_after": T0.isoformat()}
    decision = judged(
        rollout(),
        canary(),
        observe(0.8, 0.8, speculation=False),
        kill_switch=KillSwitchStatus(**engaged),
        speculation=False,
    )
    assert "trial_started" not in [a.action for a in decision.actions]
    without = decide(
        situation(
            observe(0.8, 0.8, speculation=False),
            kill_switch=KillSwitchStatus(**engaged),
            speculation=False,
        )
    )
    assert [a.action for a in without.actions] == ["trial_started"]


def test_a_fresh_canary_warms_up_its_answers_judged_its_latency_not() -> None:
    fresh = rollout(step_since=(T0 - timedelta(seconds=90)).isoformat())  # under two windows
    slow = canary(0.03, p95_tpot_seconds=0.03)  # 1.5x: a warm-up's slowness, or a revision's
    decision = judged(fresh, slow)
    assert decision.actions == [] and decision.rollout.bad_windows == 0
    assert decision.rollout.last_analysis.verdict == "inconclusive"
    assert not decision.rollout.last_analysis.latency_judged
    broken = canary(tool_calls_valid=70.0, tool_calls_invalid=30.0)
    assert judged(fresh, broken).rollout.last_analysis.verdict == "bad"
    assert judged(rollout(), slow).rollout.bad_windows == 1  # warm: judged on latency too
    far_slower = judged(fresh, canary(0.05, p95_tpot_seconds=0.05))
    assert far_slower.rollout.phase == "Aborted"  # 2.5x: decisive, warm or not


def ttft(observation: Observation, p95: float, times: list[float]) -> Observation:
    """Every class's requests with these TTFTs (p95 as read from buckets), as the gateway's
    sums tell them."""
    samples, squares = float(len(times)), sum(t * t for t in times)
    mean = sum(times) / samples
    sums = {"mean_ttft_seconds": mean, "ttft_samples": samples, "ttft_squares": squares}
    classes = {
        name: replace(w, p95_ttft_seconds=p95, **sums) for name, w in observation.classes.items()
    }
    return replace(observation, classes=classes)


def test_a_ttft_p95_over_the_controls_counts_only_once_its_mean_is_shown_slower() -> None:
    # CI aborted a good revision on one window's TTFT p95, 0.230 s against 0.079 s: a fresh
    # canary's first prefills were slow, the rest were the control's
    control = ttft(CONTROL, 0.079, [0.05, 0.06] * 100)
    fresh = ttft(canary(), 0.23, [0.05, 0.06] * 85 + [0.5] * 11)
    assert analyse(policy(), fresh, control).verdict != "bad"
    slower = ttft(canary(), 0.23, [0.18, 0.2] * 20)
    analysis = analyse(policy(), slower, control)
    assert analysis.verdict == "bad" and analysis.decisive
    assert {(b.klass, b.signal) for b in analysis.breaches} == {
        ("code", "p95TtftSeconds"),
        ("chat", "p95TtftSeconds"),
    }
