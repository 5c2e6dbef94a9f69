"""The gateway's own HTTP/1.1 server on the proxy port: requests read however their bytes are
cut, pipelining, bodies (framings, codings, limits), refusals in the gateway's words,
timeouts, disconnects."""

from __future__ import annotations

import asyncio
import gzip
import json
import zlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httptools
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specfleet.gateway import connection as connection_module
from specfleet.gateway.connection import MAX_HEAD_BYTES, ClientConnection
from specfleet.gateway.listener import Listener
from specfleet.gateway.request import Refused, Request
from specfleet.gateway.wire import Reply
from test_gateway_edges import CHAT, gateway, requests_total
from test_gateway_upstream import Transport as EngineTransport
from test_gateway_upstream import cuts

LIMIT = 1000


class Echo:
    """Answers each request with what it read of it; `stream` answers with a stream that ends
    when the test says."""

    body_limit = LIMIT

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str | None, bytes]] = []
        self.cancelled = 0
        self.release = asyncio.Event()
        self.refusals: list[int] = []

    def refused(self, status: int) -> None:
        self.refusals.append(status)

    async def handle(self, request: Request) -> None:
        try:
            body = await request.read()
        except Refused as exc:
            request.reply(exc.reply)
            return
        self.seen.append((request.method, request.target, request.headers.get("X-N"), body))
        if request.path == "/stream":
            await self._stream(request)
            return
        answer = {"target": request.target, "n": request.headers.get("X-N"), "size": len(body)}
        request.reply(Reply(200, json.dumps(answer).encode()))

    async def _stream(self, request: Request) -> None:
        request.start(200, "OK", {"Content-Type": "text/event-stream"}, None)
        request.write(b"data: 1\n\n")
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        request.write(b"data: 2\n\n")
        request.end()


class Transport(EngineTransport):
    """A client's transport: what the server sends it, as one byte string."""

    def __init__(self) -> None:
        super().__init__()
        self.sent = bytearray()
        self.eof = False

    def write(self, data: Any) -> None:
        assert not self.eof
        self.sent += data

    def abort(self) -> None:
        self.closed = True

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.eof = True

    def get_write_buffer_size(self) -> int:
        return 0

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return (16384, 65536)


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes


def answers(raw: bytes) -> list[Answer]:
    """The responses in `raw`, in order (interim 100s included)."""
    out: list[Answer] = []

    class Collect:
        def on_message_begin(self) -> None:
            out.append(Answer(0, {}, b""))

        def on_header(self, name: bytes, value: bytes) -> None:
            out[-1].headers[name.decode().lower()] = value.decode()

        def on_headers_complete(self) -> None:
            out[-1].status = parser.get_status_code()

        def on_body(self, body: bytes) -> None:
            out[-1].body += body

    parser = httptools.HttpResponseParser(Collect())
    parser.feed_data(raw)
    return out


async def connected(handler: Echo | None = None) -> tuple[ClientConnection, Transport, Echo]:
    echo = handler or Echo()
    listener = Listener(echo, client_timeout=60.0)
    connection = ClientConnection(listener)
    transport = Transport()
    connection.connection_made(transport)
    return connection, transport, echo


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def feed(connection: ClientConnection, transport: Transport, pieces: list[bytes]) -> None:
    """Feeds as a transport would: nothing while reading is paused."""
    for piece in pieces:
        for _ in range(200):
            if not transport.paused:
                break
            await asyncio.sleep(0)
        assert not transport.paused, "reading stayed paused"
        connection.data_received(piece)
    await settle()


# ------------------------------------------------------------------ requests however cut


@dataclass
class Sent:
    method: str
    n: int
    body: bytes
    chunked: bool
    gzipped: bool

    def raw(self) -> bytes:
        body = gzip.compress(self.body) if self.gzipped else self.body
        head = f"{self.method} /p{self.n}?q={self.n} HTTP/1.1\r\nHost: x\r\nX-N: {self.n}\r\n"
        if self.gzipped:
            head += "Content-Encoding: gzip\r\n"
        if not self.chunked:
            return (head + f"Content-Length: {len(body)}\r\n\r\n").encode() + body
        half = len(body) // 2
        framed = b"".join(b"%x\r\n%b\r\n" % (len(p), p) for p in (body[:half], body[half:]) if p)
        return (head + "Transfer-Encoding: chunked\r\n\r\n").encode() + framed + b"0\r\n\r\n"

    def seen(self) -> tuple[str, str, str, bytes]:
        return (self.method, f"/p{self.n}?q={self.n}", str(self.n), self.body)


SENT = st.builds(
    Sent,
    method=st.sampled_from(["GET", "POST", "PUT"]),
    n=st.integers(min_value=0, max_value=999),
    body=st.binary(max_size=80),
    chunked=st.booleans(),
    gzipped=st.booleans(),
)


@settings(max_examples=150, deadline=None)
@given(
    sent=st.lists(SENT, min_size=1, max_size=3),
    points=st.lists(st.integers(min_value=0, max_value=10_000), max_size=12),
)
async def test_pipelined_requests_read_the_same_however_they_are_cut(
    sent: list[Sent], points: list[int]
) -> None:
    connection, transport, echo = await connected()
    await feed(connection, transport, cuts(b"".join(s.raw() for s in sent), points))
    assert echo.seen == [s.seen() for s in sent]
    got = answers(bytes(transport.sent))
    assert [a.status for a in got] == [200] * len(sent)
    assert [json.loads(a.body)["n"] for a in got] == [str(s.n) for s in sent]  # in order
    assert not transport.closed


async def test_a_request_split_at_every_byte() -> None:
    sent = [Sent("POST", 1, b'{"messages": []}', True, False), Sent("GET", 2, b"", False, False)]
    raw = b"".join(s.raw() for s in sent)
    connection, transport, echo = await connected()
    await feed(connection, transport, [raw[i : i + 1] for i in range(len(raw))])
    assert echo.seen == [s.seen() for s in sent]
    assert len(answers(bytes(transport.sent))) == 2


async def test_a_pipelined_request_waits_with_reading_paused() -> None:
    connection, transport, echo = await connected()
    connection.data_received(
        b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\nGET /next HTTP/1.1\r\nHost: x\r\n\r\n"
    )
    await settle()
    assert transport.paused  # the second request is parsed and waits: read no more
    assert [s[1] for s in echo.seen] == ["/stream"]
    echo.release.set()
    await settle()
    assert [s[1] for s in echo.seen] == ["/stream", "/next"]
    assert not transport.paused
    got = answers(bytes(transport.sent))
    assert got[0].body == b"data: 1\n\ndata: 2\n\n"
    assert json.loads(got[1].body)["target"] == "/next"


# ------------------------------------------------------------------ refusals


async def refused(raw: bytes, at_head: bool = True) -> Answer:
    """The one answer to `raw`: at its head, by the server (counted as refused), or to its
    body, by the handler."""
    connection, transport, echo = await connected()
    await feed(connection, transport, [raw])
    (answer,) = answers(bytes(transport.sent))
    assert answer.headers["connection"] == "close"
    assert transport.eof  # closed after the answer: its write side first
    assert echo.seen == []
    assert echo.refusals == ([answer.status] if at_head else [])
    return answer


def message(answer: Answer) -> str:
    return str(json.loads(answer.body)["error"]["message"])


@pytest.mark.parametrize(
    ("head", "status", "words"),
    [
        ("Content-Length: abc\r\n", 400, "malformed"),
        ("Content-Length: -1\r\n", 400, "malformed"),
        ("Content-Length: 2\r\nContent-Length: 3\r\n", 400, "malformed"),
        ("Content-Length: 2\r\nTransfer-Encoding: chunked\r\n", 400, "malformed"),
        ("Transfer-Encoding: gzip, chunked\r\n", 400, "Transfer-Encoding must be chunked"),
        ("Content-Length: 2\r\nExpect: 200-ok\r\n", 417, "Expect must be 100-continue"),
        ("X-Secret : sk-SECRET\r\n", 400, "malformed"),
    ],
)
async def test_a_bad_head_is_refused_in_the_gateways_words(
    head: str, status: int, words: str
) -> None:
    answer = await refused(f"POST /x HTTP/1.1\r\nHost: x\r\n{head}\r\n{{}}".encode())
    assert answer.status == status
    assert words in message(answer)
    assert b"SECRET" not in answer.body


@pytest.mark.parametrize(
    "raw",
    [
        b"GET /x\r\n\r\n",  # HTTP/0.9
        b"GET /x HTTP/1.1\r\n\r\n",  # no Host
        b"CONNECT engine:443 HTTP/1.1\r\nHost: x\r\n\r\n",
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",  # TLS
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
    ],
)
async def test_what_is_not_an_http_1_request_is_refused(raw: bytes) -> None:
    assert (await refused(raw)).status == 400


async def test_an_oversize_head_is_refused_whether_whole_or_trickled() -> None:
    many = "".join(f"X-{i}: {'a' * 100}\r\n" for i in range(1000))
    whole = await refused(f"GET /x HTTP/1.1\r\nHost: x\r\n{many}\r\n".encode())
    assert whole.status == 431
    assert str(MAX_HEAD_BYTES) in message(whole)
    connection, transport, _ = await connected()
    connection.data_received(b"GET /x HTTP/1.1\r\nHost: x\r\nX-Long: ")
    for _ in range(MAX_HEAD_BYTES // 4096 + 1):  # one header line, never ended
        connection.data_received(b"a" * 4096)
    (answer,) = answers(bytes(transport.sent))
    assert answer.status == 431


async def test_the_gateways_own_failure_reading_a_head_is_a_500(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*args: Any) -> Request:
        raise ValueError("sk-SECRET")

    monkeypatch.setattr(connection_module, "Request", broken)
    answer = await refused(b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n")
    assert answer.status == 500
    assert "ValueError" in caplog.text and "SECRET" not in caplog.text


async def test_the_request_target_is_a_path_even_in_absolute_form() -> None:
    connection, transport, echo = await connected()
    absolute = b"GET http://elsewhere:9/a/b?c=1 HTTP/1.1\r\nHost: x\r\n\r\n"
    await feed(connection, transport, [absolute])
    assert echo.seen[0][1] == "/a/b?c=1"  # forwarded to the engine, never to `elsewhere`


# ------------------------------------------------------------------ bodies


def post(body: bytes, *headers: str) -> bytes:
    lines = "".join(f"{h}\r\n" for h in headers)
    head = f"POST /x HTTP/1.1\r\nHost: x\r\n{lines}Content-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


@pytest.mark.parametrize(
    ("coding", "encode"),
    [("gzip", gzip.compress), ("x-gzip", gzip.compress), ("deflate", zlib.compress)],
)
async def test_compressed_bodies_are_decoded_and_bounded_decoded(coding: str, encode: Any) -> None:
    connection, transport, echo = await connected()
    await feed(connection, transport, [post(encode(b"squeezed"), f"Content-Encoding: {coding}")])
    assert echo.seen[0][3] == b"squeezed"
    bomb = encode(b"x" * (LIMIT * 100))  # small on the wire, large decoded
    assert len(bomb) < LIMIT
    answer = await refused(post(bomb, f"Content-Encoding: {coding}"), at_head=False)
    assert answer.status == 413


@pytest.mark.parametrize(
    ("body", "coding"),
    [(b"not gzip", "gzip"), (gzip.compress(b"{}")[:-4], "gzip"), (b"{}", "br"), (b"{}", "zz")],
)
async def test_a_body_in_a_coding_the_gateway_cannot_read_is_a_400(
    body: bytes, coding: str
) -> None:
    answer = await refused(post(body, f"Content-Encoding: {coding}"), at_head=False)
    assert answer.status == 400
    assert "Content-Encoding" in message(answer)


async def test_a_body_over_the_limit_is_refused_as_its_length_says_or_as_it_comes() -> None:
    answer = await refused(post(b"x" * (LIMIT + 1)), at_head=False)
    assert answer.status == 413
    assert str(LIMIT) in message(answer)
    chunks = b"".join(b"64\r\n" + b"x" * 100 + b"\r\n" for _ in range(11))
    chunked = b"POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks
    assert (await refused(chunked, at_head=False)).status == 413


async def test_expect_100_continue_is_answered_only_for_a_body_that_will_be_read() -> None:
    connection, transport, _ = await connected()
    head = b"POST /x HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n"
    await feed(connection, transport, [head])
    assert bytes(transport.sent) == b"HTTP/1.1 100 Continue\r\n\r\n"
    await feed(connection, transport, [b"{}"])
    assert [a.status for a in answers(bytes(transport.sent))] == [100, 200]
    too_big = head.replace(b"Length: 2", b"Length: %d" % (LIMIT + 1))
    answer = await refused(too_big, at_head=False)  # one answer: no 100 Continue before it
    assert answer.status == 413


# ------------------------------------------------------------------ responses


async def test_http_1_0_gets_a_stream_that_ends_with_the_connection() -> None:
    connection, transport, echo = await connected()
    echo.release.set()
    await feed(connection, transport, [b"GET /stream HTTP/1.0\r\n\r\n"])
    assert transport.sent.startswith(b"HTTP/1.0 200 OK\r\n")
    assert b"Connection: close\r\n" in transport.sent
    assert b"Transfer-Encoding" not in transport.sent
    assert transport.sent.endswith(b"\r\n\r\ndata: 1\n\ndata: 2\n\n")
    assert transport.eof


async def test_a_client_gone_mid_stream_cancels_its_handler() -> None:
    connection, transport, echo = await connected()
    await feed(connection, transport, [b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n"])
    connection.connection_lost(None)
    await settle()
    assert echo.cancelled == 1


async def test_a_handler_that_fails_answers_500_or_cuts() -> None:
    class Failing(Echo):
        async def handle(self, request: Request) -> None:
            if request.path == "/late":
                request.start(200, "OK", {}, None)
            raise RuntimeError("a bug")

    connection, transport, _ = await connected(Failing())
    await feed(connection, transport, [b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n"])
    (answer,) = answers(bytes(transport.sent))
    assert answer.status == 500 and answer.headers["connection"] == "close"
    connection, transport, _ = await connected(Failing())
    await feed(connection, transport, [b"GET /late HTTP/1.1\r\nHost: x\r\n\r\n"])
    assert transport.closed and not transport.eof  # cut: the stream is seen incomplete


# ------------------------------------------------------------------ over sockets


@asynccontextmanager
async def listening(
    client_timeout: float = 60.0, keepalive: float = 75.0
) -> AsyncIterator[tuple[Listener, Echo, int]]:
    echo = Echo()
    listener = Listener(echo, client_timeout=client_timeout, keepalive=keepalive)
    port = await listener.start("127.0.0.1", 0)
    try:
        yield listener, echo, port
    finally:
        echo.release.set()
        await listener.stop(grace=1.0)


async def exchange(port: int, raw: bytes) -> bytes:
    """What the server sends until it closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw)
    await writer.drain()
    try:
        return await asyncio.wait_for(reader.read(), 3.0)
    finally:
        writer.close()


async def test_stalled_heads_bodies_and_idle_connections_are_closed() -> None:
    async with listening(client_timeout=0.2, keepalive=0.4) as (_, echo, port):
        assert await exchange(port, b"GET /x HTTP/1.1\r\nHo") == b""
        assert await exchange(port, post(b"{}")[:-1]) == b""
        kept = await exchange(port, b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n")  # then idles
        assert [a.status for a in answers(kept)] == [200]
    assert len(echo.seen) == 1


async def test_a_refused_body_is_answered_whole_while_the_client_still_sends() -> None:
    async with listening() as (_, _, port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 10000000\r\n\r\n")
        for _ in range(20):
            writer.write(b"x" * 65536)
        answer = await asyncio.wait_for(reader.read(), 5)
        writer.close()
    (got,) = answers(answer)
    assert got.status == 413 and "larger than" in message(got)


async def test_stop_closes_idle_connections_and_lets_a_stream_finish() -> None:
    async with listening() as (listener, echo, port):
        idle_reader, _ = await asyncio.open_connection("127.0.0.1", port)
        streaming = asyncio.create_task(exchange(port, b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n"))
        await asyncio.sleep(0.1)
        stopping = asyncio.create_task(listener.stop(grace=2.0))
        assert await asyncio.wait_for(idle_reader.read(), 1) == b""
        with pytest.raises(OSError):
            await asyncio.open_connection("127.0.0.1", port)
        echo.release.set()
        (got,) = answers(await streaming)  # whole, and the connection closed after it
        await stopping
    assert got.body == b"data: 1\n\ndata: 2\n\n"


async def test_through_the_gateway_pipelined_requests_are_answered_in_order() -> None:
    body = b'{"messages": []}'
    raw = (
        b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
        + post(body).replace(b"/x", CHAT.encode())
        + b"GET /health?status=503 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    async with gateway() as (upstream, gw):
        got = answers(await exchange(gw.port, raw))
        assert [a.status for a in got] == [200, 200, 503]
        assert got[1].body.count(b"data: ") == 21
        assert upstream.bodies == [body]
        bad = post(b"not gzip", "Content-Encoding: gzip").replace(b"/x", CHAT.encode())
        assert answers(await exchange(gw.port, bad))[0].status == 400
        assert await requests_total(gw, "chat", "client_error") == 1  # the client's, counted
