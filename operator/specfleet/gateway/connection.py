"""The gateway's own HTTP/1.1 server connection on the proxy port, as an asyncio protocol.

aiohttp's server builds a request object, a URL, a route match, a payload stream and a
response object for every request: most of the gateway's CPU per request. Here llhttp (via
httptools, uvicorn's parser) parses the head in the connection's `data_received`, the body is
gathered in the same callbacks, and the handler writes its response straight to the client's
transport.

One request is answered at a time: pipelined requests wait, parsed, with reading paused. A
head that is malformed, too large or asks what the gateway does not do is answered by the
gateway in its own words (never the client's bytes), and the connection closes.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Protocol

import httptools
from multidict import CIMultiDict

from specfleet.gateway.request import Request, response_head
from specfleet.gateway.wire import Reply, openai_error

log = logging.getLogger(__name__)

MAX_HEAD_BYTES = 64 * 1024
LINGER = 2.0
"""How long a connection the gateway is closing waits for the client to close its side."""
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


class Handler(Protocol):
    @property
    def body_limit(self) -> int: ...

    async def handle(self, request: Request) -> None:
        """Answers the request. One that returns before ending its response has the
        connection cut, so the client sees an incomplete response, not a clean end."""

    def refused(self, status: int) -> None:
        """The server answered a request at its head, with `status`: counted, never handled."""


class Connections(Protocol):
    """What a connection needs of the port that accepted it (`listener.Listener`)."""

    handler: Handler
    loop: asyncio.AbstractEventLoop
    client_timeout: float
    keepalive: float
    draining: bool
    connections: set[ClientConnection]

    def forget(self, connection: ClientConnection) -> None: ...


class HeadRefused(Exception):
    """A head the gateway answers itself, then closes the connection."""

    def __init__(self, reply: Reply) -> None:
        super().__init__(reply.status)
        self.reply = reply


class StopParsing(Exception):
    """Raised in the parser's callbacks once the connection reads no more requests."""


def refusal(status: int, message: str) -> HeadRefused:
    return HeadRefused(openai_error(status, message, "BadRequestError", close=True))


MALFORMED = refusal(400, "malformed HTTP/1.1 request").reply
HEAD_TOO_LARGE = refusal(431, f"request head is larger than {MAX_HEAD_BYTES} bytes").reply
FAILED = openai_error(500, "the gateway failed", "InternalServerError", close=True)


class ClientConnection(asyncio.Protocol):
    def __init__(self, listener: Connections) -> None:
        self.listener = listener
        self.loop = listener.loop
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.current: Request | None = None
        """The request being answered."""
        self.waiting: deque[Request | Reply] = deque()
        """Requests parsed while another was answered, and the gateway's own answers."""
        self.parsing: Request | None = None
        """The request whose body is arriving."""
        self.latest: Request | None = None
        self.task: asyncio.Task[None] | None = None
        self.deadline: float | None = self.loop.time() + listener.keepalive
        """When the client's idling, or sending its head or body, has lasted too long."""
        self._stopped = False
        self._in_head = False
        self._head_bytes = 0
        self._head_read = 0
        self._url = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._writing_paused = False
        self._drained: asyncio.Future[None] | None = None

    # -- the transport's callbacks --

    @property
    def draining(self) -> bool:
        return self.listener.draining

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.listener.connections.add(self)
        if self.draining:  # accepted as the server stopped
            self._close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.listener.forget(self)
        self._stopped = True
        current = self.current
        if current is not None and not current.finished and self.task is not None:
            self.task.cancel()  # the engine sees its connection close and aborts the request
        if self._drained is not None and not self._drained.done():
            self._drained.set_exception(ConnectionResetError("the client disconnected"))

    def data_received(self, data: bytes) -> None:
        if self._stopped:
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            # Answered as a plain request (the gateway switches to no other protocol), the
            # connection's last.
            self.stop_reading()
            if self.latest is not None:
                self.latest.keep_alive = False
        except httptools.HttpParserCallbackError as exc:
            refused = exc.__context__
            if isinstance(refused, HeadRefused):
                self._refuse(refused.reply)
            elif not isinstance(refused, StopParsing):  # the gateway's bug: its type only
                log.error("reading a request failed: %s", type(refused).__name__)
                self._refuse(FAILED)
        except httptools.HttpParserError as exc:
            log.debug("a malformed request on the proxy port (%s)", type(exc).__name__)
            self._refuse(MALFORMED)
        if self._in_head and not self._stopped:
            # llhttp holds an unfinished header line itself: count what it may be holding.
            self._head_read += len(data)
            if self._head_read > MAX_HEAD_BYTES:
                self._refuse(HEAD_TOO_LARGE)

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    # -- the parser's callbacks --

    def on_message_begin(self) -> None:
        if self._stopped:
            raise StopParsing
        self._in_head = True
        self._head_bytes = self._head_read = 0
        self._url = b""
        self._headers = []
        if self.current is None:
            self.deadline = self.loop.time() + self.listener.client_timeout

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._grow_head(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name, value))
        self._grow_head(len(name) + len(value) + 4)

    def on_headers_complete(self) -> None:
        self._in_head = False
        request = self._request()
        self.parsing = self.latest = request
        self.waiting.append(request)
        self._next()

    def on_body(self, body: bytes) -> None:
        if self.parsing is not None:
            self.parsing.take(body)

    def on_message_complete(self) -> None:
        request, self.parsing = self.parsing, None
        if request is None:
            return
        request.end_body()
        if request is self.current:
            self.deadline = None
        elif self.current is not None:
            self._pause()  # a pipelined request waits for the one before it

    # -- requests --

    def _grow_head(self, size: int) -> None:
        self._head_bytes += size
        if self._head_bytes > MAX_HEAD_BYTES:
            raise HeadRefused(HEAD_TOO_LARGE)

    def _request(self) -> Request:
        parser = self.parser
        version = parser.get_http_version()
        if version not in ("1.1", "1.0"):
            raise refusal(400, "only HTTP/1.1 and HTTP/1.0 are served")
        headers: CIMultiDict[str] = CIMultiDict(
            (name.decode("latin-1"), value.decode("utf-8", "surrogateescape"))
            for name, value in self._headers
        )
        if version == "1.1" and "Host" not in headers:
            raise refusal(400, "an HTTP/1.1 request needs a Host header")
        coding = headers.get("Transfer-Encoding")
        if coding is not None and coding.strip().lower() != "chunked":
            raise refusal(400, "Transfer-Encoding must be chunked, or absent")
        expect = headers.get("Expect")
        if expect is not None and expect.lower() != "100-continue":
            raise refusal(417, "Expect must be 100-continue")
        return Request(
            self,
            parser.get_method().decode("ascii"),
            _target(self._url),
            version,
            headers,
            parser.should_keep_alive(),
            self.listener.handler.body_limit,
        )

    def _next(self) -> None:
        """Answers the next parsed request once the one before it is answered."""
        if self.current is not None or not self.waiting:
            return
        request = self.waiting.popleft()
        if isinstance(request, Reply):
            self._reply_and_close(request)
            return
        self.current = request
        if not self.waiting:
            self._resume()  # reading pauses only while parsed requests wait
        self.deadline = None  # the handler's own timeouts hold from here, the body's below
        if not request.complete:
            self.deadline = self.loop.time() + self.listener.client_timeout
        expects = request.version == "1.1" and "Expect" in request.headers
        if expects and not request.complete and request.problem is None:
            self.transport.write(CONTINUE)  # type: ignore[union-attr]
        self.task = self.loop.create_task(self._answer(request))

    async def _answer(self, request: Request) -> None:
        try:
            await self.listener.handler.handle(request)
        except asyncio.CancelledError:
            pass
        except Exception as exc:
            log.error("answering a request failed: %s", type(exc).__name__)
            if not request.responded and not self.transport.is_closing():  # type: ignore[union-attr]
                request.reply(FAILED)
        if not request.finished:
            self.cut()

    def answered(self, request: Request) -> None:
        """The response to `request` has ended: on to the next request, or close."""
        self.current = None
        if not request.keep_alive:
            self._hang_up()
        elif self.waiting:
            self._next()
        elif self._stopped or self.draining:
            self._hang_up()
        else:
            self._idle()

    def _idle(self) -> None:
        self.deadline = self.loop.time() + (
            self.listener.client_timeout if self._in_head else self.listener.keepalive
        )
        self._resume()

    def _refuse(self, reply: Reply) -> None:
        self.stop_reading()
        request, self.parsing = self.parsing, None
        if request is not None and not request.complete:
            request.refuse(reply)  # its body is broken: its handler answers
            return
        self.waiting.append(reply)
        self._next()

    def _reply_and_close(self, reply: Reply) -> None:
        transport = self.transport
        assert transport is not None
        self.listener.handler.refused(reply.status)
        fields = [
            ("Content-Type", reply.content_type),
            ("Content-Length", str(len(reply.body))),
            ("Connection", "close"),
        ]
        transport.write(response_head("1.1", reply.status, "", fields) + reply.body)
        self._hang_up()

    # -- flow --

    def stop_reading(self) -> None:
        """Parses nothing more from this client (what it sends is dropped): its connection
        closes after the answers due."""
        self._stopped = True

    def _pause(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.pause_reading()

    def _resume(self) -> None:
        if self.transport is not None and not self._stopped and not self.transport.is_closing():
            self.transport.resume_reading()

    async def drained(self) -> None:
        if self.transport is None or self.transport.is_closing():
            raise ConnectionResetError("the client disconnected")
        if self._writing_paused:
            self._drained = self.loop.create_future()
            await self._drained

    def drain(self) -> None:
        """The server is stopping: close when idle, or once the current answer is given."""
        if self.current is None and not self.waiting:
            self._close()

    def expire(self) -> None:
        """The client idled, or sent its head or body, for too long."""
        self._stopped = True
        self.abort()

    def cut(self) -> None:
        """Closes so the client sees an incomplete response, not a clean end."""
        self._close()

    def _hang_up(self) -> None:
        """Closes after whole answers. Closing at once, with bytes of the client's unread here
        (a refused body), would reset the connection under the answer: the write side is shut
        instead, and what the client still sends is dropped until it closes its side."""
        self._stopped = True
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if not transport.can_write_eof():
            self._close()
            return
        transport.write_eof()
        transport.resume_reading()
        self.deadline = self.loop.time() + LINGER

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def _close(self) -> None:
        self._stopped = True
        self.deadline = None
        if self.transport is not None:
            self.transport.close()


def _target(url: bytes) -> str:
    """The path and query of an origin-form or absolute-form target."""
    if not url.startswith(b"/"):
        if not url.startswith((b"http://", b"https://")):
            raise refusal(400, "the request target must be a path")
        parsed = httptools.parse_url(url)
        url = (parsed.path or b"/") + (b"?" + parsed.query if parsed.query else b"")
    return url.partition(b"#")[0].decode("latin-1")
