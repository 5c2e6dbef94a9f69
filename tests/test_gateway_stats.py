"""Per-request statistics from engine responses (pure), SSE splitting, and the gateway's
TensorRT-LLM counts in front of the simulator configured as the renderer configures it."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
import yaml
from openai import AsyncOpenAI
from prometheus_client.parser import text_string_to_metric_families

from conftest import specmodel_doc
from specfleet.api import parse_specmodel
from specfleet.api.gateway import Drafting, GatewayConfig
from specfleet.gateway.batch import BatchSpan, InFlight
from specfleet.gateway.exchange import worth_parsing
from specfleet.gateway.server import running
from specfleet.gateway.sse import SseSplitter, data_payload
from specfleet.gateway.stats import (
    SpecCounts,
    StreamTally,
    depths_seen,
    derive_counts,
    spec_counts,
    summarize_body,
    tpot,
)
from specfleet.render import render
from specfleet.scenario import parse_scenario
from specfleet_testbed.engine.args import parse_trtllm
from specfleet_testbed.engine.server import SimOptions, serve

VLLM_SPEC = {
    "mean_acceptance_length": 2.5,
    "draft_acceptance_rate": 0.375,
    "acceptance_histogram": [2, 3, 1, 1, 1],
    "num_spec_steps": 8,
    "num_accepted_draft_tokens": 12,
    "num_draft_tokens": 32,
    "num_spec_tokens": 4,
}


def vllm_body(metrics: Any = None, n: int = 1) -> dict[str, Any]:
    choice = {
        "index": 0,
        "message": {"role": "assistant", "content": '{"a": 1}', "tool_calls": []},
        "finish_reason": "stop",
    }
    return {
        "object": "chat.completion",
        "choices": [dict(choice, index=i) for i in range(n)],
        "usage": {"prompt_tokens": 5, "completion_tokens": 21, "total_tokens": 26},
        "metrics": metrics,
    }


def test_vllm_non_streaming_counts_come_from_the_root_metrics() -> None:
    summary = summarize_body(vllm_body({"speculative_decoding": VLLM_SPEC}))
    assert spec_counts(summary, k=None) == SpecCounts(drafted=32, accepted=12, steps=8)
    assert summary.output_tokens == 21
    assert summary.finish_reasons() == ["stop"]
    assert summary.contents() == ['{"a": 1}']


@pytest.mark.parametrize("metrics", [None, {"speculative_decoding": None}, {"x": 1}])
def test_vllm_without_spec_metrics_counts_nothing(metrics: Any) -> None:
    assert spec_counts(summarize_body(vllm_body(metrics, n=2)), k=4) is None


def vllm_stream() -> list[dict[str, Any]]:
    base = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    return [
        {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
        {**base, "choices": [{"index": 0, "delta": {"content": '{"a"'}}]},
        {
            **base,
            "choices": [{"index": 0, "delta": {"content": ": 1}"}, "finish_reason": "length"}],
        },
        {
            **base,
            "choices": [],
            "usage": {"prompt_tokens": 5, "completion_tokens": 21, "total_tokens": 26},
            "metrics": {"speculative_decoding": VLLM_SPEC},
        },
    ]


def test_vllm_stream_reads_the_usage_chunk_and_marks_content_bearing_chunks() -> None:
    tally = StreamTally(keep_content=True)
    bearing = [tally.feed(chunk) for chunk in vllm_stream()]
    assert bearing == [False, True, True, False]  # the role chunk is not a token
    summary = tally.summary
    assert spec_counts(summary, k=None) == SpecCounts(32, 12, 8)
    assert summary.output_tokens == 21
    assert summary.finish_reasons() == ["length"]
    assert summary.contents() == ['{"a": 1}']


def test_stream_tool_call_deltas_are_joined_per_call() -> None:
    tally = StreamTally(keep_content=False)
    deltas = [
        {"tool_calls": [{"index": 0, "id": "t", "type": "function", "function": {"name": "f"}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": '{"ci'}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": 'ty": "x"}'}}]},
        {"tool_calls": [{"index": 1, "function": {"name": "g", "arguments": "{}"}}]},
    ]
    assert all(tally.feed({"choices": [{"index": 0, "delta": d}]}) for d in deltas)
    calls = tally.summary.tool_calls()
    assert [(c.name, c.arguments) for c in calls] == [("f", '{"city": "x"}'), ("g", "{}")]


@pytest.mark.parametrize(
    "event",
    [
        {"error": {"message": "boom", "code": 500}},  # vLLM
        {"object": "error", "message": "boom", "type": "InternalServerError", "code": 500},
    ],
)
def test_stream_error_event_is_noticed(event: dict[str, Any]) -> None:
    tally = StreamTally(keep_content=False)
    tally.feed(event)
    assert tally.summary.error
    assert summarize_body(event).error


def trt_choice(**extra: Any) -> dict[str, Any]:
    return {"index": 0, "text": "x", "finish_reason": "stop", **extra}


def trt_body(*choices: dict[str, Any], completion_tokens: int = 100) -> dict[str, Any]:
    return {"choices": list(choices), "usage": {"completion_tokens": completion_tokens}}


def test_trtllm_counts_are_derived_from_the_mean_acceptance_length() -> None:
    # 100 tokens in 40 iterations: 1 prefill + 39 verify steps, 60 accepted drafts.
    body = trt_body(trt_choice(avg_decoded_tokens_per_iter=2.5))
    assert spec_counts(summarize_body(body), k=4) == SpecCounts(drafted=156, accepted=60, steps=39)


def test_trtllm_derivation_needs_k_and_a_single_choice() -> None:
    one = trt_body(trt_choice(avg_decoded_tokens_per_iter=2.5))
    two = trt_body(trt_choice(avg_decoded_tokens_per_iter=2.5), trt_choice(index=1))
    assert spec_counts(summarize_body(one), k=None) is None
    assert spec_counts(summarize_body(two), k=4) is None
    assert spec_counts(summarize_body(trt_body(trt_choice())), k=4) is None


@pytest.mark.parametrize(
    ("avg", "tokens", "k", "expected"),
    [
        (1.0, 10, 4, SpecCounts(36, 0, 9)),  # drafting on every step, nothing accepted
        (4.2, 21, 4, SpecCounts(16, 16, 4)),  # everything accepted: 1 + 4 x 5 tokens
        (1.0, 1, 4, SpecCounts(0, 0, 0)),  # a single token: prefill only
        (None, 10, 4, None),
        (0.0, 10, 4, None),
        (5.0, 10, 2, SpecCounts(2, 2, 1)),  # inconsistent with k: accepted capped
        (1.0, 10, 0, SpecCounts(0, 0, 0)),  # not asked to draft: no drafts, no steps
        (2.0, 10, 0, None),  # yet drafts were accepted: the batch estimate was wrong
    ],
)
def test_derive_counts_edges(
    avg: float | None, tokens: int, k: int, expected: SpecCounts | None
) -> None:
    assert derive_counts(avg, tokens, {k}, every_step=True) == expected


@pytest.mark.parametrize("avg", [1.0, 1.5])
def test_steps_of_unknown_depth_count_nothing(avg: float) -> None:
    """The batch crossed a depth boundary, or n-gram drafts only where it finds a match: how
    many tokens were drafted is unknown, and k x steps would read as a collapse."""
    assert derive_counts(avg, 30, {4, 0}, every_step=True) is None
    assert derive_counts(avg, 30, {4}, every_step=False) is None


MAX_CONCURRENCY_8 = Drafting(depthByBatchSize={1: 4, 9: 0})
SCHEDULE = Drafting(depthByBatchSize={1: 4, 5: 2, 17: 4, 33: 0})


@pytest.mark.parametrize(
    ("drafting", "smallest", "largest", "depths"),
    [
        (None, 1, 100, {4}),  # no table: k at every batch size
        (MAX_CONCURRENCY_8, 1, 8, {4}),
        (MAX_CONCURRENCY_8, 8, 9, {4, 0}),
        (MAX_CONCURRENCY_8, 9, 500, {0}),
        (SCHEDULE, 5, 16, {2}),
        (SCHEDULE, 4, 5, {4, 2}),
        (SCHEDULE, 16, 40, {2, 4, 0}),
        (SCHEDULE, 33, 33, {0}),
    ],
)
def test_depths_seen_between_the_smallest_and_largest_batch(
    drafting: Drafting | None, smallest: int, largest: int, depths: set[int]
) -> None:
    span = BatchSpan(smallest)
    span.see(largest)
    assert depths_seen(drafting, 4, span) == depths
    assert depths_seen(drafting, 4, None) == (
        set(drafting.depth_by_batch_size.values()) if drafting else {4}
    )


def test_above_max_concurrency_a_request_counts_no_drafts_below_it_as_before() -> None:
    body = summarize_body(
        trt_body(trt_choice(avg_decoded_tokens_per_iter=1.0), completion_tokens=40)
    )
    crowded, alone = BatchSpan(9), BatchSpan(1)
    crowded.see(12)
    assert spec_counts(body, 4, MAX_CONCURRENCY_8, crowded) == SpecCounts(0, 0, 0)
    assert spec_counts(body, 4, MAX_CONCURRENCY_8, alone) == SpecCounts(156, 0, 39)  # a collapse
    assert spec_counts(body, 4) == SpecCounts(156, 0, 39)  # no table: k on every step


def test_with_the_engine_gate_on_nothing_accepted_reads_as_not_drafted() -> None:
    """Once tripped, TensorRT-LLM's acceptance gate drafts no more until restart."""
    assert derive_counts(1.0, 30, {4}, every_step=True, gated=True) == SpecCounts(0, 0, 0)
    assert derive_counts(2.5, 30, {4}, every_step=True, gated=True) == SpecCounts(44, 18, 11)


def test_in_flight_spans_see_every_batch_size_while_open() -> None:
    flight = InFlight()
    first = flight.enter()
    second, third = flight.enter(), flight.enter()
    flight.leave(second)
    flight.leave(first)
    late = flight.enter()
    assert (first.smallest, first.largest) == (1, 3)
    assert (second.smallest, second.largest) == (2, 3)
    assert (third.smallest, third.largest) == (1, 3)
    assert (late.smallest, late.largest) == (2, 2)
    assert len(flight) == 2


def test_trtllm_stream_keeps_the_last_mean_per_choice() -> None:
    tally = StreamTally(keep_content=False)
    tally.feed(
        {"choices": [{"index": 0, "delta": {"content": "a"}, "avg_decoded_tokens_per_iter": 1.0}]}
    )
    tally.feed(
        {
            "choices": [
                {"index": 0, "delta": {"content": "b"}, "avg_decoded_tokens_per_iter": 2.0,
                 "finish_reason": "stop"}
            ]
        }
    )  # fmt: skip
    tally.feed({"choices": [], "usage": {"completion_tokens": 10}})
    assert spec_counts(tally.summary, k=2) == SpecCounts(drafted=8, accepted=5, steps=4)


def test_completions_text_is_content() -> None:
    tally = StreamTally(keep_content=True)
    assert not tally.feed({"choices": [{"index": 0, "text": "", "finish_reason": None}]})
    assert tally.feed({"choices": [{"index": 0, "text": "[1]", "finish_reason": "stop"}]})
    assert tally.summary.contents() == ["[1]"]


def test_tpot_is_time_after_the_first_token_over_the_remaining_tokens() -> None:
    assert tpot(1.0, 2.0, 11) == pytest.approx(0.1)
    assert tpot(1.0, 1.0, 1) is None
    assert tpot(1.0, 2.0, None) is None


def test_sse_splitter_is_byte_exact_across_arbitrary_cuts() -> None:
    events = [
        b'data: {"a": 1}\n\n',
        b": comment\n\n",
        b'data: {"b": "x\\n"} \n\n',
        b"data: [DONE]\n\n",
    ]
    stream = b"".join(events)
    for cut in range(1, 12):
        splitter = SseSplitter()
        out: list[bytes] = []
        for i in range(0, len(stream), cut):
            out += splitter.feed(stream[i : i + cut])
        assert out == events
        assert splitter.rest == b""


def test_sse_splitter_says_when_a_read_is_whole_events() -> None:
    splitter = SseSplitter()
    assert not splitter.ends_whole(b"data: 1\n\n")  # the separator is not known yet
    splitter.feed(b"data: 1\n\ndata: 2")
    assert not splitter.ends_whole(b"\n\n")  # something was left over
    splitter.feed(b"\n\n")
    assert splitter.ends_whole(b"data: 3\n\ndata: 4\n\n")
    assert not splitter.ends_whole(b"data: 3\n\ndata: 4\n")


def test_sse_splitter_handles_crlf_and_keeps_an_unfinished_tail() -> None:
    splitter = SseSplitter()
    assert splitter.feed(b"data: 1\r\n\r\ndata: 2") == [b"data: 1\r\n\r\n"]
    assert splitter.rest == b"data: 2"


def test_data_payload() -> None:
    assert data_payload(b'data: {"a":1} \n\n') == b'{"a":1}'
    assert data_payload(b"data:[DONE]\n\n") == b"[DONE]"
    assert data_payload(b": keepalive\n\n") is None
    assert data_payload(b"data: a\ndata: b\n\n") is None
    assert json.loads(data_payload(b'data: {"x": 2}\r\n\r\n') or b"") == {"x": 2}


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        (b'{"choices":[{"index":0,"delta":{"content":"x"},"finish_reason":null}]}', False),
        (b'{"choices": [{"index": 0, "delta": {"content": "x"}, "finish_reason": null}]}', False),
        (b'{"choices":[{"delta":{"content":"x"},"avg_decoded_tokens_per_iter":2.0}]}', False),
        (b'{"choices":[{"index":0,"delta":{"content":"\\"usage\\""}}]}', False),
        (b'{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}', True),
        (b'{"choices": [{"finish_reason": "length"}]}', True),
        (b'{"choices":[],"usage":{"completion_tokens":3}}', True),
        (b'{"error":{"message":"x"}}', True),
    ],
)  # fmt: skip
def test_only_chunks_that_can_carry_needed_fields_are_parsed_after_the_first_token(
    payload: bytes, expected: bool
) -> None:
    assert worth_parsing(payload) is expected


# ------------------------------------------------------- the gateway in front of the engine

SCENARIO = parse_scenario(
    {
        "duration_s": 60,
        "traffic_rps": 1,
        "classes": {"chat": {"share": 1.0, "acceptance": 0.7, "output_tokens": 30}},
    }
)


def rendered_trtllm(**speculative: Any) -> tuple[Any, GatewayConfig]:
    """The engine and the gateway as the renderer configures them for TensorRT-LLM."""
    doc = specmodel_doc(engine={"name": "tensorrt-llm"}, speculative=speculative)
    files = {
        name: text
        for m in render(parse_specmodel(doc))
        if m["kind"] == "ConfigMap"
        for name, text in m["data"].items()
    }
    argv = ["trtllm-serve", "org/model", "--backend", "pytorch", "--config", "/c.yaml"]
    engine = parse_trtllm(argv, read_file=lambda _: files["llm_api.yaml"])
    return engine, GatewayConfig.model_validate(yaml.safe_load(files["gateway.yaml"]))


async def gateway_counts(url: str) -> SpecCounts:
    async with httpx.AsyncClient() as http:
        text = (await http.get(url + "/metrics")).text
    total = dict.fromkeys(("drafted", "accepted", "steps"), 0)
    names = {
        "specfleet_spec_draft_tokens_total": "drafted",
        "specfleet_spec_accepted_tokens_total": "accepted",
        "specfleet_spec_steps_total": "steps",
    }
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in names:
                total[names[sample.name]] += int(sample.value)
    return SpecCounts(**total)


async def test_the_gateway_counts_no_drafts_where_the_engine_stopped_drafting() -> None:
    """Above max_concurrency the simulator, like TensorRT-LLM 1.2.1, stops drafting and its
    mean acceptance length falls to about 1: read as k drafts a step, that is a collapse."""
    engine, config = rendered_trtllm(
        method="eagle3", draftModel="d/eagle3", numSpeculativeTokens=3, maxConcurrency=1
    )
    messages: Any = [{"role": "user", "content": "Explain draft acceptance."}]
    async with (
        serve(engine, SimOptions(time_scale=1.0, scenario=SCENARIO)) as sim,
        running(config, sim.url) as gateway,
    ):
        oai = AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key="x", max_retries=0)

        async def ask() -> tuple[float, int]:
            raw = await oai.chat.completions.with_raw_response.create(
                model=config.served_name, messages=messages
            )
            body = json.loads(raw.text)
            avg = body["choices"][0]["avg_decoded_tokens_per_iter"]
            return float(avg), int(body["usage"]["completion_tokens"])

        await ask()
        alone = await gateway_counts(gateway.metrics_url)
        crowded = await asyncio.gather(*(ask() for _ in range(4)))
        after = await gateway_counts(gateway.metrics_url)
    # Alone (batch 1 <= max_concurrency): k drafts on every verify step, as before.
    assert alone.steps > 0 and alone.drafted == 3 * alone.steps
    assert alone.accepted / alone.drafted > 0.3
    # Crowded: read as k drafts a step, the same responses say the drafter collapsed...
    old = [derive_counts(avg, tokens, {3}, every_step=True) for avg, tokens in crowded]
    assert sum(c.accepted for c in old if c) / sum(c.drafted for c in old if c) < 0.15
    # ... but the engine was not asked to draft: nothing is counted as a rejected draft.
    assert after == alone
