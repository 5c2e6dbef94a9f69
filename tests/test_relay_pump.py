"""The native pump against the Python definition of a plain token chunk (`exchange.is_plain`):
for any read of chunks, the pump relays exactly the longest run of whole plain chunks at its
front, framed as one chunk, and hands back the rest from a chunk's start."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager

from hypothesis import given, settings
from hypothesis import strategies as st

from specfleet.gateway.exchange import is_plain
from specfleet.gateway.sse import SseSplitter
from specfleet.gateway.upstream import Pump

SEPARATOR = b"\n\n"
PAYLOADS = [
    b'data: {"choices":[{"delta":{"content":"a"},"finish_reason":null}]}\n\n',
    b'data: {"choices":[{"delta":{"content":"b"},"finish_reason": null}]}\n\n',
    b'data: {"choices":[{"delta":{},"finish_reason":"stop"}]}\n\n',
    b'data: {"choices":[],"usage":{"completion_tokens":3}}\n\n',
    b'data: {"object":"error","message":"x"}\n\n',
    b"data: [DONE]\n\n",
    b"data: x" * 3 + SEPARATOR,
    b": keep-alive\n\n",
    b'data: {"choices":[{"delta":{"content":"c"}}]}',
    b'data: {"choices":[{"delta":{"content":"d"},"finish_reason":null}]}\r\n\r\n',
]


def chunk(payload: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(payload), payload)


def plain(payload: bytes) -> bool:
    """What the Python relay decides for a read of one chunk's payload past the first token
    (`ClientStream.feed`): whole events (`SseSplitter.ends_whole`) that are plain."""
    splitter = SseSplitter()
    splitter.feed(SEPARATOR)  # the stream's separator, known from its first event
    return splitter.ends_whole(payload) and is_plain(payload)


@contextmanager
def pump() -> Iterator[tuple[Pump, socket.socket, socket.socket]]:
    engine, engine_side = socket.socketpair()
    client, client_side = socket.socketpair()
    assert Pump is not None, "the native pump is not installed: make setup builds it"
    relay = Pump(engine_side.fileno(), client_side.fileno(), SEPARATOR)
    try:
        yield relay, engine, client
    finally:
        relay.close()
        for end in (engine, engine_side, client, client_side):
            end.close()


def received(client: socket.socket) -> bytes:
    client.setblocking(False)
    try:
        return client.recv(1 << 20)
    except BlockingIOError:
        return b""


@settings(max_examples=300, deadline=None)
@given(
    payloads=st.lists(st.sampled_from(PAYLOADS), max_size=12),
    cut=st.integers(min_value=0, max_value=40),
)
def test_the_pump_relays_the_longest_run_of_whole_plain_chunks(
    payloads: list[bytes], cut: int
) -> None:
    read = b"".join(chunk(p) for p in payloads)
    read = read[: max(0, len(read) - cut)] if cut < 40 else read + b"0\r\n\r\n"
    if not read:
        return
    relayed: list[bytes] = []
    at = 0
    for p in payloads:
        whole = chunk(p)
        if not (read[at:].startswith(whole) and plain(p)):
            break
        relayed.append(p)
        at += len(whole)
    with pump() as (relay, engine, client):
        engine.sendall(read)
        handback = relay.pump()
        sent = received(client)
    unsent, unread = handback if handback is not None else (b"", b"")
    assert sent + unsent == (chunk(b"".join(relayed)) if relayed else b"")
    assert unread == read[at:]
    assert relay.chunks == len(relayed)
    assert (relay.last_token > 0) == bool(relayed)


def test_a_closed_engine_and_a_read_with_nothing_in_it() -> None:
    with pump() as (relay, engine, _):
        assert relay.pump() is None  # nothing to read: the pump goes on
        engine.close()
        assert relay.pump() == (b"", b"")  # the end: handed back for the transport to see
