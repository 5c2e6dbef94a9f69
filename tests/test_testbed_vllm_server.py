"""The vLLM simulator on loopback, driven by the real OpenAI client."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from openai import AsyncOpenAI
from prometheus_client.parser import text_string_to_metric_families

from specfleet.guard.speedup import decode_steps, load_factor, speedup
from specfleet.scenario import Effects, parse_scenario
from specfleet.scenario.timing import TimingModel
from specfleet_testbed.engine.args import parse_vllm
from specfleet_testbed.engine.server import SimOptions, serve

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
EAGLE3 = json.dumps(
    {
        "method": "eagle3",
        "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
        "num_speculative_tokens": 4,
    }
)
SPEC = ["--speculative-config", EAGLE3, "--per-request-spec-decode-metrics", "summary"]
FAST = 0.0005  # wall seconds per simulated second
FINGERPRINT = r"vllm-0\.33\.0-[0-9a-f]{8}"
WEATHER: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city", "unit"],
        },
    },
}


def scenario(**cls: Any) -> Any:
    profile = {"share": 1.0, "acceptance": 0.7, "output_tokens": 40, **cls}
    return parse_scenario({"duration_s": 60, "traffic_rps": 1, "classes": {"chat": profile}})


def vllm(*extra: str) -> Any:
    return parse_vllm([MODEL, "--served-model-name", "llama", *extra], env={})


def extra(obj: Any) -> dict[str, Any]:
    """The vLLM-only fields the OpenAI client keeps in `model_extra`."""
    return dict(obj.model_extra or {})


def client(url: str, key: str = "none") -> AsyncOpenAI:
    return AsyncOpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)


def metric(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


async def sse(url: str, path: str, body: dict[str, Any]) -> list[Any]:
    async with httpx.AsyncClient() as http:
        r = await http.post(url + path, json=body)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/event-stream")
    events = [
        e.removeprefix("data: ").strip() for e in r.text.split("\n\n") if e.startswith("data: ")
    ]
    return [e if e == "[DONE]" else json.loads(e) for e in events]


MESSAGES: Any = [{"role": "user", "content": "Write a haiku about speculative decoding."}]


async def test_chat_non_streaming_shape_and_usage() -> None:
    async with serve(vllm(*SPEC), SimOptions(time_scale=FAST, scenario=scenario())) as sim:
        resp = await client(sim.url).chat.completions.create(model="llama", messages=MESSAGES)
        async with httpx.AsyncClient() as http:
            raw = (
                await http.post(
                    sim.url + "/v1/chat/completions", json={"model": "llama", "messages": MESSAGES}
                )
            ).json()
    assert resp.choices[0].finish_reason == "stop"
    assert resp.usage is not None and resp.usage.completion_tokens == 40
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + 40
    assert resp.choices[0].message.content and resp.choices[0].message.tool_calls is None
    assert list(raw) == [
        "id",
        "object",
        "created",
        "model",
        "choices",
        "service_tier",
        "system_fingerprint",
        "usage",
        "prompt_logprobs",
        "prompt_token_ids",
        "prompt_text",
        "kv_transfer_params",
        "ec_transfer_params",
        "metrics",
    ]
    assert re.fullmatch(r"chatcmpl-[0-9a-f]{16}", raw["id"]) and raw["object"] == "chat.completion"
    assert re.fullmatch(FINGERPRINT, raw["system_fingerprint"])
    assert raw["model"] == "llama"
    choice = raw["choices"][0]
    assert list(choice) == [
        "index",
        "message",
        "logprobs",
        "finish_reason",
        "stop_reason",
        "token_ids",
        "routed_experts",
    ]
    assert list(choice["message"]) == [
        "role",
        "content",
        "refusal",
        "annotations",
        "audio",
        "function_call",
        "reasoning",
    ]
    assert list(raw["usage"]) == [
        "prompt_tokens",
        "total_tokens",
        "completion_tokens",
        "prompt_tokens_details",
        "completion_tokens_details",
    ]
    spec = raw["metrics"]["speculative_decoding"]
    assert raw["metrics"]["time_to_first_token_ms"] is None  # --enable-per-request-metrics is off
    assert spec["num_spec_tokens"] == 4 and len(spec["acceptance_histogram"]) == 5
    assert (
        spec["mean_acceptance_length"]
        == 1 + spec["num_accepted_draft_tokens"] / spec["num_spec_steps"]
    )
    assert sum(spec["acceptance_histogram"]) == spec["num_spec_steps"]


async def test_chat_streaming_chunks_and_include_usage() -> None:
    body = {"model": "llama", "messages": MESSAGES, "stream": True}
    async with serve(vllm(*SPEC), SimOptions(time_scale=FAST, scenario=scenario())) as sim:
        plain = await sse(sim.url, "/v1/chat/completions", body)
        with_usage = await sse(
            sim.url, "/v1/chat/completions", {**body, "stream_options": {"include_usage": True}}
        )
    assert plain[-1] == "[DONE]"
    first, *rest = plain[:-1]
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert list(first) == [
        "id",
        "object",
        "created",
        "model",
        "choices",
        "prompt_token_ids",
        "prompt_text",
    ]
    assert first["object"] == "chat.completion.chunk"
    assert list(rest[0]["choices"][0]) == [
        "index",
        "delta",
        "logprobs",
        "finish_reason",
        "token_ids",
    ]
    assert rest[-1]["choices"][0]["finish_reason"] == "stop"
    assert "stop_reason" in rest[-1]["choices"][0]
    # the fingerprint rides the last message only: the finish chunk, or the usage chunk after it
    assert re.fullmatch(FINGERPRINT, rest[-1]["system_fingerprint"])
    assert all("system_fingerprint" not in c for c in [first, *rest[:-1], *with_usage[:-2]])
    assert re.fullmatch(FINGERPRINT, with_usage[-2]["system_fingerprint"])
    assert all("usage" not in c and "metrics" not in c for c in plain[:-1])
    assert len({c["id"] for c in plain[:-1]}) == 1
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in rest)
    assert len(text.split()) == 40
    # with include_usage: a last chunk with no choices carries usage and the per-request metrics
    final = with_usage[-2]
    assert final["choices"] == [] and final["usage"]["completion_tokens"] == 40
    assert list(final["usage"]) == ["prompt_tokens", "total_tokens", "completion_tokens"]
    assert final["system_fingerprint"] == rest[-1]["system_fingerprint"]
    assert set(final["metrics"]) == {"speculative_decoding"}  # exclude_none drops the timing nulls
    assert "per_step_accepted" not in final["metrics"]["speculative_decoding"]
    assert all("metrics" not in c for c in with_usage[:-2])


async def test_force_include_usage_and_per_request_timing() -> None:
    args = vllm(*SPEC, "--enable-force-include-usage", "--enable-per-request-metrics")
    async with serve(args, SimOptions(time_scale=FAST, scenario=scenario())) as sim:
        chunks = await sse(
            sim.url,
            "/v1/chat/completions",
            {"model": "llama", "messages": MESSAGES, "stream": True},
        )
        resp = await client(sim.url).chat.completions.create(model="llama", messages=MESSAGES)
    # --enable-force-include-usage: continuous usage on every chunk, then the usage chunk
    assert all("usage" in c for c in chunks[:-1])
    assert chunks[1]["usage"]["completion_tokens"] >= 1
    timing = chunks[-2]["metrics"]
    assert {
        "time_to_first_token_ms",
        "generation_time_ms",
        "queue_time_ms",
        "mean_itl_ms",
        "tokens_per_second",
        "speculative_decoding",
    } <= set(timing)
    assert timing["mean_itl_ms"] > 0 and timing["tokens_per_second"] > 0
    metrics = extra(resp)["metrics"]
    assert metrics["time_to_first_token_ms"] > 0


async def test_per_request_stats_sum_to_the_counters() -> None:
    async with serve(
        vllm(*SPEC), SimOptions(time_scale=FAST, scenario=scenario(output_tokens=60))
    ) as sim:
        oai = client(sim.url)
        totals = {"num_spec_steps": 0, "num_draft_tokens": 0, "num_accepted_draft_tokens": 0}

        async def one(i: int) -> None:
            if i % 2:
                resp = await oai.chat.completions.create(model="llama", messages=MESSAGES)
                spec = extra(resp)["metrics"]["speculative_decoding"]
            else:
                chunks = await sse(
                    sim.url,
                    "/v1/completions",
                    {
                        "model": "llama",
                        "prompt": "hi",
                        "max_tokens": 50,
                        "stream": True,
                        "stream_options": {"include_usage": True},
                    },
                )
                spec = chunks[-2]["metrics"]["speculative_decoding"]
            for key in totals:
                totals[key] += spec[key]

        await asyncio.gather(*(one(i) for i in range(12)))
        async with httpx.AsyncClient() as http:
            text = (await http.get(sim.url + "/metrics")).text
    labels = {"model_name": "llama", "engine": "0"}
    assert metric(text, "vllm:spec_decode_num_drafts_total", **labels) == totals["num_spec_steps"]
    assert (
        metric(text, "vllm:spec_decode_num_draft_tokens_total", **labels)
        == totals["num_draft_tokens"]
    )
    accepted = metric(text, "vllm:spec_decode_num_accepted_tokens_total", **labels)
    assert accepted == totals["num_accepted_draft_tokens"] > 0
    assert metric(text, "vllm:spec_decode_num_accepted_tokens_per_pos_total") == accepted
    assert metric(text, "vllm:request_success_total", finished_reason="stop") == 6
    assert metric(text, "vllm:request_success_total", finished_reason="length") == 6
    assert metric(text, "vllm:time_to_first_token_seconds_count") == 12
    assert metric(text, "vllm:e2e_request_latency_seconds_count") == 12
    assert metric(text, "vllm:generation_tokens_total") == 6 * 60 + 6 * 50
    assert metric(text, "vllm:num_requests_running") == 0
    for name in (
        "vllm:inter_token_latency_seconds_count",
        "vllm:request_time_per_output_token_seconds_count",
        "vllm:prompt_tokens_total",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
    ):
        assert any(
            f.name + "_count" == name or f.name == name or f.name + "_total" == name
            for f in text_string_to_metric_families(text)
        ), name


async def test_no_speculation_no_spec_series_and_no_spec_stats() -> None:
    async with serve(vllm(), SimOptions(time_scale=FAST)) as sim:
        resp = await client(sim.url).chat.completions.create(model="llama", messages=MESSAGES)
        async with httpx.AsyncClient() as http:
            text = (await http.get(sim.url + "/metrics")).text
    assert extra(resp)["metrics"] is None
    assert resp.usage is not None and resp.usage.completion_tokens == 128  # documented default
    assert "vllm:spec_decode" not in text
    assert metric(text, "vllm:request_success_total", finished_reason="stop") == 1


async def test_completions_with_the_openai_client() -> None:
    async with serve(vllm(*SPEC), SimOptions(time_scale=FAST, scenario=scenario())) as sim:
        oai = client(sim.url)
        resp = await oai.completions.create(model="llama", prompt="Once upon a time", max_tokens=10)
        stream = await oai.completions.create(
            model="llama",
            prompt="Once upon a time",
            max_tokens=100,
            stream=True,
            stream_options={"include_usage": True},
        )
        pieces, usage, reasons = [], None, []
        async for chunk in stream:
            if chunk.choices:
                pieces.append(chunk.choices[0].text)
                reasons.append(chunk.choices[0].finish_reason)
            if chunk.usage:
                usage = chunk.usage
    assert resp.object == "text_completion" and resp.id.startswith("cmpl-")
    assert resp.choices[0].finish_reason == "length" and resp.usage is not None
    assert resp.usage.completion_tokens == 10 and resp.usage.prompt_tokens == 4
    assert reasons[-1] == "stop" and reasons[:-1] == [None] * (len(reasons) - 1)
    assert usage is not None and usage.completion_tokens == 40
    assert len("".join(pieces).split()) == 40


async def test_max_tokens_cuts_with_finish_reason_length() -> None:
    async with serve(
        vllm(), SimOptions(time_scale=FAST, scenario=scenario(output_tokens=50))
    ) as sim:
        oai = client(sim.url)
        short = await oai.chat.completions.create(model="llama", messages=MESSAGES, max_tokens=5)
        newer = await oai.chat.completions.create(
            model="llama", messages=MESSAGES, max_completion_tokens=7
        )
        full = await oai.chat.completions.create(model="llama", messages=MESSAGES, max_tokens=500)
    assert (short.choices[0].finish_reason, short.usage.completion_tokens) == ("length", 5)
    assert (newer.choices[0].finish_reason, newer.usage.completion_tokens) == ("length", 7)
    assert (full.choices[0].finish_reason, full.usage.completion_tokens) == ("stop", 50)


async def test_ignore_eos_runs_an_answer_to_its_limit() -> None:
    async with serve(
        vllm(), SimOptions(time_scale=FAST, scenario=scenario(output_tokens=50))
    ) as sim:
        long = await client(sim.url).chat.completions.create(
            model="llama", messages=MESSAGES, max_tokens=300, extra_body={"ignore_eos": True}
        )
    assert (long.choices[0].finish_reason, long.usage.completion_tokens) == ("length", 300)


async def test_tool_calls_valid_stream_and_not() -> None:
    args = vllm("--enable-auto-tool-choice", "--tool-call-parser", "hermes")
    opts = SimOptions(time_scale=FAST, scenario=scenario(tool_call_rate=1.0))
    schema = WEATHER["function"]["parameters"]
    async with serve(args, opts) as sim:
        oai = client(sim.url)
        resp = await oai.chat.completions.create(model="llama", messages=MESSAGES, tools=[WEATHER])
        stream = await oai.chat.completions.create(
            model="llama", messages=MESSAGES, tools=[WEATHER], stream=True
        )
        name, arguments, ids, finish = "", "", set(), None
        async for chunk in stream:
            choice = chunk.choices[0]
            for call in choice.delta.tool_calls or []:
                ids.add(call.id) if call.id else None
                name += (call.function.name or "") if call.function else ""
                arguments += (call.function.arguments or "") if call.function else ""
            finish = choice.finish_reason or finish
    call = resp.choices[0].message.tool_calls[0]
    assert resp.choices[0].finish_reason == "tool_calls"
    assert resp.choices[0].message.content is None
    assert call.type == "function" and call.id.startswith("chatcmpl-tool-")
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), schema)
    assert finish == "tool_calls" and name == "get_weather" and len(ids) == 1
    jsonschema.validate(json.loads(arguments), schema)


async def test_tool_call_validity_knob_and_revision_effects() -> None:
    args = vllm(
        "--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--quantization", "awq"
    )
    data = {
        "duration_s": 60,
        "traffic_rps": 1,
        "classes": {"chat": {"share": 1.0, "acceptance": 0.7, "tool_call_rate": 1.0}},
        "rollouts": [
            {"t": 10, "match_args": ["--quantization awq"], "effects": {"tool_call_validity": 0.0}}
        ],
    }
    schema = WEATHER["function"]["parameters"]
    async with serve(args, SimOptions(time_scale=FAST, scenario=parse_scenario(data))) as sim:
        assert sim.effects().tool_call_validity == 0.0
        oai = client(sim.url)
        for _ in range(6):
            resp = await oai.chat.completions.create(
                model="llama", messages=MESSAGES, tools=[WEATHER]
            )
            arguments = resp.choices[0].message.tool_calls[0].function.arguments
            with pytest.raises((json.JSONDecodeError, jsonschema.ValidationError)):
                jsonschema.validate(json.loads(arguments), schema)
    # the same scenario, a process started without the flag: the good revision
    async with serve(vllm(), SimOptions(time_scale=FAST, scenario=parse_scenario(data))) as sim:
        assert sim.effects().tool_call_validity is None


async def test_tool_choices_need_a_tool_call_parser() -> None:
    """Measured on the real vLLM: "auto" needs --enable-auto-tool-choice and a parser, a named
    or "required" choice a parser; with one, a named choice answers a tool call."""
    named_choice: Any = {"type": "function", "function": {"name": "get_weather"}}
    async with serve(vllm(), SimOptions(time_scale=FAST)) as sim:
        oai = client(sim.url)
        with pytest.raises(openai.BadRequestError) as auto:
            await oai.chat.completions.create(model="llama", messages=MESSAGES, tools=[WEATHER])
        with pytest.raises(openai.BadRequestError) as named_refused:
            await oai.chat.completions.create(
                model="llama", messages=MESSAGES, tools=[WEATHER], tool_choice=named_choice
            )
        with pytest.raises(openai.BadRequestError) as required:
            await oai.chat.completions.create(
                model="llama", messages=MESSAGES, tools=[WEATHER], tool_choice="required"
            )
    async with serve(vllm("--tool-call-parser", "pythonic"), SimOptions(time_scale=FAST)) as sim:
        named = await client(sim.url).chat.completions.create(
            model="llama", messages=MESSAGES, tools=[WEATHER], tool_choice=named_choice
        )
    assert auto.value.body == {
        "message": '"auto" tool choice requires --enable-auto-tool-choice and '
        "--tool-call-parser to be set",
        "type": "BadRequestError",
        "param": None,
        "code": 400,
    }
    assert named_refused.value.body["message"] == (
        'tool_choice=function "get_weather" requires --tool-call-parser to be set'
    )
    assert required.value.body["message"] == (
        'tool_choice="required" requires --tool-call-parser to be set'
    )
    assert named.choices[0].finish_reason == "stop"  # named tool choice: "stop", like vLLM
    assert named.choices[0].message.tool_calls[0].function.name == "get_weather"


async def test_json_response_format() -> None:
    schema = {"type": "object", "properties": {"score": {"type": "integer"}}, "required": ["score"]}
    async with serve(vllm(), SimOptions(time_scale=FAST)) as sim:
        resp = await client(sim.url).chat.completions.create(
            model="llama",
            messages=MESSAGES,
            response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": schema}},
        )
    jsonschema.validate(json.loads(resp.choices[0].message.content), schema)


async def test_errors_like_vllm() -> None:
    async with serve(vllm("--api-key", "s3cret"), SimOptions(time_scale=FAST)) as sim:
        async with httpx.AsyncClient() as http:
            unauth = await http.get(sim.url + "/v1/models")
            health = await http.get(sim.url + "/health")
            version = await http.get(sim.url + "/version")
            bad_json = await http.post(
                sim.url + "/v1/chat/completions",
                content=b"{nope",
                headers={"Authorization": "Bearer s3cret"},
            )
        with pytest.raises(openai.AuthenticationError):
            await client(sim.url, "wrong").models.list()
        good = client(sim.url, "s3cret")
        models = await good.models.list()
        with pytest.raises(openai.NotFoundError) as missing:
            await good.chat.completions.create(model="gpt-4", messages=MESSAGES)
        with pytest.raises(openai.BadRequestError) as options:
            await good.chat.completions.create(
                model="llama", messages=MESSAGES, stream_options={"include_usage": True}
            )
    assert unauth.status_code == 401 and unauth.json() == {"error": "Unauthorized"}
    assert health.status_code == 200 and health.content == b""
    assert version.json() == {"version": "0.33.0"}
    assert bad_json.status_code == 400 and bad_json.json()["error"]["type"] == "BadRequestError"
    card = models.data[0]
    assert card.id == "llama" and card.owned_by == "vllm"
    assert extra(card)["root"] == MODEL and extra(card)["max_model_len"] == 8192
    assert missing.value.body == {
        "message": "The model `gpt-4` does not exist. Valid aliases: llama.",
        "type": "NotFoundError",
        "param": "model",
        "code": 404,
    }
    assert "stream=True" in options.value.body["message"]


@pytest.mark.parametrize("options", [{}, {"continuous_usage_stats": True}])
async def test_stream_options_without_include_usage_get_no_usage_chunk(
    options: dict[str, Any],
) -> None:
    """vLLM's StreamOptions.include_usage defaults to false even when stream_options is sent."""
    body = {"model": "llama", "messages": MESSAGES, "stream": True, "stream_options": options}
    async with serve(vllm(*SPEC), SimOptions(time_scale=FAST, scenario=scenario())) as sim:
        chunks = (await sse(sim.url, "/v1/chat/completions", body))[:-1]
    assert all(c["choices"] and "usage" not in c and "metrics" not in c for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


async def test_request_errors_with_vllms_messages_and_the_load_endpoint() -> None:
    args = vllm("--max-model-len", "2048")
    async with serve(args, SimOptions(time_scale=FAST)) as sim, httpx.AsyncClient() as http:
        base = {"model": "llama", "messages": MESSAGES}
        greedy = await http.post(
            sim.url + "/v1/chat/completions", json={**base, "n": 2, "temperature": 0}
        )
        sampled = await http.post(
            sim.url + "/v1/chat/completions", json={**base, "n": 2, "temperature": 0.7}
        )
        too_long = await http.post(
            sim.url + "/v1/completions", json={"model": "llama", "prompt": "x", "max_tokens": 4096}
        )
        load = await http.get(sim.url + "/load")
    assert greedy.status_code == 400 and greedy.json() == {
        "error": {
            "message": "n must be 1 when using greedy sampling, got 2.",
            "type": "BadRequestError",
            "param": None,
            "code": 400,
        }
    }
    assert sampled.status_code == 200 and len(sampled.json()["choices"]) == 2
    assert too_long.status_code == 400
    assert too_long.json()["error"]["param"] == "max_tokens"
    assert too_long.json()["error"]["message"].startswith(
        "max_tokens=4096 cannot be greater than max_model_len=2048."
    )
    assert load.json() == {"server_load": 0}  # counted only with --enable-server-load-tracking


@pytest.mark.parametrize(("method", "drafts_every_step"), [("ngram", False), ("eagle3", True)])
async def test_prompt_lookup_drafts_only_on_steps_with_a_match(
    method: str, drafts_every_step: bool
) -> None:
    """vLLM's n-gram proposer drafts where the context holds a match: the other decode steps
    make one token and are no verify step (num_spec_steps counts drafting steps only)."""
    conf = {"method": method, "num_speculative_tokens": 4}
    if method == "eagle3":
        conf["model"] = "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"
    args = vllm("--speculative-config", json.dumps(conf), "--per-request-spec-decode-metrics",
                "detailed")  # fmt: skip
    profile = scenario(output_tokens=300, draft_match_rate=0.3)
    async with serve(args, SimOptions(time_scale=FAST, scenario=profile, seed=2)) as sim:
        resp = await client(sim.url).chat.completions.create(model="llama", messages=MESSAGES)
    spec = extra(resp)["metrics"]["speculative_decoding"]
    assert resp.usage is not None
    from_verify_steps = spec["num_spec_steps"] + spec["num_accepted_draft_tokens"]
    no_draft_steps = resp.usage.completion_tokens - 1 - from_verify_steps  # 1: the prefill's
    assert spec["num_spec_steps"] > 0
    if drafts_every_step:
        assert set(spec["per_step_drafted"]) == {4}
        assert no_draft_steps <= 0  # the last step may accept more than the answer needs
    else:  # a 0.3 match rate: most steps draft nothing, and drafts may be shorter than k
        assert no_draft_steps > spec["num_spec_steps"]
        assert set(spec["per_step_drafted"]) <= {1, 2, 3, 4} and min(spec["per_step_drafted"]) < 4


async def test_ngram_tpot_speedup_is_what_the_guard_makes_of_its_counters() -> None:
    """Steps without a draft cost a plain step: the TPOT speedup of n-gram at a 0.3 match rate
    is the guard's model of the request's counters (every decode step counted), not what the
    drafting steps' mean acceptance length E suggests."""
    ngram = json.dumps({"method": "ngram", "num_speculative_tokens": 4})
    profile = scenario(acceptance=0.8, output_tokens=600, draft_match_rate=0.3)

    async def served(*args: str) -> Any:
        opts = SimOptions(time_scale=FAST, scenario=profile, seed=3)
        async with serve(vllm("--enable-per-request-metrics", *args), opts) as sim:
            return await client(sim.url).chat.completions.create(model="llama", messages=MESSAGES)

    plain = extra(await served())["metrics"]
    spec = await served(
        "--speculative-config", ngram, "--per-request-spec-decode-metrics", "summary"
    )
    counts, output = extra(spec)["metrics"]["speculative_decoding"], spec.usage.completion_tokens
    steps = decode_steps(output, counts["num_accepted_draft_tokens"])
    assert steps is not None
    drafts, timing = counts["num_draft_tokens"] / steps, TimingModel()
    model = speedup(output / steps, drafts, timing.cost("ngram"), 0.0)
    model *= load_factor(1, drafts, timing.per_token_compute)
    measured = plain["mean_itl_ms"] / extra(spec)["metrics"]["mean_itl_ms"]
    assert measured == pytest.approx(model, rel=0.1)
    assert counts["mean_acceptance_length"] > 1.5 * measured


async def test_speculation_helps_tpot_at_high_acceptance_and_hurts_at_low() -> None:
    async def tpot(args: Any, alpha: float) -> float:
        opts = SimOptions(time_scale=FAST, scenario=scenario(acceptance=alpha, output_tokens=200))
        async with serve(args, opts) as sim:
            oai = client(sim.url)
            itls = []
            for _ in range(3):
                resp = await oai.chat.completions.create(model="llama", messages=MESSAGES)
                itls.append(extra(resp)["metrics"]["mean_itl_ms"])
        return sum(itls) / len(itls)

    plain = await tpot(vllm("--enable-per-request-metrics"), 0.8)
    high = await tpot(vllm(*SPEC, "--enable-per-request-metrics"), 0.8)
    low = await tpot(vllm(*SPEC, "--enable-per-request-metrics"), 0.1)
    assert high < 0.6 * plain
    assert low > 1.05 * plain


async def test_client_disconnect_stops_generation() -> None:
    opts = SimOptions(time_scale=0.01, scenario=scenario(output_tokens=100_000))
    async with serve(vllm(*SPEC), opts) as sim:
        async with httpx.AsyncClient() as http:
            async with http.stream(
                "POST",
                sim.url + "/v1/chat/completions",
                json={"model": "llama", "messages": MESSAGES, "stream": True},
            ) as r:
                async for line in r.aiter_lines():
                    if "content" in line:
                        break
            for _ in range(200):
                text = (await http.get(sim.url + "/metrics")).text
                if metric(text, "vllm:request_success_total", finished_reason="abort") == 1:
                    break
                await asyncio.sleep(0.01)
        assert metric(text, "vllm:request_success_total", finished_reason="abort") == 1
        assert not sim.engine.busy
        assert metric(text, "vllm:generation_tokens_total") < 100_000


async def test_startup_delay_and_draining() -> None:
    opts = SimOptions(time_scale=0.01, startup_delay=0.3, scenario=scenario(output_tokens=30))
    async with serve(vllm(), opts) as sim, httpx.AsyncClient() as http:
        assert (await http.get(sim.url + "/health")).status_code == 503
        assert (await http.get(sim.url + "/v1/models")).status_code == 503
        await asyncio.sleep(0.35)
        assert (await http.get(sim.url + "/health")).status_code == 200
        request = asyncio.create_task(
            http.post(
                sim.url + "/v1/chat/completions", json={"model": "llama", "messages": MESSAGES}
            )
        )
        await asyncio.sleep(0.02)
        drain = asyncio.create_task(sim.drain(grace=5))
        await asyncio.sleep(0)
        assert (await http.get(sim.url + "/health")).status_code == 503
        response = await request
        await drain
    assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] == 30


async def test_effects_override_slows_decoding() -> None:
    async def itl(effects: Effects | None) -> float:
        opts = SimOptions(time_scale=FAST, scenario=scenario(), effects=effects)
        async with serve(vllm("--enable-per-request-metrics"), opts) as sim:
            resp = await client(sim.url).chat.completions.create(model="llama", messages=MESSAGES)
        return float(extra(resp)["metrics"]["mean_itl_ms"])

    assert await itl(Effects(tpot_factor=2.0)) == pytest.approx(2 * await itl(None), rel=0.01)


async def test_error_rate_effect_answers_500() -> None:
    opts = SimOptions(time_scale=FAST, effects=Effects(error_rate=1.0))
    async with serve(vllm(), opts) as sim:
        with pytest.raises(openai.InternalServerError) as err:
            await client(sim.url).chat.completions.create(model="llama", messages=MESSAGES)
    assert err.value.body == {
        "message": "Internal server error",
        "type": "InternalServerError",
        "param": None,
        "code": 500,
    }


async def test_n_choices_suppress_per_request_metrics() -> None:
    async with serve(vllm(*SPEC), SimOptions(time_scale=FAST, scenario=scenario())) as sim:
        resp = await client(sim.url).chat.completions.create(model="llama", messages=MESSAGES, n=2)
        chunks = await sse(
            sim.url,
            "/v1/chat/completions",
            {"model": "llama", "messages": MESSAGES, "n": 2, "stream": True,
             "stream_options": {"include_usage": True}},
        )  # fmt: skip
    assert [c.index for c in resp.choices] == [0, 1]
    assert resp.usage is not None and resp.usage.completion_tokens == 80
    assert extra(resp)["metrics"] is None  # vLLM: null for n > 1
    finished = [c["choices"][0]["index"] for c in chunks[:-2] if c["choices"][0]["finish_reason"]]
    assert sorted(finished) == [0, 1]
    assert chunks[-2]["usage"]["completion_tokens"] == 80 and "metrics" not in chunks[-2]


async def test_max_num_seqs_queues_requests() -> None:
    args = vllm("--max-num-seqs", "2", "--enable-per-request-metrics")
    async with serve(args, SimOptions(time_scale=FAST, scenario=scenario())) as sim:
        oai = client(sim.url)
        results = await asyncio.gather(
            *(oai.chat.completions.create(model="llama", messages=MESSAGES) for _ in range(6))
        )
    queued = sorted(extra(r)["metrics"]["queue_time_ms"] for r in results)
    assert queued[:2] == [0.0, 0.0] and queued[-1] > 0
