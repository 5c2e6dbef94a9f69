"""The empty-answer rate, end to end: the gateway counts choices that finished with no content
and no tool call, telemetry reads them into the class's window, and the guard judges their share
against the class's `maxEmptyAnswerRate` and the other side in each of its judgements (a canary
against its control, a revision on probation against the last good one, a class against its
SLO), as an experiment judges an arm against the baseline arm."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any, cast

import pytest
from prometheus_client.parser import text_string_to_metric_families

from specfleet import series
from specfleet.api.status import GuardStatus, QualityBaseline
from specfleet.api.verdict import ArmName
from specfleet.experiment.measure import class_measurement
from specfleet.experiment.verdict import judge as judge_arms
from specfleet.gateway.exchange import Exchange, StreamReader
from specfleet.gateway.metrics import GatewayMetrics, RequestRecord
from specfleet.gateway.stats import StreamTally, summarize_body
from specfleet.guard import decide as decide_every_class
from specfleet.guard.analysis import analyse
from specfleet.signals import EMPTY_ANSWER_RATE
from specfleet.telemetry.model import ClassWindow, GreedyComparison
from specfleet.telemetry.reader import QUERIES
from test_experiment_verdict import PRICE, SLOS, arm, arms, measured
from test_guard import FLOORS, decide, observe, on_probation, policy, run, situation, window
from test_guard_rollout import CHAT

EMPTY = EMPTY_ANSWER_RATE.name
CEILING = [*FLOORS[:1], {"name": "chat", "slo": {"maxEmptyAnswerRate": 0.05}}]


def choice(message: dict[str, Any], reason: str = "stop", index: int = 0) -> dict[str, Any]:
    return {"index": index, "message": {"role": "assistant", **message}, "finish_reason": reason}


# -- the gateway counts them --


def test_a_finished_choice_without_content_or_a_tool_call_is_an_empty_answer() -> None:
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    body = {
        "choices": [
            choice({"content": "hello"}),
            choice({"content": ""}, index=1),
            choice({"content": None, "tool_calls": [call]}, reason="tool_calls", index=2),
            choice({"content": None, "reasoning_content": "hmm"}, reason="length", index=3),
        ]
    }
    assert summarize_body(body).empty_answers() == 2  # the empty one, the thinking alone


def test_a_stream_of_no_content_is_an_empty_answer_one_of_tokens_is_not() -> None:
    def stream(*texts: str) -> StreamTally:
        tally = StreamTally(keep_content=False)
        deltas = [{"role": "assistant", "content": ""}, *({"content": t} for t in texts)]
        for delta in deltas:
            tally.feed({"choices": [{"index": 0, "delta": delta, "finish_reason": None}]})
        tally.feed({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
        return tally

    assert stream().summary.empty_answers() == 1
    assert stream("Hi", " there").summary.empty_answers() == 0


def read(events: list[dict[str, Any]], body: dict[str, Any]) -> RequestRecord:
    """A stream read by the gateway's reader, as the proxy relays it (every event read)."""
    record = RequestRecord("chat", "ok")
    exchange = Exchange(request=cast(Any, None), body=body, record=record, started=0.0)
    reader = StreamReader(exchange, GatewayMetrics())
    for t, event in enumerate(events):
        reader.take([f"data: {json.dumps(event)}\n\n".encode()], float(t))
    reader.finish()
    return record


def event(delta: dict[str, Any], reason: str | None = None) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": reason}]}


def test_the_stream_reader_counts_an_empty_answer_and_none_it_could_not_see() -> None:
    chat = {"messages": [{"role": "user", "content": "hi"}], "stream": True}
    empty = [event({"role": "assistant", "content": ""}), event({}, "stop")]
    assert read(empty, chat).empty_answers == 1
    # a reasoning model's thinking is its first token: the chunks after it are skimmed, so its
    # answer is not seen, and an answer not seen is not known empty
    thinking = [
        event({"reasoning_content": "let me see"}),
        event({"content": "4"}),
        event({}, "stop"),
    ]
    assert read(thinking, chat).empty_answers == 0


def test_the_gateway_exports_empty_answers_per_class() -> None:
    metrics = GatewayMetrics()
    metrics.ensure_classes(["chat", "code"])
    metrics.record(RequestRecord("chat", "ok", finish_reasons=["stop", "stop"], empty_answers=1))
    families = text_string_to_metric_families(metrics.exposition().decode())
    [family] = [f for f in families if f.name == series.EMPTY_ANSWERS]
    counts = {s.labels["class"]: s.value for s in family.samples if s.name.endswith("_total")}
    assert counts == {"chat": 1.0, "code": 0.0}


# -- telemetry reads them --


def test_telemetry_reads_them_into_the_class_window() -> None:
    template, label, _ = QUERIES["empty_answers"]
    assert f"{series.EMPTY_ANSWERS}_total" in template and label is None
    window = ClassWindow(choices=200.0, empty_answers=10.0)
    assert EMPTY_ANSWER_RATE.value(window) == 0.05
    assert EMPTY_ANSWER_RATE.value(ClassWindow(choices=200.0)) is None  # a gateway counting none


# -- a canary against its control --


def canary(empty: float, **changes: Any) -> Any:
    return replace(observe(0.8, 0.8, **(CHAT | {"empty_answers": empty} | changes)), revision=2)


CONTROL = observe(0.8, 0.8, **(CHAT | {"empty_answers": 2.0}))


def test_a_canary_answering_empty_breaches_against_its_control() -> None:
    analysis = analyse(policy(), canary(40.0), CONTROL)
    [breach] = analysis.breaches
    assert (breach.klass, breach.signal) == ("chat", EMPTY)
    assert breach.control is not None
    assert (round(breach.canary, 3), round(breach.control, 3)) == (0.2, 0.01)
    assert f"{EMPTY} 0.200 on the canary vs control 0.010" in breach.words()


def test_a_few_empty_answers_more_than_the_control_are_no_breach() -> None:
    assert analyse(policy(), canary(5.0), CONTROL).verdict == "good"
    assert analyse(policy(), canary(10.0, choices=15.0), CONTROL).verdict == "good"


def test_over_the_ceiling_a_canary_breaches_where_the_control_is_within_it() -> None:
    within = observe(0.8, 0.8, **(CHAT | {"empty_answers": 8.0}))
    over = observe(0.8, 0.8, **(CHAT | {"empty_answers": 12.0}))
    [breach] = analyse(policy(classes=CEILING), canary(24.0), within).breaches
    assert breach.signal == EMPTY and round(breach.limit, 3) == 0.05
    assert analyse(policy(classes=CEILING), canary(24.0), over).verdict == "good"


# -- a revision on probation against the last good one --


@pytest.mark.parametrize(
    ("classes", "last_good", "choices", "empty", "rolled_back"),
    [
        (FLOORS, None, 200.0, 60.0, False),  # no ceiling, no last good rate: nothing to judge
        (FLOORS, 0.01, 200.0, 60.0, True),
        (FLOORS, 0.01, 200.0, 5.0, False),  # within the margin of the last good revision's
        (FLOORS, 0.01, 15.0, 10.0, False),  # too few answers
        (CEILING, None, 200.0, 24.0, True),
    ],
)
def test_probation_judges_empty_answers_against_the_last_good_revision_and_the_ceiling(
    classes: list[dict[str, Any]],
    last_good: float | None,
    choices: float,
    empty: float,
    rolled_back: bool,
) -> None:
    rates = {} if last_good is None else {"chat": last_good}
    guard = GuardStatus(baseline=QualityBaseline(empty_answer_rate=rates))
    answers = observe(0.8, 0.8, choices=choices, empty_answers=empty)
    _, actions = run(on_probation(guard=guard, policy=policy(classes=classes)), [answers] * 3)
    assert actions == (["rolled_back"] if rolled_back else [])


def test_a_rollback_for_empty_answers_says_the_rate_and_its_limit() -> None:
    rates = {"chat": 0.01}
    baseline = QualityBaseline(empty_answer_rate=rates)
    guard = GuardStatus(probation_revision=2, quality_bad=2, baseline=baseline)  # two bad so far
    answers = observe(0.8, 0.8, choices=200.0, empty_answers=60.0)
    [action] = decide(replace(on_probation(guard=guard), observation=answers)).actions
    assert action.action == "rolled_back"
    assert action.evidence["classes"]["chat"][EMPTY] == 0.3
    assert action.evidence["breaches"] == [f"chat: {EMPTY} 0.300 > 0.030 (n=200)"]


def test_the_baseline_keeps_each_class_empty_answer_rate_on_enough_choices() -> None:
    fine = observe(0.8, 0.8, choices=200.0, empty_answers=4.0)
    fine.classes["code"] = replace(fine.classes["code"], choices=10.0, empty_answers=5.0)
    state, actions = run(on_probation(policy=policy(probationSeconds=60)), [fine] * 6)
    assert actions == ["revision_promoted"]
    assert state.guard.baseline and state.guard.baseline.empty_answer_rate == {"chat": 0.02}


# -- a class against its SLO --


def test_a_class_answering_empty_over_its_slo_is_named_and_under_it_is_not() -> None:
    def actions(empty: float) -> list[Any]:
        chat = window(0.7, choices=200.0, empty_answers=empty)
        observation = replace(observe(0.8, 0.8), classes={"code": window(0.8), "chat": chat})
        return decide_every_class(situation(observation, policy=policy(classes=CEILING))).actions

    [breach] = actions(60.0)
    assert (breach.evidence["class"], breach.evidence["signal"]) == ("chat", EMPTY)
    assert (breach.evidence["value"], breach.evidence["limit"]) == (0.3, 0.05)
    assert f"{EMPTY} 0.300 > 0.050 (n=200)" in breach.message
    assert actions(6.0) == []


# -- an experiment's arm against the baseline arm --


def test_an_arm_answering_empty_is_excluded_against_the_baseline() -> None:
    def with_empty(empty: float) -> dict[str, Any]:
        return {"code": measured(greedy=GreedyComparison(200, 200), empty_answers=empty)}

    def verdict(empty: float) -> Any:
        baseline = arm(ArmName.BASELINE, 2.0, **with_empty(5.0))
        quantized = arm(ArmName.QUANTIZED, 3.0, **with_empty(empty))
        return judge_arms(arms(baseline=baseline, quantized=quantized), SLOS, PRICE, 20)

    exclusions = verdict(100.0).exclusions
    assert [(e.arm, e.class_name, e.signal) for e in exclusions] == [("quantized", "code", EMPTY)]
    assert (exclusions[0].value, exclusions[0].baseline) == pytest.approx((0.1, 0.005))
    assert verdict(8.0).exclusions == []
    rows = {row.arm: row for row in verdict(100.0).classes[0].rows}
    assert rows["quantized"].empty_answer_rate == pytest.approx(0.1)
    assert rows["speculative"].empty_answer_rate is None  # its window counted none


def test_an_arms_empty_answers_are_held_to_its_answers() -> None:
    read = ClassWindow(requests=10.2, errors=1.0, empty_answers=9.6)
    assert class_measurement(read, GreedyComparison()).window.empty_answers == 9.0
