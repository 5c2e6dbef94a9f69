"""A client's request to the proxy port, as the gateway's own server hands it to the proxy: its
head, its body (gathered, decoded and bounded as it arrives) and the writing of its response,
straight to the client's transport."""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Iterable, Mapping
from http import HTTPStatus
from typing import Protocol
from urllib.parse import unquote

from multidict import CIMultiDict

from specfleet.gateway.wire import BadRequest, Reply, bad_request, too_large


class Conversation(Protocol):
    """What a request needs of its client connection (`connection.ClientConnection`)."""

    transport: asyncio.Transport | None

    @property
    def draining(self) -> bool: ...

    def stop_reading(self) -> None: ...

    def answered(self, request: Request) -> None: ...

    async def drained(self) -> None: ...


# zlib's window bits for each content coding the gateway decodes.
DECODED = {"gzip": 31, "x-gzip": 31, "deflate": 15}
BODYLESS = frozenset({204, 304})
REASONS = {s.value: s.phrase for s in HTTPStatus}


class Refused(Exception):
    """A body the gateway will not forward: too large, or in a coding it cannot read. The
    connection closes after the answer, as the rest of the body cannot be read past."""

    def __init__(self, reply: Reply) -> None:
        super().__init__(reply.status)
        self.reply = reply


class Request:
    """One request on a client connection."""

    def __init__(
        self,
        connection: Conversation,
        method: str,
        target: str,
        version: str,
        headers: CIMultiDict[str],
        keep_alive: bool,
        limit: int,
    ) -> None:
        self.connection = connection
        self.method = method
        self.target = target
        """The path and query, as the client sent them: what is forwarded."""
        raw_path = target.partition("?")[0]
        self.path = unquote(raw_path) if "%" in raw_path else raw_path
        """The decoded path: what is routed and classified on."""
        self.version = version
        self.headers = headers
        self.keep_alive = keep_alive
        self.has_body = "Transfer-Encoding" in headers or headers.get("Content-Length", "0") != "0"
        self.complete = False
        self.problem: Refused | None = None
        self._limit = limit
        self._size = 0
        self._chunks: list[bytes] = []
        self._decoder: zlib._Decompress | None = None
        self._waiter: asyncio.Future[None] | None = None
        self.responded = False
        """The response's head has been sent."""
        self.finished = False
        self.chunked = False
        self._head_only = method == "HEAD"
        self._check_body_head()

    @property
    def transport(self) -> asyncio.Transport:
        transport = self.connection.transport
        assert transport is not None
        return transport

    # -- the body --

    def _check_body_head(self) -> None:
        length = self.headers.get("Content-Length")
        if length is not None and int(length) > self._limit:  # llhttp has checked its digits
            self.refuse(too_large(self._limit))
        coding = self.headers.get("Content-Encoding", "identity").strip().lower()
        if coding in DECODED:
            self._decoder = zlib.decompressobj(DECODED[coding])
        elif coding != "identity":
            message = "this Content-Encoding is not supported: send the body as gzip or deflate"
            self.refuse(bad_request(BadRequest(message), close=True))

    def take(self, data: bytes) -> None:
        """Body bytes as they arrive (the parser has undone the chunked framing)."""
        if self.problem is not None:
            return
        decoder = self._decoder
        if decoder is not None:
            try:  # never more than one byte past the limit, whatever the ratio (no bombs)
                data = decoder.decompress(data, self._limit + 1 - self._size)
            except zlib.error:
                self.refuse(_undecodable())
                return
        self._size += len(data)
        if self._size > self._limit:
            self.refuse(too_large(self._limit))
            return
        self._chunks.append(data)

    def end_body(self) -> None:
        decoder = self._decoder
        if decoder is not None and self._size and not (decoder.eof and not decoder.unused_data):
            self.refuse(_undecodable())
        self.complete = True
        self._wake()

    async def read(self) -> bytes:
        """The whole body, decoded; Refused if the gateway will not forward it."""
        if not self.complete and self.problem is None:
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        if self.problem is not None:
            raise self.problem
        chunks = self._chunks
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def refuse(self, reply: Reply) -> None:
        if self.problem is None:
            self.problem = Refused(reply)
            self.keep_alive = False
            self._chunks = []
            self.connection.stop_reading()
            self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- the response --

    def start(
        self, status: int, reason: str, headers: Mapping[str, str], length: int | None
    ) -> None:
        """Sends the response's head. Without a `length` the body is chunked (HTTP/1.1) or
        ends with the connection (HTTP/1.0)."""
        keep_alive = self.keep_alive and not self.connection.draining
        fields = list(headers.items())
        if length is not None:
            fields.append(("Content-Length", str(length)))
        elif self._head_only or status in BODYLESS or status < 200:
            pass
        elif self.version == "1.1":
            self.chunked = True
            fields.append(("Transfer-Encoding", "chunked"))
        else:
            keep_alive = False
        if not keep_alive:
            fields.append(("Connection", "close"))
        elif self.version == "1.0":
            fields.append(("Connection", "keep-alive"))
        self.keep_alive = keep_alive
        self.responded = True
        self.transport.write(response_head(self.version, status, reason, fields))
        if status in BODYLESS:
            self._head_only = True

    def write(self, data: bytes) -> None:
        if self._head_only or not data:
            return
        if self.chunked:
            data = b"%x\r\n%b\r\n" % (len(data), data)
        self.transport.write(data)

    def end(self) -> None:
        """Ends the response; the connection goes on to the client's next request."""
        if self.chunked:
            self.transport.write(b"0\r\n\r\n")
        self.finished = True
        self.connection.answered(self)

    def reply(self, reply: Reply) -> None:
        if reply.close:
            self.keep_alive = False
        headers = {"Content-Type": reply.content_type}
        self.start(reply.status, "", headers, len(reply.body))
        self.write(reply.body)
        self.end()

    async def drain(self) -> None:
        """Waits until the client has taken what is buffered for it."""
        await self.connection.drained()


def response_head(
    version: str, status: int, reason: str, fields: Iterable[tuple[str, str]]
) -> bytes:
    """A response's status line and header fields (its framing and Connection among them)."""
    lines = [f"HTTP/{version} {status} {reason or REASONS.get(status, '')}\r\n"]
    lines += [f"{name}: {value}\r\n" for name, value in fields]
    lines.append("\r\n")
    return "".join(lines).encode("utf-8", "surrogateescape")


def _undecodable() -> Reply:
    message = "the body is not what its Content-Encoding says: send it as that coding"
    return bad_request(BadRequest(message), close=True)
