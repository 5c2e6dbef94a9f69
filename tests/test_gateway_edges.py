"""The gateway's edges against a scripted upstream: errors, timeouts, disconnects,
pass-through, reload and graceful stop."""

from __future__ import annotations

import asyncio
import gzip
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from specfleet.api.gateway import GatewayConfig
from specfleet.gateway import stats
from specfleet.gateway.config import load_gateway_config
from specfleet.gateway.server import GatewayServer, Watch, running
from specfleet.gateway.wire import usage_injection

CHAT = "/v1/chat/completions"
CONFIG: dict[str, Any] = {
    "specmodel": "m",
    "engine": "vllm",
    "servedName": "llama",
    "classes": [{"name": "code"}, {"name": "chat"}],
    "defaultClass": "chat",
    "maxBodyBytes": 4096,
}


def chunk(content: str, finish: str | None = None) -> bytes:
    body = {"choices": [{"index": 0, "delta": {"content": content}, "finish_reason": finish}]}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


class Upstream:
    """A scripted engine; the `x-script` request header picks the behaviour."""

    def __init__(self) -> None:
        self.cancelled = 0
        self.finished = 0
        self.bodies: list[bytes] = []
        self.url = ""

    async def chat(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        self.bodies.append(raw)
        script = request.headers.get("x-script", "stream")
        try:
            return await getattr(self, "_" + script.replace("-", "_"))(request, raw)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise

    async def _stream(self, request: web.Request, raw: bytes, pause: float = 0.0) -> Any:
        try:
            json.loads(raw)
        except ValueError:
            return web.json_response({"error": {"message": "bad json", "code": 400}}, status=400)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for i in range(20):
            await response.write(chunk(f"t{i} ", "stop" if i == 19 else None))
            await asyncio.sleep(pause)
        await response.write(b"data: [DONE]\n\n")
        self.finished += 1
        return response

    async def _slow(self, request: web.Request, raw: bytes) -> Any:
        return await self._stream(request, raw, pause=0.02)

    async def _flood(self, request: web.Request, raw: bytes) -> Any:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        event = chunk("x" * 65000)
        for _ in range(600):  # ~40 MB: more than the socket buffers of both hops hold
            await response.write(event)
        self.finished += 1
        return response

    async def _burst(self, request: web.Request, raw: bytes) -> Any:
        """The whole stream in one write, as a busy gateway reads an engine step's output."""
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        events = [chunk(f"t{i} ", "stop" if i == 19 else None) for i in range(20)]
        await response.write(b"".join(events) + b"data: [DONE]\n\n")
        self.finished += 1
        return response

    async def _hang(self, request: web.Request, raw: bytes) -> Any:
        await asyncio.sleep(30)

    async def _fail(self, request: web.Request, raw: bytes) -> Any:
        body = {"error": {"message": "boom", "type": "InternalServerError", "code": 500}}
        return web.json_response(body, status=500)

    async def _error_event(self, request: web.Request, raw: bytes) -> Any:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(chunk("partial"))
        await response.write(b'data: {"error": {"message": "engine died", "code": 500}}\n\n')
        await response.write(b"data: [DONE]\n\n")
        return response

    async def _die(self, request: web.Request, raw: bytes) -> Any:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(chunk("partial"))
        await asyncio.sleep(0.05)
        assert request.transport is not None
        request.transport.abort()
        return response

    async def health(self, request: web.Request) -> web.Response:
        status = int(request.query.get("status", "200"))
        return web.Response(status=status, text="h", headers={"X-Engine": "sim", "X-Seen": "1"})

    async def other(self, request: web.Request) -> web.Response:
        body = await request.read()
        headers = {
            "X-Method": request.method,
            "X-Path": request.path_qs,
            "X-Got-Hop": request.headers.get("Keep-Alive", ""),
            "X-Got-Custom": request.headers.get("X-Custom", ""),
            "Keep-Alive": "timeout=5",
        }
        return web.Response(status=404, body=b"nope:" + body, headers=headers)

    @asynccontextmanager
    async def serve(self) -> AsyncIterator[Upstream]:
        app = web.Application()
        app.router.add_post(CHAT, self.chat)
        app.router.add_get("/health", self.health)
        app.router.add_route("*", "/{tail:.*}", self.other)
        runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        try:
            yield self
        finally:
            await runner.cleanup()


@asynccontextmanager
async def gateway(**settings: Any) -> AsyncIterator[tuple[Upstream, GatewayServer]]:
    async with (
        Upstream().serve() as upstream,
        running(GatewayConfig.model_validate(CONFIG), upstream.url, **settings) as gw,
    ):
        yield upstream, gw


async def requests_total(gw: GatewayServer, cls: str, outcome: str) -> float:
    async with httpx.AsyncClient() as http:
        text = (await http.get(gw.metrics_url + "/metrics")).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "specfleet_requests_total" and sample.labels == {
                "class": cls,
                "pool": "fleet",
                "outcome": outcome,
            }:
                return sample.value
    raise AssertionError("series missing")


def openai_error(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == status
    return dict(error)


async def test_a_body_over_the_limit_gets_413_without_reaching_the_engine() -> None:
    async with gateway() as (upstream, gw), httpx.AsyncClient() as http:
        big = {"model": "llama", "messages": [{"role": "user", "content": "x" * 5000}]}
        r = await http.post(gw.url + CHAT, json=big, headers={"x-specfleet-class": "code"})
        openai_error(r, 413)

        async def chunked() -> AsyncIterator[bytes]:
            for _ in range(10):
                yield b"x" * 1000

        r = await http.post(gw.url + CHAT, content=chunked())
        openai_error(r, 413)
        assert upstream.bodies == []
        assert await requests_total(gw, "code", "client_error") == 1
        assert await requests_total(gw, "chat", "client_error") == 1


async def test_engine_down_is_a_fast_502_with_an_openai_error() -> None:
    config = GatewayConfig.model_validate(CONFIG)
    async with running(config, "http://127.0.0.1:9") as gw, httpx.AsyncClient() as http:
        started = time.monotonic()
        r = await http.post(gw.url + CHAT, json={"model": "llama", "messages": []})
        assert time.monotonic() - started < 1.0
        assert "unreachable" in openai_error(r, 502)["message"]
        r = await http.get(gw.url + "/health")
        assert r.status_code == 502
        assert await requests_total(gw, "chat", "upstream_error") == 1


async def test_engine_silence_is_a_504() -> None:
    async with gateway(upstream_timeout=0.3) as (upstream, gw), httpx.AsyncClient() as http:
        r = await http.post(gw.url + CHAT, json={"messages": []}, headers={"x-script": "hang"})
        openai_error(r, 504)
        assert await requests_total(gw, "chat", "upstream_error") == 1
        await asyncio.sleep(0.05)
        assert upstream.cancelled == 1  # the gateway hung up on the engine


async def hang_up_mid_stream(gw: GatewayServer, *upstreams: Upstream) -> None:
    """A slow stream of class `code`, hung up on after its first event; returns once an
    upstream saw the cancellation (or after a second)."""
    body = {"model": "llama", "messages": [], "stream": True}
    headers = {"x-script": "slow", "x-specfleet-class": "code"}
    async with (
        httpx.AsyncClient() as http,
        http.stream("POST", gw.url + CHAT, json=body, headers=headers) as r,
    ):
        async for line in r.aiter_lines():
            if line.startswith("data:"):
                break
    for _ in range(50):
        if any(u.cancelled for u in upstreams):
            break
        await asyncio.sleep(0.02)


async def test_a_client_disconnect_mid_stream_cancels_the_engine_request() -> None:
    async with gateway() as (upstream, gw):
        await hang_up_mid_stream(gw, upstream)
        assert upstream.cancelled == 1
        assert upstream.finished == 0
        assert await requests_total(gw, "code", "cancelled") == 1


async def test_a_client_disconnect_while_waiting_cancels_the_engine_request() -> None:
    async with gateway() as (upstream, gw), httpx.AsyncClient() as http:
        with pytest.raises(httpx.ReadTimeout):
            await http.post(
                gw.url + CHAT, json={"messages": []}, headers={"x-script": "hang"}, timeout=0.2
            )
        for _ in range(50):
            if upstream.cancelled:
                break
            await asyncio.sleep(0.02)
        assert upstream.cancelled == 1
        assert await requests_total(gw, "chat", "cancelled") == 1


async def test_a_client_that_stops_sending_its_body_is_dropped() -> None:
    async with gateway(client_timeout=0.3) as (upstream, gw):
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
        writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"
        )
        await writer.drain()
        assert await asyncio.wait_for(reader.read(), 3) == b""  # closed, nothing sent
        writer.close()
        assert upstream.bodies == []
        assert await requests_total(gw, "chat", "cancelled") == 1


async def test_a_client_that_stops_reading_is_dropped_and_the_engine_request_cancelled() -> None:
    async with gateway(client_timeout=0.3) as (upstream, gw):
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
        request = b'{"messages": [], "stream": true}'
        writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nx-script: flood\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(request), request)
        )
        await writer.drain()
        await reader.read(100)  # the response starts; then the client stops reading
        for _ in range(100):
            if upstream.cancelled:
                break
            await asyncio.sleep(0.05)
        writer.close()
        assert upstream.cancelled == 1
        assert upstream.finished == 0
        assert await requests_total(gw, "chat", "cancelled") == 1


async def test_a_non_json_body_is_answered_by_the_gateway_and_counted_as_a_client_error() -> None:
    async with gateway() as (upstream, gw), httpx.AsyncClient() as http:
        r = await http.post(gw.url + CHAT, content=b"{not json", headers={"x-specfleet-class": "x"})
        assert openai_error(r, 400)["message"] == "the body is not valid JSON"
        assert upstream.bodies == []
        assert await requests_total(gw, "chat", "client_error") == 1


async def test_engine_errors_are_relayed_and_counted() -> None:
    async with gateway() as (_, gw), httpx.AsyncClient() as http:
        r = await http.post(gw.url + CHAT, json={"messages": []}, headers={"x-script": "fail"})
        assert r.status_code == 500
        assert r.json()["error"]["message"] == "boom"
        body = {"messages": [], "stream": True}
        r = await http.post(gw.url + CHAT, json=body, headers={"x-script": "error-event"})
        assert r.status_code == 200
        assert b"engine died" in r.content
        assert await requests_total(gw, "chat", "upstream_error") == 2


async def test_an_engine_dying_mid_stream_breaks_the_client_stream() -> None:
    async with gateway() as (_, gw), httpx.AsyncClient() as http:
        body = {"messages": [], "stream": True}
        with pytest.raises(httpx.RemoteProtocolError):
            await http.post(gw.url + CHAT, json=body, headers={"x-script": "die"})
        assert await requests_total(gw, "chat", "upstream_error") == 1


async def test_health_and_unknown_paths_pass_through_with_status_and_headers() -> None:
    async with gateway() as (_, gw), httpx.AsyncClient() as http:
        ok = await http.get(gw.url + "/health")
        down = await http.get(gw.url + "/health?status=503")
        assert (ok.status_code, ok.text, ok.headers["x-engine"]) == (200, "h", "sim")
        assert down.status_code == 503
        r = await http.request(
            "PUT",
            gw.url + "/some/where?a=1&b=2",
            content=b"payload",
            headers={"X-Custom": "yes", "Keep-Alive": "timeout=1"},
        )
        assert r.status_code == 404
        assert r.content == b"nope:payload"
        assert r.headers["x-method"] == "PUT"
        assert r.headers["x-path"] == "/some/where?a=1&b=2"
        assert r.headers["x-got-custom"] == "yes"
        assert r.headers["x-got-hop"] == ""  # hop-by-hop headers are not forwarded...
        assert "keep-alive" not in r.headers  # ...in either direction
        assert await requests_total(gw, "chat", "ok") == 0  # pass-through is not inference
        gzipped = gzip.compress(b"squeezed")
        r = await http.post(gw.url + "/x", content=gzipped, headers={"Content-Encoding": "gzip"})
        assert r.content == b"nope:squeezed"


async def test_bookkeeping_failures_never_touch_the_response(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(self: Any, chunk: Any) -> bool:
        raise RuntimeError("bug")

    async with gateway() as (_, gw), httpx.AsyncClient() as http:
        body = {"messages": [], "stream": True}
        before = (await http.post(gw.url + CHAT, json=body)).content
        monkeypatch.setattr(stats.StreamTally, "feed", broken)
        after = (await http.post(gw.url + CHAT, json=body)).content
        assert after == before
        text = (await http.get(gw.metrics_url + "/metrics")).text
        assert 'specfleet_gateway_errors_total{stage="stream"} 1.0' in text
        assert await requests_total(gw, "chat", "ok") == 2


async def test_a_burst_read_at_once_is_relayed_once() -> None:
    async with gateway() as (_, gw), httpx.AsyncClient() as http:
        body = {"messages": [], "stream": True}  # the gateway asks for usage and strips it
        stream = (await http.post(gw.url + CHAT, json=body)).content
        burst = (await http.post(gw.url + CHAT, json=body, headers={"x-script": "burst"})).content
        assert burst == stream
        assert burst.count(b'"finish_reason": "stop"') == 1
        assert await requests_total(gw, "chat", "ok") == 2


async def test_metrics_port_serves_healthz_and_metrics() -> None:
    async with gateway() as (_, gw), httpx.AsyncClient() as http:
        assert (await http.get(gw.metrics_url + "/healthz")).status_code == 200
        r = await http.get(gw.metrics_url + "/metrics")
        assert r.headers["content-type"].startswith("text/plain")
        assert "specfleet_requests_total" in r.text


def write_config(directory: Path, classes: list[str], generation: int) -> None:
    """Writes like the kubelet: a new timestamped dir, then an atomic `..data` symlink swap."""
    data = directory / f"..{generation}"
    data.mkdir()
    config = {**CONFIG, "classes": [{"name": c} for c in classes], "defaultClass": classes[-1]}
    (data / "gateway.yaml").write_text(yaml.safe_dump(config))
    link = directory / "..data_tmp"
    link.symlink_to(data.name)
    link.replace(directory / "..data")
    if not (directory / "gateway.yaml").exists():
        (directory / "gateway.yaml").symlink_to("..data/gateway.yaml")


async def test_config_reload_swaps_classes_and_keeps_the_old_on_a_bad_file(
    tmp_path: Path,
) -> None:
    write_config(tmp_path, ["code", "chat"], 1)
    path = tmp_path / "gateway.yaml"
    watch = Watch(path, load_gateway_config, interval=0.05)
    async with (
        Upstream().serve() as upstream,
        running(load_gateway_config(path), upstream.url, watch=watch) as gw,
        httpx.AsyncClient() as http,
    ):
        write_config(tmp_path, ["math", "chat"], 2)
        await asyncio.sleep(0.3)
        await http.post(gw.url + CHAT, json={"messages": []}, headers={"x-specfleet-class": "math"})
        assert await requests_total(gw, "math", "ok") == 1

        (tmp_path / "..3").mkdir()
        (tmp_path / "..3" / "gateway.yaml").write_text("classes: not-a-list\n")
        (tmp_path / "..data_tmp").symlink_to("..3")
        (tmp_path / "..data_tmp").replace(tmp_path / "..data")
        await asyncio.sleep(0.3)
        await http.post(gw.url + CHAT, json={"messages": []}, headers={"x-specfleet-class": "math"})
        assert await requests_total(gw, "math", "ok") == 2  # still the old configuration
        text = (await http.get(gw.metrics_url + "/metrics")).text
        assert 'specfleet_gateway_errors_total{stage="config"} 1.0' in text


async def test_stop_drains_in_flight_streams_and_refuses_new_requests() -> None:
    config = GatewayConfig.model_validate(CONFIG)
    async with (
        Upstream().serve() as upstream,
        running(config, upstream.url) as gw,
        httpx.AsyncClient() as http,
    ):
        body = {"messages": [], "stream": True}
        pending = asyncio.create_task(
            http.post(gw.url + CHAT, json=body, headers={"x-script": "slow"})
        )
        await asyncio.sleep(0.2)
        stopping = asyncio.create_task(gw.stop())
        await asyncio.sleep(0.1)
        async with httpx.AsyncClient() as other:
            with pytest.raises(httpx.ConnectError):
                await other.get(gw.url + "/health")
        finished = await pending
        await stopping
    assert finished.content.count(b"data: ") == 21  # every event, then [DONE]
    assert upstream.finished == 1


OFF = {"include_usage": True, "continuous_usage_stats": False}


@pytest.mark.parametrize(
    ("body", "engine_default", "expected_options"),
    [
        ({"stream": True}, False, OFF),
        ({"stream": True}, True, OFF),  # no stream_options: neither engine sends usage
        ({"stream": True, "stream_options": {"include_usage": 0, "continuous_usage_stats": 1}},
         False, OFF),
        ({"stream": True, "stream_options": None}, False, OFF),
        # vLLM defaults include_usage to false even when stream_options is sent (issue 15)
        ({"stream": True, "stream_options": {}}, False, OFF),
        ({"stream": True, "stream_options": {"continuous_usage_stats": True}}, False, OFF),
        # TensorRT-LLM defaults it to true: the client gets the usage chunk as it is
        ({"stream": True, "stream_options": {}}, True, None),
        ({"stream": True, "stream_options": {"continuous_usage_stats": True}}, True, None),
        ({"stream": True, "stream_options": {"include_usage": None}}, True, OFF),
        ({"stream": True, "stream_options": {"include_usage": True}}, False, None),
        ({"stream": False}, False, None),
        ({}, False, None),
    ],
)  # fmt: skip
def test_usage_is_requested_only_when_the_engine_would_not_send_it(
    body: dict[str, Any], engine_default: bool, expected_options: dict[str, Any] | None
) -> None:
    raw = b"  " + json.dumps({**body, "messages": [{"content": "{x}"}]}).encode()
    injected = usage_injection(raw, json.loads(raw), engine_default)
    if expected_options is None:
        assert injected is None
        return
    assert injected is not None
    sent = json.loads(injected)
    assert sent["stream_options"] == expected_options
    assert {k: v for k, v in sent.items() if k != "stream_options"} == {
        k: v for k, v in json.loads(raw).items() if k != "stream_options"
    }
