"""The gateway's HTTP/1.1 client to the engine: response framing, read however the bytes are
cut, keep-alive, silence and broken answers."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specfleet.gateway.upstream import (
    EngineConnection,
    EngineError,
    EnginePool,
    EngineSilent,
    Framing,
    encode_request,
    parse_head,
)

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


class Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written: list[bytes] = []
        self.closed = False
        self.paused = False

    def writelines(self, data: Any) -> None:
        self.written += list(data)

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False


def connected(silence: float = 60.0) -> tuple[EngineConnection, EnginePool]:
    pool = EnginePool("http://engine:8000", connect_timeout=1.0, silence_timeout=silence)
    connection = EngineConnection(pool)
    connection.connection_made(Transport())
    connection.send(b"POST / HTTP/1.1\r\n\r\n", b"")
    return connection, pool


def chunked(*pieces: bytes, trailer: bytes = b"") -> bytes:
    framed = b"".join(b"%x\r\n%b\r\n" % (len(p), p) for p in pieces)
    return framed + b"0\r\n" + trailer + b"\r\n"


def cuts(data: bytes, points: list[int]) -> list[bytes]:
    edges = sorted({0, len(data), *(p % (len(data) + 1) for p in points)})
    return [data[a:b] for a, b in itertools.pairwise(edges)]


@settings(max_examples=200, deadline=None)
@given(
    pieces=st.lists(st.binary(min_size=1, max_size=40), max_size=6),
    points=st.lists(st.integers(min_value=0, max_value=10_000), max_size=12),
    extension=st.booleans(),
)
async def test_a_chunked_body_reads_the_same_however_it_is_cut(
    pieces: list[bytes], points: list[int], extension: bool
) -> None:
    connection, _ = connected()
    got: list[bytes] = []
    connection.stream_to(got.append)
    body = chunked(*pieces, trailer=b"X-Trailer: 1\r\n" if extension else b"")
    if extension:
        body = body.replace(b"\r\n", b";ext=1\r\n", 1) if pieces else body
    for data in cuts(HEAD + body, points):
        connection.data_received(data)
    assert b"".join(got) == b"".join(pieces)
    assert connection.framing is Framing.DONE
    assert connection.reusable
    assert await connection.relayed()


async def test_a_whole_chunk_per_read_is_handed_on_as_it_came() -> None:
    connection, _ = connected()
    got: list[bytes] = []
    connection.data_received(HEAD)
    connection.stream_to(got.append)
    for event in (b"data: 1\n\n", b"data: 2\n\n"):
        connection.data_received(b"%x\r\n%b\r\n" % (len(event), event))
    connection.data_received(b"0\r\n\r\n")
    assert got == [b"data: 1\n\n", b"data: 2\n\n"]
    assert connection.framing is Framing.DONE


async def test_what_comes_before_the_sink_is_handed_to_it_first() -> None:
    connection, _ = connected()
    connection.data_received(HEAD + b"3\r\nabc\r\n")
    head = await connection.response_head()
    assert (head.status, head.content_type) == (200, "text/event-stream")
    got: list[bytes] = []
    connection.stream_to(got.append)
    connection.data_received(b"2\r\nde\r\n0\r\n\r\n")
    assert got == [b"abc", b"de"]


@pytest.mark.parametrize(
    "framing",
    [b"-1\r\n", b"+1\r\nx\r\n", b"1_0\r\n", b" \r\n", b"zz\r\n", b"2\r\nabXY"],
)
async def test_broken_chunked_framing_fails_the_exchange(framing: bytes) -> None:
    connection, _ = connected()
    connection.data_received(HEAD)
    connection.stream_to(lambda data: None)
    connection.data_received(framing)
    with pytest.raises(EngineError):
        await connection.relayed()
    assert connection.closed


async def test_content_length_and_until_close_bodies() -> None:
    connection, pool = connected()
    connection.data_received(b"HTTP/1.1 500 Boom\r\nContent-Length: 5\r\n\r\nhel")
    connection.data_received(b"lo")
    assert await connection.read_body() == b"hello"
    head = await connection.response_head()
    assert (head.status, head.reason) == (500, "Boom")
    pool.release(connection)
    assert pool._idle_connection() is connection  # kept for the next request
    pool.release(connection)
    connection.data_received(b"HTTP/1.1 200 OK\r\n")  # said while idle: not clean any more
    assert pool._idle_connection() is None

    connection, pool = connected()
    connection.data_received(b"HTTP/1.1 200 OK\r\n\r\npart")
    connection.data_received(b" two")
    connection.connection_lost(None)
    assert await connection.read_body() == b"part two"
    pool.release(connection)
    assert pool._idle_connection() is None


async def test_interim_responses_are_skipped_and_no_body_statuses_end_at_once() -> None:
    connection, _ = connected()
    connection.data_received(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n")
    head = await connection.response_head()
    assert head.status == 204
    assert await connection.read_body() == b""


@pytest.mark.parametrize(
    ("status_line", "connection_header", "reusable"),
    [
        (b"HTTP/1.1 200 OK", b"", True),
        (b"HTTP/1.1 200 OK", b"Connection: close\r\n", False),
        (b"HTTP/1.0 200 OK", b"", False),
        (b"HTTP/1.0 200 OK", b"Connection: keep-alive\r\n", True),
    ],
)
async def test_keep_alive_follows_the_engine(
    status_line: bytes, connection_header: bytes, reusable: bool
) -> None:
    connection, _ = connected()
    head = status_line + b"\r\n" + connection_header + b"Content-Length: 0\r\n\r\n"
    connection.data_received(head)
    await connection.read_body()
    assert connection.reusable is reusable


@pytest.mark.parametrize(
    "answer",
    [b"SSH-2.0-OpenSSH\r\n\r\n", b"HTTP/1.1 2000 OK\r\n\r\n", b"HTTP/1.1 200 OK\r\nbad\r\n\r\n"],
)
async def test_an_answer_that_is_not_http_fails_the_exchange(answer: bytes) -> None:
    connection, _ = connected()
    connection.data_received(answer)
    with pytest.raises(EngineError):
        await connection.response_head()


async def test_an_engine_that_closes_mid_body_fails_the_exchange() -> None:
    connection, _ = connected()
    connection.data_received(HEAD + b"5\r\nab")
    connection.connection_lost(ConnectionResetError("reset"))
    with pytest.raises(EngineError, match="closed the connection"):
        await connection.read_body()


async def test_silence_fails_the_exchange_and_data_keeps_it_alive() -> None:
    connection, _ = connected(silence=0.15)
    connection.data_received(HEAD)
    for _ in range(4):
        await asyncio.sleep(0.06)
        connection.data_received(b"1\r\nx\r\n")
    with pytest.raises(EngineSilent):
        await asyncio.wait_for(connection.read_body(), 1.0)


async def test_a_paused_relay_wakes_the_task_and_stops_the_silence_clock() -> None:
    connection, _ = connected(silence=0.05)
    connection.data_received(HEAD)
    connection.stream_to(lambda data: connection.pause())
    connection.data_received(b"1\r\nx\r\n")
    assert await connection.relayed() is False
    assert connection.transport.paused  # type: ignore[union-attr]
    await asyncio.sleep(0.1)
    connection.resume()
    connection.data_received(b"0\r\n\r\n")
    assert await connection.relayed() is True


async def test_a_stream_that_ends_while_paused_leaves_the_connection_reading() -> None:
    connection, pool = connected()
    connection.data_received(HEAD)
    connection.stream_to(lambda data: connection.pause())
    connection.data_received(b"1\r\nx\r\n0\r\n\r\n")
    assert await connection.relayed() is True
    assert not connection.transport.paused  # type: ignore[union-attr]
    pool.release(connection)
    assert pool._idle_connection() is connection


def test_the_request_is_encoded_with_host_and_length_and_refuses_control_characters() -> None:
    raw = encode_request("POST", "/v1/x?a=1", "Host: e:8000\r\n", {"X-A": "b"}, b"{}")
    assert raw == (
        b"POST /v1/x?a=1 HTTP/1.1\r\nHost: e:8000\r\nX-A: b\r\nContent-Length: 2\r\n\r\n"
    )
    with pytest.raises(ValueError):
        encode_request("POST", "/", "", {"X-A": "b\r\nX-Injected: 1"}, b"")


def test_the_pool_speaks_to_the_urls_host_and_path() -> None:
    pool = EnginePool("http://u:p@engine:8000/base/", 1.0, 1.0)
    assert (pool.host, pool.port, pool.prefix) == ("engine", 8000, "/base")
    assert pool.fixed_headers.startswith("Host: engine:8000\r\nAuthorization: Basic ")
    assert EnginePool("http://[::1]", 1.0, 1.0).fixed_headers == "Host: [::1]\r\n"
    with pytest.raises(ValueError):
        EnginePool("unix:///sock", 1.0, 1.0)


def test_a_head_keeps_repeated_headers() -> None:
    head = parse_head(b"HTTP/1.1 200 OK\r\nSet-Cookie: a\r\nSet-Cookie: b\r\nX: y ")
    assert head.headers.getall("set-cookie") == ["a", "b"]
    assert head.headers["x"] == "y"
