"""The gateway in front of the engine simulator, driven by the real OpenAI client.

Identity: two simulators with the same seed get the same request sequence, one directly and
one through the gateway; what the client sees must be the same (ids and timestamps aside).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from openai import AsyncOpenAI
from prometheus_client.parser import text_string_to_metric_families

from specfleet.api.gateway import GatewayConfig
from specfleet.gateway.server import GatewayServer, running
from specfleet.scenario import Effects
from specfleet_testbed.engine.args import EngineConfig, parse_trtllm, parse_vllm
from specfleet_testbed.engine.server import EngineSimulator, SimOptions, serve

FAST = 0.0002  # wall seconds per simulated second
K = 3
EAGLE3 = json.dumps({"method": "eagle3", "model": "d/eagle3", "num_speculative_tokens": K})
TRT_YAML = f"""
speculative_config: {{decoding_type: Eagle, max_draft_len: {K}, speculative_model: d/eagle3}}
return_perf_metrics: true
enable_iter_perf_stats: true
"""
MESSAGES: Any = [{"role": "user", "content": "Explain draft acceptance."}]
WEATHER: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city", "days"],
        },
    },
}
ANSWER_SCHEMA: Any = {
    "type": "json_schema",
    "json_schema": {
        "name": "answer",
        "schema": {
            "type": "object",
            "properties": {"answer": {"type": "string"}, "score": {"type": "integer"}},
            "required": ["answer", "score"],
        },
    },
}


def engine(name: str) -> EngineConfig:
    if name == "vllm":
        spec = ["--speculative-config", EAGLE3, "--per-request-spec-decode-metrics", "summary"]
        tools = ["--enable-auto-tool-choice", "--tool-call-parser", "llama3_json"]
        return parse_vllm(["m", "--served-model-name", "llama", *spec, *tools], env={})
    argv = ["trtllm-serve", "m", "--backend", "pytorch", "--tool_parser", "llama3_json"]
    return parse_trtllm([*argv, "--config", "/c.yaml"], read_file=lambda _: TRT_YAML)


def gateway_config(name: str) -> GatewayConfig:
    return GatewayConfig.model_validate(
        {
            "specmodel": "m",
            "engine": name,
            "servedName": "llama",
            "classes": [
                {"name": "code"},
                {"name": "tools", "match": {"hasTools": True}},
                {"name": "chat"},
            ],
            "defaultClass": "chat",
            "numSpeculativeTokens": K,
        }
    )


def client(url: str) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)


@asynccontextmanager
async def through_gateway(
    name: str, options: SimOptions
) -> AsyncIterator[tuple[EngineSimulator, GatewayServer]]:
    async with (
        serve(engine(name), options) as sim,
        running(gateway_config(name), sim.url) as gateway,
    ):
        yield sim, gateway


def metric(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


async def scrape(url: str) -> str:
    async with httpx.AsyncClient() as http:
        return (await http.get(url + "/metrics")).text


# ------------------------------------------------------------------------------ identity

VOLATILE = re.compile(rb'((?:chatcmpl|cmpl|modelperm)(?:-tool)?-)[0-9a-f]{16,32}|("created":)\d+')


def normalized(raw: bytes) -> bytes:
    return VOLATILE.sub(lambda m: (m.group(1) or m.group(2)) + b"X", raw)


def strip_volatile(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: strip_volatile(v) for k, v in obj.items() if k not in ("id", "created")}
    if isinstance(obj, list):
        return [strip_volatile(v) for v in obj]
    return obj


REQUESTS: list[dict[str, Any]] = [
    {"messages": MESSAGES, "max_tokens": 24},
    {"messages": MESSAGES, "max_tokens": 24, "stream": True},
    {"messages": MESSAGES, "stream": True, "stream_options": {"include_usage": True}},
    {
        "messages": MESSAGES,
        "stream": True,
        "stream_options": {"continuous_usage_stats": True},
        "max_tokens": 8,
    },
    {"messages": MESSAGES, "tools": [WEATHER], "tool_choice": "required", "stream": True},
    {"messages": MESSAGES, "tools": [WEATHER], "tool_choice": "required"},
    {"messages": MESSAGES, "response_format": ANSWER_SCHEMA, "stream": True},
    {"prompt": "def fib(n):", "max_tokens": 16, "stream": True},
    {"prompt": "def fib(n):", "max_tokens": 16},
]


@pytest.mark.parametrize("name", ["vllm", "tensorrt-llm"])
async def test_the_client_sees_exactly_what_the_engine_sends(name: str) -> None:
    options = SimOptions(time_scale=FAST, seed=11)
    async with serve(engine(name), options) as direct, through_gateway(name, options) as (_, gw):
        for body in REQUESTS:
            path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
            body = {"model": "llama", **body}
            async with httpx.AsyncClient() as http:
                a = await http.post(direct.url + path, json=body)
                b = await http.post(gw.url + path, json=body)
            assert (b.status_code, b.headers["content-type"]) == (
                a.status_code,
                a.headers["content-type"],
            )
            assert normalized(b.content) == normalized(a.content), body
        async with httpx.AsyncClient() as http:
            a, b = await http.get(direct.url + "/v1/models"), await http.get(gw.url + "/v1/models")
        assert (b.status_code, normalized(b.content)) == (200, normalized(a.content))


@pytest.mark.parametrize("name", ["vllm", "tensorrt-llm"])
async def test_openai_client_objects_are_identical_direct_and_through_the_gateway(
    name: str,
) -> None:
    options = SimOptions(time_scale=FAST, seed=5)
    async with serve(engine(name), options) as direct, through_gateway(name, options) as (_, gw):
        for url in (direct.url, gw.url):
            oai = client(url)
            plain = await oai.chat.completions.create(model="llama", messages=MESSAGES)
            stream = await oai.chat.completions.create(
                model="llama", messages=MESSAGES, stream=True
            )
            chunks = [chunk.model_dump() async for chunk in stream]
            usage_stream = await oai.completions.create(
                model="llama", prompt="x", stream=True, stream_options={"include_usage": True}
            )
            usage_chunks = [chunk.model_dump() async for chunk in usage_stream]
            seen = strip_volatile([plain.model_dump(), chunks, usage_chunks])
            if url == direct.url:
                expected = seen
        assert seen == expected
        assert all(c["usage"] is None for c in chunks)  # no usage chunk leaked to the client
        assert usage_chunks[-1]["usage"]["completion_tokens"] > 0  # asked for: kept


# ------------------------------------------------------------------------------ counters

ENGINE_COUNTERS = {
    "vllm": (
        "vllm:spec_decode_num_draft_tokens_total",
        "vllm:spec_decode_num_accepted_tokens_total",
        "vllm:generation_tokens_total",
        "/metrics",
    ),
}


async def engine_counts(sim: EngineSimulator, name: str) -> tuple[float, float, float]:
    """Drafted, accepted and generated tokens as the engine counts them. TensorRT-LLM 1.2.1
    has no such Prometheus series: its iteration stats (drained by the read) carry the first
    two."""
    if name == "tensorrt-llm":
        async with httpx.AsyncClient() as http:
            stats = (await http.get(sim.url + "/metrics")).json()
        spec = [s["specDecodingStats"] for s in stats if "specDecodingStats" in s]
        return sum(s["numDraftTokens"] for s in spec), sum(s["numAcceptedTokens"] for s in spec), 0
    drafted, accepted, generated, path = ENGINE_COUNTERS[name]
    async with httpx.AsyncClient() as http:
        text = (await http.get(sim.url + path)).text
    return (
        metric(text, drafted),
        metric(text, accepted),
        metric(text, generated) if generated else 0.0,
    )


async def class_batch(oai: AsyncOpenAI, cls: str) -> int:
    """Six requests of a class (streaming with and without usage, non-streaming, concurrent);
    returns the output tokens the client was told about where it could see them."""
    extra: dict[str, Any] = (
        {"extra_headers": {"x-specfleet-class": "code"}} if cls == "code" else {}
    )
    if cls == "tools":
        extra = {"tools": [WEATHER]}

    async def one(i: int) -> None:
        kind = i % 3
        if kind == 0:
            await oai.chat.completions.create(model="llama", messages=MESSAGES, **extra)
        else:
            options = {"stream_options": {"include_usage": True}} if kind == 2 else {}
            stream = await oai.chat.completions.create(
                model="llama", messages=MESSAGES, stream=True, **options, **extra
            )
            async for _ in stream:
                pass

    await asyncio.gather(*(one(i) for i in range(6)))
    return 6


async def test_vllm_per_class_counters_equal_the_engine_counters() -> None:
    async with through_gateway("vllm", SimOptions(time_scale=FAST, seed=3)) as (sim, gw):
        oai = client(gw.url)
        for cls in ("code", "tools", "chat"):
            before = await engine_counts(sim, "vllm")
            sent = await class_batch(oai, cls)
            after = await engine_counts(sim, "vllm")
            text = await scrape(gw.metrics_url)
            drafted, accepted, generated = (a - b for a, b in zip(after, before, strict=True))
            assert drafted > 0
            assert metric(text, "specfleet_spec_draft_tokens_total", **{"class": cls}) == drafted
            assert metric(text, "specfleet_spec_accepted_tokens_total", **{"class": cls}) == (
                accepted
            )
            assert metric(text, "specfleet_output_tokens_total", **{"class": cls}) == generated
            ok = metric(text, "specfleet_requests_total", **{"class": cls, "outcome": "ok"})
            assert ok == sent
            assert metric(text, "specfleet_ttft_seconds_count", **{"class": cls}) == 4  # streams
            assert metric(text, "specfleet_tpot_seconds_count", **{"class": cls}) == 4
        drafts_total = metric(await scrape(sim.url), "vllm:spec_decode_num_drafts_total")
        assert metric(text, "specfleet_spec_steps_total") == drafts_total


async def test_request_seconds_count_the_time_requests_spend_in_flight() -> None:
    """Its rate is the requests in flight (Little's law), which the guard's load term reads."""
    async with through_gateway("vllm", SimOptions(time_scale=1.0, seed=5)) as (_sim, gw):
        oai, spent = client(gw.url), 0.0
        for stream in (False, True, False, True):
            started = asyncio.get_running_loop().time()
            answer = await oai.chat.completions.create(
                model="llama", messages=MESSAGES, max_tokens=24, stream=stream
            )
            if stream:
                async for _ in answer:  # type: ignore[union-attr]
                    pass
            spent += asyncio.get_running_loop().time() - started
        counted = metric(await scrape(gw.metrics_url), "specfleet_request_seconds_total")
        assert 0.6 * spent < counted <= spent


async def test_tensorrt_llm_counts_derived_from_the_mean_acceptance_length() -> None:
    async with through_gateway("tensorrt-llm", SimOptions(time_scale=FAST, seed=6)) as (sim, gw):
        sent = await class_batch(client(gw.url), "chat")
        drafted, accepted, _ = await engine_counts(sim, "tensorrt-llm")
        text = await scrape(gw.metrics_url)
    labels = {"class": "chat"}
    # Verify steps and drafts are exact; accepted drafts beyond the last token the request
    # needed are counted by the engine but invisible in the output (at most k per request).
    assert metric(text, "specfleet_spec_draft_tokens_total", **labels) == drafted
    derived = metric(text, "specfleet_spec_accepted_tokens_total", **labels)
    assert accepted - K * sent <= derived <= accepted
    assert metric(text, "specfleet_spec_steps_total", **labels) == drafted / K


# ------------------------------------------------------------------------------ quality


@pytest.mark.parametrize("validity", [1.0, 0.0])
async def test_tool_call_and_json_validity_are_counted(validity: float) -> None:
    options = SimOptions(time_scale=FAST, seed=8, effects=Effects(tool_call_validity=validity))
    async with through_gateway("vllm", options) as (_, gw):
        oai = client(gw.url)
        for stream in (False, True):
            tool = await oai.chat.completions.create(
                model="llama",
                messages=MESSAGES,
                tools=[WEATHER],
                tool_choice="required",
                stream=stream,
            )
            structured = await oai.chat.completions.create(
                model="llama", messages=MESSAGES, response_format=ANSWER_SCHEMA, stream=stream
            )
            if stream:
                async for _ in tool:
                    pass
                async for _ in structured:
                    pass
        text = await scrape(gw.metrics_url)
    valid, invalid = ("true", "false") if validity else ("false", "true")
    assert metric(text, "specfleet_tool_calls_total", **{"class": "tools", "valid": valid}) == 2
    assert metric(text, "specfleet_tool_calls_total", valid=invalid) == 0
    assert metric(text, "specfleet_structured_outputs_total", valid=valid) == 2
    assert metric(text, "specfleet_structured_outputs_total", valid=invalid) == 0


async def test_truncations_are_counted_by_finish_reason() -> None:
    async with through_gateway("vllm", SimOptions(time_scale=FAST, seed=9)) as (_, gw):
        oai = client(gw.url)
        await oai.chat.completions.create(model="llama", messages=MESSAGES, max_tokens=3)
        stream = await oai.chat.completions.create(
            model="llama", messages=MESSAGES, max_tokens=3, stream=True
        )
        async for _ in stream:
            pass
        await oai.chat.completions.create(model="llama", messages=MESSAGES)
        text = await scrape(gw.metrics_url)
    assert metric(text, "specfleet_finish_reasons_total", reason="length") == 2
    assert metric(text, "specfleet_finish_reasons_total", reason="stop") == 1


async def test_every_class_series_exists_before_any_request() -> None:
    async with through_gateway("vllm", SimOptions(time_scale=FAST)) as (_, gw):
        text = await scrape(gw.metrics_url)
    for cls in ("code", "tools", "chat"):
        for outcome in ("ok", "client_error", "upstream_error", "cancelled"):
            labels = f'class="{cls}",outcome="{outcome}",pool="fleet"'
            assert f"specfleet_requests_total{{{labels}}} 0.0" in text
        assert f'specfleet_spec_draft_tokens_total{{class="{cls}",pool="fleet"}} 0.0' in text
        assert f'specfleet_ttft_seconds_count{{class="{cls}",pool="fleet"}} 0.0' in text
        assert f'specfleet_tool_calls_total{{class="{cls}",pool="fleet",valid="false"}} 0.0' in text
        assert 'pool="plain"' not in text  # no route: no plain pool series


@pytest.mark.parametrize(
    "stream_options", [{}, {"continuous_usage_stats": True}, {"include_usage": False}]
)
async def test_streams_with_stream_options_but_no_include_usage_are_counted(
    stream_options: dict[str, Any],
) -> None:
    """vLLM sends no usage chunk unless include_usage is true (issue 15): the gateway asks for
    it, reads the counts from it and drops it, so the client sees what vLLM would send it."""
    async with through_gateway("vllm", SimOptions(time_scale=FAST, seed=8)) as (sim, gw):
        oai = client(gw.url)
        chunks = []
        for _ in range(3):
            stream = await oai.chat.completions.create(
                model="llama", messages=MESSAGES, stream=True, stream_options=stream_options
            )
            chunks += [chunk async for chunk in stream]
        drafted, accepted, generated = await engine_counts(sim, "vllm")
        text = await scrape(gw.metrics_url)
    assert drafted > 0 and generated > 0
    assert metric(text, "specfleet_spec_draft_tokens_total") == drafted
    assert metric(text, "specfleet_spec_accepted_tokens_total") == accepted
    assert metric(text, "specfleet_output_tokens_total") == generated
    assert all(c.usage is None and c.choices for c in chunks)  # no usage, on no chunk
    finishing = [c for c in chunks if c.choices[0].finish_reason is not None]
    assert len(finishing) == 3
    assert all((c.system_fingerprint or "").startswith("vllm-") for c in finishing)
