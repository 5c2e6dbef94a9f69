"""The native pump (`relay/`): plain token chunks relayed between the sockets without the
interpreter. Each stream is run twice, through the gateway with the pump and without it, on
both event loops the gateway may run on; the client must not see the difference, and neither
may the metrics, while the pump relays most of the chunks."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import uvloop
from prometheus_client.parser import text_string_to_metric_families

from specfleet.gateway import upstream
from specfleet.gateway.server import running
from test_gateway_hostile import CHAT, CONFIG

Write = tuple[float, bytes]
"""Seconds to wait, then bytes to write to the gateway's engine connection."""


def event(delta: dict[str, Any], finish: str | None = None) -> bytes:
    body = {"id": "c", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"


def chunked(payload: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(payload), payload)


def stream(tokens: int, pause: float) -> list[Write]:
    """A vLLM stream: role, tokens, a finish with an empty delta, usage, [DONE], the end."""
    usage = {"id": "c", "choices": [], "usage": {"completion_tokens": tokens}}
    writes = [(0.0, chunked(event({"role": "assistant", "content": ""})))]
    writes += [(pause, chunked(event({"content": f"t{i} "}))) for i in range(tokens)]
    writes += [(pause, chunked(event({}, "stop")))]
    writes += [(0.0, chunked(b"data: " + json.dumps(usage).encode() + b"\n\n"))]
    return [*writes, (0.0, chunked(b"data: [DONE]\n\n")), (0.0, b"0\r\n\r\n")]


def odd_reads(writes: list[Write]) -> list[Write]:
    """The same stream read unevenly: a chunk split across two reads, two chunks in one."""
    head = writes[12][1]
    odd = [*writes[:12], (0.01, head[:9]), (0.01, head[9:])]
    return [*odd, (0.01, writes[13][1] + writes[14][1]), *writes[15:]]


@dataclass
class Engine:
    """A raw HTTP/1.1 engine that writes a scripted chunked response."""

    writes: list[Write]
    cut: bool = False
    """The gateway hung up before the whole response was written."""
    url: str = ""

    async def answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if b"content-length" in line.lower()
        )
        await reader.readexactly(length)
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        try:
            for pause, data in self.writes:
                await asyncio.sleep(pause)
                writer.write(data)
                await writer.drain()
            await reader.read()  # until the gateway closes or reuses nothing more
        except ConnectionError:
            self.cut = True
        finally:
            writer.close()

    @asynccontextmanager
    async def serve(self) -> AsyncIterator[Engine]:
        server = await asyncio.start_server(self.answer, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        async with server:
            yield self


@dataclass
class Seen:
    status: int
    body: bytes
    metrics: dict[str, float]


async def relay(writes: list[Write], body: dict[str, Any] | None = None, **settings: Any) -> Seen:
    request = body or {"model": "llama", "messages": [], "stream": True}
    async with (
        Engine(writes).serve() as engine,
        running(CONFIG, engine.url, **settings) as gw,
        httpx.AsyncClient(timeout=10) as http,
    ):
        async with http.stream("POST", gw.url + CHAT, json=request) as response:
            got = b""
            try:
                async for data in response.aiter_bytes():
                    got += data
            except httpx.RemoteProtocolError:
                got += b"<cut>"
        text = (await http.get(gw.metrics_url + "/metrics")).text
    return Seen(response.status_code, got, samples(text))


def samples(text: str) -> dict[str, float]:
    wanted = ("specfleet_requests_total", "specfleet_output_tokens_total", "specfleet_tpot")
    seen: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith(wanted) or sample.name.startswith("specfleet_gateway_pumped"):
                key = sample.name + json.dumps(sample.labels, sort_keys=True)
                seen[key] = seen.get(key, 0.0) + sample.value
    return seen


def metric(seen: Seen, name: str, **labels: str) -> float:
    return sum(
        value
        for key, value in seen.metrics.items()
        if key.startswith(name + "{") and all(f'"{k}": "{v}"' in key for k, v in labels.items())
    )


LOOPS: dict[str, Callable[[Coroutine[Any, Any, Seen]], Seen]] = {
    "asyncio": asyncio.run,
    "uvloop": uvloop.run,
}


def both_ways(
    monkeypatch: pytest.MonkeyPatch, loop: str, scenario: Callable[[], Coroutine[Any, Any, Seen]]
) -> tuple[Seen, Seen]:
    """The scenario through the gateway with the pump, then without it."""
    pumped = LOOPS[loop](scenario())
    with monkeypatch.context() as patch:
        patch.setattr(upstream, "Pump", None)
        unpumped = LOOPS[loop](scenario())
    return pumped, unpumped


def same_answer(pumped: Seen, unpumped: Seen) -> None:
    assert pumped.status == unpumped.status == 200
    assert pumped.body == unpumped.body
    assert metric(pumped, "specfleet_requests_total", outcome="ok") == 1
    assert metric(unpumped, "specfleet_requests_total", outcome="ok") == 1
    tokens = "specfleet_output_tokens_total"
    assert metric(pumped, tokens) == metric(unpumped, tokens)
    assert metric(unpumped, "specfleet_gateway_pumped_chunks_total") == 0


def test_the_pump_is_built() -> None:
    assert upstream.Pump is not None, "the native pump is not installed: make setup builds it"


@pytest.mark.parametrize("loop", LOOPS)
def test_a_paced_stream_is_pumped_and_the_client_and_metrics_cannot_tell(
    monkeypatch: pytest.MonkeyPatch, loop: str
) -> None:
    pumped, unpumped = both_ways(monkeypatch, loop, lambda: relay(stream(30, 0.01)))
    same_answer(pumped, unpumped)
    assert pumped.body.count(b"t29 ") == 1 and b'"usage"' not in pumped.body  # asked by the gateway
    assert metric(pumped, "specfleet_output_tokens_total") == 30
    # The first token is read in Python; the pump relays every later one.
    assert metric(pumped, "specfleet_gateway_pumped_chunks_total") >= 25
    # Time per output token: the pump's last token time reaches the reader, so TPOT is the
    # pace of the stream, as without the pump (the finish chunk carries no token).
    for seen in (pumped, unpumped):
        tpot = metric(seen, "specfleet_tpot_seconds_sum") / metric(
            seen, "specfleet_tpot_seconds_count"
        )
        assert 0.008 < tpot < 0.05, tpot


@pytest.mark.parametrize("loop", LOOPS)
def test_uneven_reads_go_back_to_python_and_the_pump_takes_over_again(
    monkeypatch: pytest.MonkeyPatch, loop: str
) -> None:
    pumped, unpumped = both_ways(monkeypatch, loop, lambda: relay(odd_reads(stream(30, 0.01))))
    same_answer(pumped, unpumped)
    assert b"t29 " in pumped.body
    assert metric(pumped, "specfleet_gateway_pumped_chunks_total") >= 20


def test_an_engine_slower_than_the_silence_timeout_in_all_but_never_silent_is_not_cut() -> None:
    seen = asyncio.run(relay(stream(12, 0.1), upstream_timeout=0.35))
    assert seen.body.endswith(b"data: [DONE]\n\n")
    assert metric(seen, "specfleet_requests_total", outcome="ok") == 1
    assert metric(seen, "specfleet_gateway_pumped_chunks_total") >= 8


@pytest.mark.parametrize("loop", LOOPS)
def test_an_engine_silent_while_pumped_is_cut(monkeypatch: pytest.MonkeyPatch, loop: str) -> None:
    writes = [*stream(30, 0.01)[:12], (3.0, b"")]
    pumped, unpumped = both_ways(monkeypatch, loop, lambda: relay(writes, upstream_timeout=0.3))
    for seen in (pumped, unpumped):
        assert seen.body.endswith(b"<cut>")
        assert metric(seen, "specfleet_requests_total", outcome="upstream_error") == 1
    assert pumped.body == unpumped.body
    # The pump's turn ended by the cut, not by a hand-back: its chunks are counted all the same.
    assert metric(pumped, "specfleet_gateway_pumped_chunks_total") >= 8


def test_a_stream_past_its_deadline_while_pumped_is_cut() -> None:
    seen = asyncio.run(relay(stream(200, 0.01), stream_deadline=0.4))
    assert seen.body.endswith(b"<cut>") and b"t5 " in seen.body
    assert metric(seen, "specfleet_requests_total", outcome="cancelled") == 1


def test_a_client_that_stops_reading_a_pumped_stream_is_dropped() -> None:
    token = chunked(event({"content": "x" * 2000}))
    writes = stream(2, 0.0)[:3] + [(0.0, token)] * 20000

    async def scenario() -> tuple[bool, Seen]:
        engine = Engine(writes)
        async with (
            engine.serve(),
            running(CONFIG, engine.url, client_timeout=0.3) as gw,
        ):
            reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
            body = b'{"messages": [], "stream": true}'
            writer.write(b"POST %b HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%b" % (
                CHAT.encode(), len(body), body))  # fmt: skip
            await reader.read(100)  # the response starts; then the client stops reading
            for _ in range(100):
                if engine.cut:
                    break
                await asyncio.sleep(0.05)
            writer.close()
            async with httpx.AsyncClient() as http:
                text = (await http.get(gw.metrics_url + "/metrics")).text
        return engine.cut, Seen(0, b"", samples(text))

    cut, seen = uvloop.run(scenario())
    assert cut  # the engine's request was cancelled
    assert metric(seen, "specfleet_requests_total", outcome="cancelled") == 1
    assert metric(seen, "specfleet_gateway_pumped_chunks_total") > 0
