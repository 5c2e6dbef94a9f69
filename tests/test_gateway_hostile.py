"""The gateway against hostile clients (issue 17): it does no I/O a client asks for, never
stalls its loop on a client's schema, keeps a bounded amount of what clients send, answers
malformed requests itself, and no crafted request moves the engine's error rate or the
validity the guard reads."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import tracemalloc
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from specfleet.api.gateway import GatewayConfig
from specfleet.gateway import proxy as proxy_module
from specfleet.gateway import schemas
from specfleet.gateway.quality import (
    ToolCall,
    judge,
    structured_output_valid,
    tool_call_valid,
)
from specfleet.gateway.satisfiable import unsatisfiable
from specfleet.gateway.schemas import Checker, SchemaCache, screen
from specfleet.gateway.server import GatewayServer, running
from specfleet.gateway.wire import MAX_BODY_DEPTH, BadRequest, parse_request

CHAT = "/v1/chat/completions"
CONFIG = GatewayConfig.model_validate(
    {
        "specmodel": "m",
        "engine": "vllm",
        "servedName": "llama",
        "classes": [{"name": "chat"}],
        "defaultClass": "chat",
    }
)


class Engine:
    """Answers every chat request with one tool call and JSON content; can redirect or trickle."""

    def __init__(self) -> None:
        self.requests = 0
        self.cancelled = 0
        self.url = ""

    async def chat(self, request: web.Request) -> web.StreamResponse:
        self.requests += 1
        body = await request.json()
        script = request.headers.get("x-script")
        if script == "redirect":
            raise web.HTTPTemporaryRedirect(request.headers["x-target"])
        if script == "trickle":
            return await self._trickle(request)
        if script == "linger":
            return await self._linger(request)
        call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        message = {"role": "assistant", "content": '{"a": "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa!"}'}
        if body.get("tools"):
            message["tool_calls"] = [call]  # type: ignore[assignment]
        choice = {"index": 0, "message": message, "finish_reason": "stop"}
        return web.json_response({"choices": [choice], "usage": {"completion_tokens": 5}})

    async def _linger(self, request: web.Request) -> web.StreamResponse:
        """A whole stream, usage and [DONE] included, then the end of the response a while later
        (uvicorn ends a chunked response in a write of its own)."""
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        finish = {"choices": [{"index": 0, "delta": {"content": "xy"}, "finish_reason": "length"}]}
        usage = {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 2}}
        for chunk in (finish, usage):
            await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        await asyncio.sleep(0.5)
        await response.write_eof()
        return response

    async def _trickle(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        try:
            while True:  # a token every 50 ms, forever
                delta = {"choices": [{"index": 0, "delta": {"content": "x"}}]}
                await response.write(b"data: " + json.dumps(delta).encode() + b"\n\n")
                await asyncio.sleep(0.05)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise


@pytest.fixture(autouse=True)
def refilled_allowance() -> Iterator[None]:
    """Tests here spend the checks' CPU allowance on purpose: give it back for what follows."""
    yield
    schemas._BUDGET.allowance = schemas.CHECK_BURST


@asynccontextmanager
async def serving(app: web.Application) -> AsyncIterator[str]:
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


@asynccontextmanager
async def gateway(**settings: float) -> AsyncIterator[tuple[Engine, GatewayServer]]:
    engine = Engine()
    app = web.Application()
    app.router.add_post(CHAT, engine.chat)
    async with serving(app) as url, running(CONFIG, url, **settings) as gw:
        engine.url = url
        yield engine, gw


class Tarpit:
    """A server that accepts connections and never answers: what a remote `$ref` would hang on."""

    def __init__(self) -> None:
        self.connections = 0
        self._server: asyncio.Server | None = None
        self.port = 0

    async def __aenter__(self) -> Tarpit:
        async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections += 1
            await reader.read()  # until the other side goes away

        self._server = await asyncio.start_server(hold, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()


async def scrape(gw: GatewayServer) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    async with httpx.AsyncClient() as http:
        text = (await http.get(gw.metrics_url + "/metrics")).text
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


CHAT_FLEET = {"class": "chat", "pool": "fleet"}


def sample(metrics: dict[Any, float], name: str, **labels: str) -> float:
    return metrics.get((name, frozenset(labels.items())), 0.0)


def requests(metrics: dict[Any, float], outcome: str) -> float:
    labels = {"class": "chat", "pool": "fleet", "outcome": outcome}
    return sample(metrics, "specfleet_requests_total", **labels)


def unjudged(metrics: dict[Any, float], kind: str, reason: str) -> float:
    labels = {"class": "chat", "pool": "fleet", "kind": kind, "reason": reason}
    return sample(metrics, "specfleet_quality_unjudged_total", **labels)


def with_schema(schema: Any) -> dict[str, Any]:
    tool = {"type": "function", "function": {"name": "f", "parameters": schema}}
    response_format = {"type": "json_schema", "json_schema": {"name": "r", "schema": schema}}
    return {"messages": [], "tools": [tool], "response_format": response_format}


# ------------------------------------------------------------------ no I/O a client asks for


async def test_a_remote_ref_is_never_fetched_and_the_gateway_stays_responsive() -> None:
    async with Tarpit() as tarpit, gateway() as (_, gw), httpx.AsyncClient() as http:
        remote = f"http://127.0.0.1:{tarpit.port}/schema.json"
        schemas = [
            {"$ref": remote},
            {"type": "object", "properties": {"a": {"$ref": remote}}},
            {"$id": remote, "type": "object", "properties": {"a": {"$ref": "other.json"}}},
        ]

        async def probe() -> float:
            worst = 0.0
            for _ in range(20):
                started = time.perf_counter()
                r = await http.get(gw.metrics_url + "/healthz", timeout=2.0)
                assert r.status_code == 200
                worst = max(worst, time.perf_counter() - started)
                await asyncio.sleep(0.01)
            return worst

        sent = [http.post(gw.url + CHAT, json=with_schema(s), timeout=5.0) for s in schemas]
        *answers, worst = await asyncio.gather(*sent, probe())
        assert [a.status_code for a in answers] == [200, 200, 200]
        assert worst < 0.5
        await asyncio.sleep(0.1)
        assert tarpit.connections == 0
        metrics = await scrape(gw)
    assert unjudged(metrics, "tool_call", "remote_ref") == 3
    assert unjudged(metrics, "structured_output", "remote_ref") == 3
    assert requests(metrics, "ok") == 3


async def test_redirects_from_the_engine_are_relayed_not_followed() -> None:
    hits = 0

    async def elsewhere(request: web.Request) -> web.Response:
        nonlocal hits
        hits += 1
        return web.json_response({})

    target = web.Application()
    target.router.add_route("*", "/{tail:.*}", elsewhere)
    async with serving(target) as url, gateway() as (_, gw), httpx.AsyncClient() as http:
        headers = {"x-script": "redirect", "x-target": url + "/steal"}
        r = await http.post(gw.url + CHAT, json={"messages": []}, headers=headers)
    assert r.status_code == 307 and r.headers["location"] == url + "/steal"
    assert hits == 0


# ------------------------------------------------------------------ malformed requests


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"[" * 100_000 + b"]" * 100_000, "nested more than"),  # past the parser's recursion
        (b'{"messages": [], "x": ' + b"[" * 70 + b"]" * 70 + b"}", "nested more than"),
        (b"\xff\xfe{}", "not valid JSON"),
        (b"[]", "must be a JSON object"),
        (b'{"messages": [], "stream": "yes"}', "`stream` must be a boolean"),
        (b'{"messages": [], "stream": true, "stream_options": []}', "`stream_options` must be"),
        (b'{"messages": [], "tools": {"a": 1}}', "`tools` must be an array"),
        (b'{"messages": [], "response_format": "json"}', "`response_format` must be an object"),
        (b'{"messages": [], "model": 7}', "`model` must be a string"),
    ],
)  # fmt: skip
async def test_malformed_bodies_get_an_openai_400_counted_as_client_errors(
    body: bytes, message: str
) -> None:
    async with gateway() as (engine, gw), httpx.AsyncClient() as http:
        r = await http.post(gw.url + CHAT, content=body, headers={"content-type": "x"})
        assert r.status_code == 400
        error = r.json()["error"]
        assert message in error["message"]
        assert (error["type"], error["code"]) == ("BadRequestError", 400)
        metrics = await scrape(gw)
    assert engine.requests == 0
    assert requests(metrics, "client_error") == 1
    assert requests(metrics, "upstream_error") == requests(metrics, "gateway_error") == 0


async def test_the_gateways_own_failure_is_never_the_engines(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(*args: Any) -> bytes:
        raise RuntimeError("a bug of the gateway's")

    monkeypatch.setattr(proxy_module, "usage_injection", broken)
    async with gateway() as (engine, gw), httpx.AsyncClient() as http:
        r = await http.post(gw.url + CHAT, json={"messages": [], "stream": True})
        metrics = await scrape(gw)
    assert r.status_code == 500 and r.json()["error"]["type"] == "InternalServerError"
    assert engine.requests == 0
    assert requests(metrics, "gateway_error") == 1
    assert requests(metrics, "upstream_error") == 0
    assert sample(metrics, "specfleet_gateway_errors_total", stage="request") == 1


async def test_a_stream_past_its_deadline_is_cut_and_not_blamed_on_the_engine() -> None:
    async with gateway(stream_deadline=0.4) as (engine, gw), httpx.AsyncClient() as http:
        started = time.perf_counter()
        body = {"messages": [], "stream": True}
        with pytest.raises(httpx.RemoteProtocolError):  # an incomplete stream, not a clean end
            await http.post(gw.url + CHAT, json=body, headers={"x-script": "trickle"})
        took = time.perf_counter() - started
        await asyncio.sleep(0.1)
        metrics = await scrape(gw)
    assert 0.4 <= took < 1.5
    assert engine.cancelled == 1
    assert requests(metrics, "cancelled") == 1
    assert requests(metrics, "upstream_error") == 0


async def test_a_client_that_hangs_up_after_done_got_a_whole_answer() -> None:
    """The openai client closes the connection once it reads [DONE], before the engine ends its
    response: the request is complete, counted as ok with its tokens."""
    async with gateway() as (engine, gw), httpx.AsyncClient() as http:
        body = {"messages": [], "stream": True}
        for _ in range(3):
            async with http.stream(
                "POST", gw.url + CHAT, json=body, headers={"x-script": "linger"}
            ) as response:
                async for line in response.aiter_lines():
                    if line == "data: [DONE]":
                        break
        await asyncio.sleep(0.2)
        metrics = await scrape(gw)
    assert engine.requests == 3
    assert requests(metrics, "ok") == 3
    assert requests(metrics, "cancelled") == 0
    assert sample(metrics, "specfleet_output_tokens_total", **CHAT_FLEET) == 6


async def test_no_client_header_bytes_reach_the_logs(caplog: pytest.LogCaptureFixture) -> None:
    secret = "Bearer sk-SECRET-4242"
    caplog.set_level(logging.DEBUG)
    async with gateway() as (_, gw):
        port = int(gw.url.rsplit(":", 1)[1])
        for head in (
            f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nAuthorization: {secret}\x01\r\n\r\n",
            f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nX-{secret}: 1\r\n\r\n",
            f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nContent-Length: {secret}\r\n\r\n",
        ):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(head.encode("latin-1"))
            await writer.drain()
            answer = await asyncio.wait_for(reader.read(), 3)  # (its own bytes, to itself)
            assert answer.split(b"\r\n")[0].endswith(b" 400 Bad Request")
            writer.close()
        metrics = await scrape(gw)
    # counted where an operator looks, apart from the classes' requests
    assert sample(metrics, "specfleet_gateway_refused_total", status="400") == 3
    assert requests(metrics, "client_error") == 0
    assert caplog.records  # the gateway did log the malformed requests
    logged = "\n".join(caplog.text.splitlines() + [r.getMessage() for r in caplog.records])
    assert "SECRET" not in logged


# ------------------------------------------------------------------ evidence


async def test_crafted_schemas_are_unjudged_not_invalid() -> None:
    crafted = [
        {"not": {}},
        {"type": "object", "required": ["a"], "properties": {"a": False}},
        {"enum": []},
        {"type": "string", "const": 3},
        {"type": "object", "properties": {"a": {"type": "string", "pattern": "(a)\\1"}}},
        {"type": "object", "patternProperties": {"^(a+)+$": {}}},
    ]
    async with gateway() as (_, gw), httpx.AsyncClient() as http:
        for schema in crafted:
            r = await http.post(gw.url + CHAT, json=with_schema(schema))
            assert r.status_code == 200
        metrics = await scrape(gw)
    for kind in ("true", "false"):
        assert sample(metrics, "specfleet_tool_calls_total", **CHAT_FLEET, valid=kind) == 0
    assert unjudged(metrics, "tool_call", "unsatisfiable") == 4
    assert unjudged(metrics, "tool_call", "pattern") == 2
    assert unjudged(metrics, "structured_output", "unsatisfiable") == 4


def test_a_backtracking_pattern_is_matched_in_linear_time() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string", "pattern": "^(a+)+$"}}}
    started = time.process_time()
    verdict = structured_output_valid(json.dumps({"a": "a" * 40 + "!"}), schema)
    assert verdict is False  # judged: RE2 takes the pattern, and it does not match
    assert time.process_time() - started < 0.05  # CPU seconds; Python's re would take minutes


def exponential_refs(depth: int) -> dict[str, Any]:
    """Two references to the next level, `depth` times: 2**depth paths, none matching a string."""
    defs = {f"d{i}": {"anyOf": [{"$ref": f"#/$defs/d{i + 1}"}] * 2} for i in range(depth)}
    return {"$defs": {**defs, f"d{depth}": {"type": "integer"}}, "$ref": "#/$defs/d0"}


def test_exponential_local_refs_run_out_of_budget_fast() -> None:
    schema = exponential_refs(24)
    started = time.process_time()
    assert structured_output_valid('"x"', schema) == "budget"
    assert time.process_time() - started < 0.2
    loop = {"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}
    assert structured_output_valid("{}", loop) == "budget"


def test_all_checks_share_one_cpu_allowance(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(schemas, "CHECK_SHARE", 0.0)  # no refill
    exponential = exponential_refs(30)
    verdicts = [structured_output_valid('"x"', exponential) for _ in range(6)]
    assert set(verdicts) == {"budget"}
    evaluated: list[int] = []
    spend = schemas._BUDGET.spend

    def counted(cost: int = 1) -> None:
        evaluated.append(cost)
        spend(cost)

    monkeypatch.setattr(schemas._BUDGET, "spend", counted)
    cheap = {"type": "object", "properties": {"n": {"type": "integer"}}, "title": "allowance"}
    assert structured_output_valid('{"n": 1}', cheap) == "budget"
    assert evaluated == []  # spent: not even screened
    monkeypatch.setattr(schemas, "CHECK_SHARE", 1000.0)
    time.sleep(0.01)  # refills ten CPU seconds: more than any overrun above (CPU of the process)
    assert structured_output_valid('{"n": 1}', cheap) is True  # "budget" was not cached
    assert evaluated  # and now it is screened and checked, on the budget


def test_schema_bounds() -> None:
    deep: Any = {"type": "object"}
    for _ in range(40):
        deep = {"type": "object", "properties": {"a": deep}}
    assert screen(deep, want_object=True) == "too_deep"
    assert tool_call_valid(ToolCall("f", "{}"), {"f": {"type": "string"}}) == "unsatisfiable"
    chain = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(2000)}
    long_chain = {"$defs": {**chain, "d2000": {}}, "$ref": "#/$defs/d0"}
    assert screen(long_chain, want_object=True) == "too_deep"  # deeper than the stack


def test_the_schema_cache_is_bounded_in_bytes_whatever_clients_send(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for limit in ("CHECK_SECONDS", "CHECK_BURST", "CHECK_SHARE"):  # tracemalloc slows checks
        monkeypatch.setattr(schemas, limit, 1000.0)
    cache = SchemaCache(max_bytes=16 * 1024)

    def schema(i: int) -> dict[str, Any]:  # distinct, all sane: each is kept until evicted
        properties = {f"p{i}_{j}": {"type": "string", "maxLength": j} for j in range(20)}
        return {"type": "object", "properties": properties}

    tracemalloc.start()
    try:
        for i in range(40):
            assert isinstance(cache.get(schema(i), want_object=True), Checker)
        warm, _ = tracemalloc.get_traced_memory()
        for i in range(40, 440):
            cache.get(schema(i), want_object=True)
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert 0 < cache.bytes <= cache.max_bytes and 10 < len(cache) < 40
    assert after - warm < 512 * 1024  # 400 more schemas kept nothing more
    big = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(4000)}}
    assert cache.get(big, want_object=True) == "too_large"  # never parsed, never kept


# ------------------------------------------------------------------ properties

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=30,
)
KEYWORDS = st.sampled_from(
    ["type", "enum", "const", "not", "anyOf", "allOf", "oneOf", "required", "properties",
     "items", "pattern", "minimum", "maximum", "minLength", "$ref", "$defs", "patternProperties",
     "additionalProperties", "uniqueItems", "format", "$id", "$schema"]
)  # fmt: skip
SCHEMAS = st.recursive(
    st.booleans() | st.dictionaries(KEYWORDS, JSON, max_size=3),
    lambda children: st.dictionaries(
        KEYWORDS, children | st.lists(children, max_size=3) | JSON, max_size=4
    ),
    max_leaves=25,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schema=SCHEMAS, output=JSON)
def test_any_schema_and_output_give_a_verdict_or_a_known_reason(schema: Any, output: Any) -> None:
    text = json.dumps(output)
    body = with_schema(schema)
    started = time.process_time()
    verdicts = judge(body, [text], [ToolCall("f", text)])
    assert time.process_time() - started < 0.5
    checks = len(verdicts.tool_calls) + len(verdicts.structured_outputs) + len(verdicts.unjudged)
    assert checks == 2
    if unsatisfiable(schema):
        assert verdicts.structured_outputs == ()  # never counted as the model's failure


@settings(max_examples=300, deadline=None)
@given(body=JSON | st.binary(max_size=64))
def test_any_body_parses_or_is_a_bad_request(body: Any) -> None:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    try:
        parsed = parse_request(raw)
    except BadRequest as exc:
        assert str(exc)  # the gateway's words
        return
    assert isinstance(parsed, dict)


@settings(max_examples=50, deadline=None)
@given(depth=st.integers(min_value=2, max_value=3 * MAX_BODY_DEPTH))
def test_nesting_is_refused_exactly_past_the_limit(depth: int) -> None:
    raw = b'{"a":' + b"[" * (depth - 1) + b"]" * (depth - 1) + b"}"
    if depth <= MAX_BODY_DEPTH:
        assert parse_request(raw)
    else:
        with pytest.raises(BadRequest, match="nested"):
            parse_request(raw)
