"""The TensorRT-LLM simulator on loopback."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from openai import AsyncOpenAI
from prometheus_client.parser import text_string_to_metric_families

from specfleet.scenario import parse_scenario
from specfleet_testbed.engine.args import parse_trtllm
from specfleet_testbed.engine.server import SimOptions, serve

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
FAST = 0.0005
ALL_STATS = """
speculative_config: {decoding_type: Eagle, max_draft_len: 3, speculative_model: d/eagle3}
return_perf_metrics: true
enable_iter_perf_stats: true
"""
MESSAGES: Any = [{"role": "user", "content": "Explain draft acceptance."}]
SCENARIO = parse_scenario(
    {
        "duration_s": 60,
        "traffic_rps": 1,
        "classes": {"chat": {"share": 1.0, "acceptance": 0.7, "output_tokens": 30}},
    }
)


def trtllm(yaml_text: str | None = ALL_STATS, *extra: str) -> Any:
    argv = ["trtllm-serve", MODEL, "--backend", "pytorch", *extra]
    if yaml_text is not None:
        argv += ["--extra_llm_api_options", "/etc/specfleet/llm_api.yaml"]
    return parse_trtllm(argv, read_file=lambda _: yaml_text or "")


async def sse(url: str, body: dict[str, Any], path: str = "/v1/chat/completions") -> list[Any]:
    async with httpx.AsyncClient() as http:
        r = await http.post(url + path, json=body)
    assert r.status_code == 200, r.text
    events = [
        e.removeprefix("data: ").strip() for e in r.text.split("\n\n") if e.startswith("data: ")
    ]
    return [e if e == "[DONE]" else json.loads(e) for e in events]


async def test_chat_shapes_and_the_mean_acceptance_length() -> None:
    async with serve(trtllm(), SimOptions(time_scale=FAST, scenario=SCENARIO)) as sim:
        async with httpx.AsyncClient() as http:
            raw = (
                await http.post(
                    sim.url + "/v1/chat/completions",
                    json={"model": "whatever-you-send", "messages": MESSAGES},
                )
            ).json()
        oai = AsyncOpenAI(base_url=f"{sim.url}/v1", api_key="x", max_retries=0)
        resp = await oai.chat.completions.create(model=MODEL, messages=MESSAGES)
    assert resp.choices[0].message.content and resp.usage is not None
    assert resp.usage.completion_tokens == 30
    assert list(raw) == [
        "id",
        "object",
        "created",
        "model",
        "choices",
        "usage",
        "prompt_token_ids",
        "prompt_token_ids_b64",
    ]
    assert raw["model"] == "whatever-you-send"  # TensorRT-LLM echoes the request's model
    choice = raw["choices"][0]
    assert list(choice) == [
        "index",
        "message",
        "logprobs",
        "finish_reason",
        "stop_reason",
        "mm_embedding_handle",
        "disaggregated_params",
        "avg_decoded_tokens_per_iter",
    ]  # no per-choice speculative_decoding: no 1.2.1 build has it
    assert choice["message"]["tool_calls"] == [] and choice["message"]["reasoning_content"] == ""
    # 30 tokens / (decode iterations + 1): every decode step drafts 3, each makes 1 to 4 tokens
    iterations = 30 / choice["avg_decoded_tokens_per_iter"]
    assert iterations == round(iterations) and 1 + 29 / 4 <= iterations < 30
    assert raw["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}


async def test_streaming_chunks_carry_the_running_mean_acceptance_length() -> None:
    body = {"model": MODEL, "messages": MESSAGES, "stream": True}
    async with serve(trtllm(), SimOptions(time_scale=FAST, scenario=SCENARIO)) as sim:
        plain = await sse(sim.url, body)
        with_usage = await sse(
            sim.url, {**body, "stream_options": {}}
        )  # include_usage defaults to true
    assert plain[-1] == "[DONE]"
    first, *rest = plain[:-1]
    assert first["choices"] == [{"index": 0, "delta": {"role": "assistant"}}]
    assert first["id"].removeprefix("chatcmpl-").isdigit()  # the engine's integer request id
    assert rest[0]["choices"][0]["delta"].keys() == {"content", "reasoning_content"}
    assert "finish_reason" not in rest[0]["choices"][0]  # exclude_none
    assert all("avg_decoded_tokens_per_iter" in c["choices"][0] for c in rest)
    assert not any("speculative_decoding" in c["choices"][0] for c in rest)
    assert rest[-1]["choices"][0]["finish_reason"] == "stop"
    assert all("usage" not in c for c in plain[:-1])
    final = with_usage[-2]
    assert final["choices"] == [] and final["usage"]["completion_tokens"] == 30
    assert final["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}


async def test_iteration_stats_drained_on_read_and_1_2_1s_few_prometheus_series() -> None:
    async with serve(trtllm(), SimOptions(time_scale=FAST, scenario=SCENARIO)) as sim:
        oai = AsyncOpenAI(base_url=f"{sim.url}/v1", api_key="x", max_retries=0)
        for _ in range(4):
            await oai.chat.completions.create(model=MODEL, messages=MESSAGES)
        async with httpx.AsyncClient() as http:
            stats = (await http.get(sim.url + "/metrics")).json()
            again = (await http.get(sim.url + "/metrics")).json()
            prom = (await http.get(sim.url + "/prometheus/metrics")).text
    assert stats and again == []
    spec = [s["specDecodingStats"] for s in stats]
    assert sum(s["numDraftTokens"] for s in spec) == 3 * sum(
        s["numRequestsWithDraftTokens"] for s in spec
    )
    assert 0 < sum(s["numAcceptedTokens"] for s in spec) < sum(s["numDraftTokens"] for s in spec)
    assert {
        "iter",
        "iterLatencyMS",
        "numActiveRequests",
        "kvCacheStats",
        "inflightBatchingStats",
    } <= set(stats[0])
    assert set(stats[-1]["specDecodingStats"]) == {
        "numDraftTokens",
        "numAcceptedTokens",
        "numRequestsWithDraftTokens",
        "acceptanceLength",
        "iterLatencyMS",
        "draftOverhead",
    }
    families = {
        f.name: f for f in text_string_to_metric_families(prom) if not f.name.endswith("_created")
    }
    # 1.2.1: request latencies and successes only, labelled "undefined"; the spec-decode,
    # request-count and KV-cache series arrived in 1.3
    assert set(families) == {
        "trtllm_request_success",
        "trtllm_e2e_request_latency_seconds",
        "trtllm_time_to_first_token_seconds",
        "trtllm_time_per_output_token_seconds",
        "trtllm_request_queue_time_seconds",
    }
    success = next(s for s in families["trtllm_request_success"].samples if s.value)
    assert success.value == 4 and success.labels == {
        "model_name": "undefined",
        "engine_type": "undefined",
        "finished_reason": "stop",
    }


async def test_above_max_concurrency_the_engine_stops_drafting() -> None:
    """Its mean acceptance length falls to 1 although the drafter is fine."""
    yaml_text = (
        "speculative_config: {decoding_type: Eagle, max_draft_len: 3, "
        "speculative_model: d/eagle3, max_concurrency: 1}\n"
    )
    async with serve(trtllm(yaml_text), SimOptions(time_scale=1.0, scenario=SCENARIO)) as sim:
        oai = AsyncOpenAI(base_url=f"{sim.url}/v1", api_key="x", max_retries=0)

        async def mean_acceptance_length() -> float:
            raw = await oai.chat.completions.with_raw_response.create(
                model=MODEL, messages=MESSAGES
            )
            return float(json.loads(raw.text)["choices"][0]["avg_decoded_tokens_per_iter"])

        alone = await mean_acceptance_length()
        crowded = await asyncio.gather(*(mean_acceptance_length() for _ in range(4)))
    assert alone > 1.5
    assert min(crowded) < 1.2


async def test_endpoints_without_perf_options() -> None:
    async with serve(trtllm(None), SimOptions(time_scale=FAST)) as sim, httpx.AsyncClient() as http:
        await http.post(
            sim.url + "/v1/chat/completions", json={"model": MODEL, "messages": MESSAGES}
        )
        stats = await http.get(sim.url + "/metrics")
        prom = await http.get(sim.url + "/prometheus/metrics")
        models = (await http.get(sim.url + "/v1/models")).json()
        version = (await http.get(sim.url + "/version")).json()
        health = await http.get(sim.url + "/health_generate")
        no_model = await http.post(sim.url + "/v1/chat/completions", json={"messages": MESSAGES})
        raw = (
            await http.post(
                sim.url + "/v1/completions",
                json={"model": MODEL, "prompt": "abc", "max_tokens": 5},
            )
        ).json()
    assert stats.json() == [] and prom.status_code == 404
    assert models == {
        "object": "list",
        "data": [
            {
                "id": MODEL,
                "object": "model",
                "created": models["data"][0]["created"],
                "owned_by": "tensorrt_llm",
            }
        ],
    }
    assert version == {"version": "1.2.1"} and health.status_code == 200
    assert no_model.status_code == 400
    assert (
        no_model.json()["object"] == "error" and no_model.json()["code"] == 400
    )  # flat, not nested
    choice = raw["choices"][0]
    assert choice["finish_reason"] == "length" and choice["avg_decoded_tokens_per_iter"] is None
    assert "speculative_decoding" not in choice


async def test_tool_calls_need_a_tool_parser() -> None:
    tool: Any = {
        "type": "function",
        "function": {
            "name": "lookup",
            "parameters": {
                "type": "object",
                "properties": {"q": {"type": "string"}},
                "required": ["q"],
            },
        },
    }
    scen = parse_scenario(
        {
            "duration_s": 60,
            "traffic_rps": 1,
            "classes": {"chat": {"share": 1.0, "acceptance": 0.7, "tool_call_rate": 1.0}},
        }
    )
    body = {"model": MODEL, "messages": MESSAGES, "tools": [tool]}
    opts = SimOptions(time_scale=FAST, scenario=scen)
    async with serve(trtllm(None), opts) as sim, httpx.AsyncClient() as http:
        plain = (await http.post(sim.url + "/v1/chat/completions", json=body)).json()
    async with serve(
        trtllm(None, "--tool_parser", "qwen3"), SimOptions(time_scale=FAST, scenario=scen)
    ) as sim:
        async with httpx.AsyncClient() as http:
            parsed = (await http.post(sim.url + "/v1/chat/completions", json=body)).json()
        chunks = await sse(sim.url, {**body, "stream": True})
    assert plain["choices"][0]["message"]["tool_calls"] == []
    assert plain["choices"][0]["finish_reason"] == "stop"
    call = parsed["choices"][0]["message"]["tool_calls"][0]
    assert parsed["choices"][0]["finish_reason"] == "tool_calls"
    assert call["function"]["name"] == "lookup" and "q" in json.loads(call["function"]["arguments"])
    deltas = [c["choices"][0]["delta"]["tool_calls"][0] for c in chunks[1:-1]]
    assert (
        deltas[0]["id"].startswith("chatcmpl-tool-") and deltas[0]["function"]["name"] == "lookup"
    )
    assert all(d["type"] == "function" for d in deltas)
    assert "q" in json.loads("".join(d["function"]["arguments"] for d in deltas))
    assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"


async def test_after_the_acceptance_gate_trips_the_engine_reports_no_drafts() -> None:
    """1.2.1 exports no spec-decode Prometheus series at all; the iteration stats and each
    response's mean acceptance length show the engine no longer drafting."""
    yaml_text = ALL_STATS.replace(
        "speculative_model: d/eagle3}",
        "speculative_model: d/eagle3, eagle3_one_model: false, acceptance_window: 2, "
        "acceptance_length_threshold: 0.5}",
    )
    scenario = parse_scenario(
        {
            "duration_s": 60,
            "traffic_rps": 1,
            "classes": {"chat": {"share": 1.0, "acceptance": 0.2, "output_tokens": 30}},
        }
    )
    async with serve(trtllm(yaml_text), SimOptions(time_scale=FAST, scenario=scenario)) as sim:
        oai = AsyncOpenAI(base_url=f"{sim.url}/v1", api_key="x", max_retries=0)
        async with httpx.AsyncClient() as http:
            for _ in range(2):
                await oai.chat.completions.create(model=MODEL, messages=MESSAGES)
            before = (await http.get(sim.url + "/metrics")).json()
            after_trip = (
                await http.post(
                    sim.url + "/v1/chat/completions", json={"model": MODEL, "messages": MESSAGES}
                )
            ).json()
            after = (await http.get(sim.url + "/metrics")).json()
            prom = (await http.get(sim.url + "/prometheus/metrics")).text
    assert sum(s["specDecodingStats"]["numDraftTokens"] for s in before) > 0
    assert after and all(s["specDecodingStats"]["numDraftTokens"] == 0 for s in after)
    assert all(s["specDecodingStats"]["acceptanceLength"] == 1.0 for s in after)
    assert after_trip["choices"][0]["avg_decoded_tokens_per_iter"] == 1.0
    assert not any(
        f.name.startswith("trtllm_spec_decode") for f in text_string_to_metric_families(prom)
    )


async def test_health_answers_at_once_while_a_generation_waits_behind_a_full_batch() -> None:
    """The engine's readiness probe asks /health: it answers however busy the engine is, where
    /health_generate (the startup probe) queues behind the running batch."""
    long = parse_scenario(
        {
            "duration_s": 60,
            "traffic_rps": 1,
            "classes": {"chat": {"share": 1.0, "acceptance": 0.7, "output_tokens": 4000}},
        }
    )
    config = trtllm(None, "--max_batch_size", "1")
    body = {"model": MODEL, "messages": MESSAGES, "stream": True}
    async with (
        serve(config, SimOptions(scenario=long)) as sim,
        httpx.AsyncClient() as http,
        http.stream("POST", sim.url + "/v1/chat/completions", json=body) as busy,
    ):
        lines = busy.aiter_lines()
        await anext(lines)  # the batch's one sequence is decoding
        health = await http.get(sim.url + "/health", timeout=1)
        with pytest.raises(httpx.ReadTimeout):
            await http.get(sim.url + "/health_generate", timeout=0.5)
    assert health.status_code == 200
