"""The gateway's own HTTP/1.1 client to the engine, for inference requests.

aiohttp's client costs a parser feed, a future, a task step and a re-armed read timer for
every chunk it receives. Here a response is read in the connection's `data_received`: its
chunked framing is decoded in the callback and, for a relayed stream, handed to a sink in the
same callback, so a chunk costs one callback and the sink's write. Silence from the engine is
checked by one timer per silence period, not one per chunk.

Connections are pooled (keep-alive, most recent first) and never retried: a request may have
reached the engine.

While a stream carries only plain token chunks, its sink may hand the reading to the native pump
(`relay/`, built by hack/relay.sh): it reads the engine's socket and writes the client's itself,
without entering Python per chunk, and hands back at the first chunk it cannot relay.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum

from multidict import CIMultiDict
from yarl import URL

try:
    from specfleet_relay import Pump as Pump
except ImportError:  # not built: every chunk is relayed in Python
    Pump = None  # type: ignore[assignment,misc]

MAX_HEAD_BYTES = 64 * 1024
_FORBIDDEN_HEADER_CHARS = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_NO_BODY = frozenset({204, 304})


class EngineError(Exception):
    """The engine's connection failed, closed early or answered something that is not HTTP."""


class EngineUnreachable(EngineError):
    """No connection to the engine (refused, unresolvable, or not within the connect timeout)."""


class EngineSilent(EngineError, TimeoutError):
    """The engine sent nothing for longer than the silence timeout."""


@dataclass(frozen=True)
class Head:
    """A response's status line and headers."""

    status: int
    reason: str
    headers: CIMultiDict[str]
    keep_alive: bool = True

    @property
    def content_type(self) -> str:
        value = self.headers.get("Content-Type", "application/octet-stream")
        return value.partition(";")[0].strip().lower()


class Framing(Enum):
    HEAD = "head"
    LENGTH = "length"
    CHUNKED = "chunked"
    UNTIL_CLOSE = "until close"
    DONE = "done"


Sink = Callable[[bytes], None]
PumpedBack = Callable[[bytes, float, int], None]
"""Takes what the pump hands back: bytes framed for the client that it did not write, when it
last relayed a token chunk, and how many it relayed."""


class EngineConnection(asyncio.Protocol):
    """One connection to the engine, carrying one exchange at a time."""

    def __init__(self, pool: EnginePool) -> None:
        self.pool = pool
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._pump: Pump | None = None
        self._pumped_back: PumpedBack | None = None
        self._begin()

    def _begin(self) -> None:
        self.framing = Framing.HEAD
        self.reusable = True
        self.head: Head | None = None
        self._buffer = b""
        self._left = 0
        """Body bytes still to come (LENGTH), or of the current chunk's data (CHUNKED)."""
        self._after_data = False
        """A chunk's data has been read: its CRLF comes next."""
        self._trailer = False
        self._body: list[bytes] = []
        self._sink: Sink | None = None
        self._on_head: Callable[[Head], None] | None = None
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._paused = False
        self._last_read = 0.0
        self._silence: asyncio.TimerHandle | None = None

    # -- the exchange, from the task's side --

    def send(self, request: bytes, body: bytes) -> None:
        assert self.transport is not None
        self._disarm_silence()
        self._begin()
        self.transport.writelines((request, body))
        self._last_read = self.loop.time()
        self._arm_silence()

    def on_head(self, hook: Callable[[Head], None]) -> None:
        """`hook` gets the response's head in the callback that reads it, before its body."""
        self._on_head = hook

    async def response_head(self) -> Head:
        while self.head is None:
            await self._wait()
        return self.head

    async def read_body(self) -> bytes:
        while self.framing is not Framing.DONE:
            await self._wait()
        return b"".join(self._body)

    def stream_to(self, sink: Sink) -> None:
        """Hands the body, what has come and what comes, to `sink` as it arrives."""
        body, self._body = self._body, []
        for data in body:
            sink(data)
        self._sink = sink

    async def relayed(self) -> bool:
        """Waits until the body has ended (True) or the sink paused the reading (False)."""
        while self.framing is not Framing.DONE and not self._paused:
            await self._wait()
        return self.framing is Framing.DONE

    def pause(self) -> None:
        """Stops reading from the engine (the client is behind); `relayed` returns."""
        if self._paused or self.transport is None:
            return
        self._paused = True
        self.transport.pause_reading()
        self._disarm_silence()
        self._wake()

    def resume(self) -> None:
        if not self._paused or self.transport is None:
            return
        self._paused = False
        self._last_read = self.loop.time()
        self._arm_silence()
        self.transport.resume_reading()

    def close(self) -> None:
        self._unpump()
        self._disarm_silence()
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    async def _wait(self) -> None:
        if self._error is not None:
            raise self._error
        waiter = self._waiter = self.loop.create_future()
        try:
            await waiter
        finally:
            self._waiter = None

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- the native pump --

    def pumpable(self) -> bool:
        """Whether the pump could take over now: a chunked stream being relayed, between two
        whole chunks, read in plain TCP."""
        return (
            Pump is not None
            and self._pump is None
            and self._sink is not None
            and self.framing is Framing.CHUNKED
            and self._between_chunks()
            and not self._paused
            and not self.pool.tls
        )

    def pump_to(self, client: asyncio.Transport, separator: bytes, back: PumpedBack) -> None:
        """Hands the reading to the pump, which writes plain token chunks to `client` itself,
        events ending in `separator`; `back` gets what it hands back, and the reading goes on
        here from where it stopped."""
        assert self.transport is not None and Pump is not None
        engine_fd = self.transport.get_extra_info("socket").fileno()
        pump = Pump(engine_fd, client.get_extra_info("socket").fileno(), separator)
        self.transport.pause_reading()
        self._pump, self._pumped_back = pump, back
        self.loop.add_reader(pump.engine_fd, self._pumped)

    def _pumped(self) -> None:
        pump = self._pump
        assert pump is not None and self.transport is not None
        try:
            handback = pump.pump()
            if handback is None:
                return
            unsent, unread = handback
            self._unpump(unsent)
            if not self._paused:
                self.transport.resume_reading()
            if unread:
                self.data_received(unread)
        except Exception as exc:  # the client's side failed (the sink's own exception)
            self._fail(exc)

    def _unpump(self, unsent: bytes = b"") -> None:
        """Ends the pump's turn; what it did, and `unsent`, go back to the sink."""
        pump, self._pump = self._pump, None
        if pump is None:
            return
        self.loop.remove_reader(pump.engine_fd)
        self._last_read = max(self._last_read, pump.last_read)
        pump.close()
        assert self._pumped_back is not None
        self._pumped_back(unsent, pump.last_token, pump.chunks)

    def _heard_at(self) -> float:
        """When the engine last sent bytes, to the pump or here."""
        pump = self._pump
        return self._last_read if pump is None else max(self._last_read, pump.last_read)

    # -- the protocol --

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self._unpump()
        self.closed = True
        self.pool.forget(self)
        if self.framing is Framing.UNTIL_CLOSE:
            self._end()
        elif self.framing is not Framing.DONE:
            reason = f": {exc}" if exc else ""
            self._fail(EngineError(f"the engine closed the connection{reason}"))
        self._disarm_silence()

    def data_received(self, data: bytes) -> None:
        self._last_read = self.loop.time()
        try:
            if self.framing is Framing.CHUNKED:
                self._read_chunked(data)
            else:
                self._read(data)
        except Exception as exc:  # a malformed response, or the sink's own failure
            self._fail(exc)

    def eof_received(self) -> bool:
        return False

    def _read(self, data: bytes) -> None:
        if self.framing is Framing.HEAD:
            self._read_head(data)
        elif self.framing is Framing.CHUNKED:
            self._read_chunked(data)
        elif self.framing is Framing.LENGTH:
            self._read_length(data)
        elif self.framing is Framing.UNTIL_CLOSE:
            self._deliver(data)
        else:
            self.reusable = False  # bytes after the response: the connection is not clean

    def _read_head(self, data: bytes) -> None:
        buffer = self._buffer + data
        end = buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(buffer) > MAX_HEAD_BYTES:
                raise EngineError("the engine's response head is too large")
            self._buffer = buffer
            return
        self._buffer = b""
        head = parse_head(buffer[:end])
        rest = buffer[end + 4 :]
        if 100 <= head.status < 200:  # an interim response: the real one follows
            if rest:
                self._read_head(rest)
            return
        self._start_body(head)
        self.head = head
        if self._on_head is not None:
            self._on_head(head)
        self._wake()
        if rest:
            self._read(rest)

    def _start_body(self, head: Head) -> None:
        headers = head.headers
        self.reusable = head.keep_alive
        length = headers.get("Content-Length")
        if head.status in _NO_BODY:
            self._end()
        elif "chunked" in headers.get("Transfer-Encoding", "").lower():
            self.framing = Framing.CHUNKED
            self._left = 0
        elif length is not None:
            if not length.isdigit():
                raise EngineError("the engine sent an invalid Content-Length")
            self.framing, self._left = Framing.LENGTH, int(length)
            if not self._left:
                self._end()
        else:
            self.framing, self.reusable = Framing.UNTIL_CLOSE, False

    def _read_length(self, data: bytes) -> None:
        if len(data) >= self._left:
            data, extra = data[: self._left], data[self._left :]
            self.reusable = self.reusable and not extra
            self._left = 0
            self._deliver(data)
            self._end()
            return
        self._left -= len(data)
        self._deliver(data)

    def _between_chunks(self) -> bool:
        """Nothing of a chunk is pending: the next byte starts a chunk's size line."""
        return not (self._buffer or self._left or self._after_data or self._trailer)

    def _read_chunked(self, data: bytes) -> None:
        if self._between_chunks():
            # The usual read: one whole chunk, as the engine wrote it.
            line_end = data.find(b"\r\n")
            if line_end > 0 and (line := data[:line_end]).isalnum():
                start = line_end + 2
                end = start + _chunk_size(line)
                if end > start and len(data) == end + 2 and data.endswith(b"\r\n"):
                    sink = self._sink
                    if sink is None:
                        self._body.append(data[start:end])
                    else:
                        sink(data[start:end])
                    return
        buffer = self._buffer + data if self._buffer else data
        pieces: list[bytes] = []
        start, size = 0, len(buffer)
        while start < size:
            if self._left:  # inside a chunk's data
                end = min(size, start + self._left)
                pieces.append(buffer[start:end])
                self._left -= end - start
                start = end
                self._after_data = not self._left
                continue
            if self._after_data:
                crlf = buffer[start : start + 2]
                if crlf != b"\r\n"[: len(crlf)]:
                    raise EngineError("the engine's chunked framing is broken")
                if len(crlf) < 2:
                    break
                start, self._after_data = start + 2, False
                continue
            line_end = buffer.find(b"\r\n", start)
            if line_end < 0:
                break
            line, start = buffer[start:line_end], line_end + 2
            if self._trailer:
                if not line:
                    self._end_chunked(pieces, clean=start == size)
                    return
                continue
            self._left = _chunk_size(line)
            self._trailer = not self._left
        self._buffer = buffer[start:]
        if len(self._buffer) > MAX_HEAD_BYTES:
            raise EngineError("the engine's chunked framing is broken")
        if pieces:
            self._deliver(pieces[0] if len(pieces) == 1 else b"".join(pieces))

    def _end_chunked(self, pieces: list[bytes], clean: bool) -> None:
        self._buffer = b""
        self.reusable = self.reusable and clean
        if pieces:
            self._deliver(b"".join(pieces))
        self._end()

    def _deliver(self, data: bytes) -> None:
        if self._sink is None:
            self._body.append(data)
        elif data:
            self._sink(data)

    def _end(self) -> None:
        self.framing = Framing.DONE
        self._disarm_silence()
        if self._paused and self.transport is not None:
            # The exchange is over: an idle connection must see the engine close it.
            self._paused = False
            self.transport.resume_reading()
        self._wake()

    def _fail(self, exc: BaseException) -> None:
        if self._error is None:
            self._error = exc
        self.reusable = False
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)
        self.close()

    # -- silence --

    def _arm_silence(self) -> None:
        self._disarm_silence()
        when = self._heard_at() + self.pool.silence_timeout
        self._silence = self.loop.call_at(when, self._check_silence)

    def _disarm_silence(self) -> None:
        if self._silence is not None:
            self._silence.cancel()
            self._silence = None

    def _check_silence(self) -> None:
        self._silence = None
        if self.loop.time() - self._heard_at() >= self.pool.silence_timeout:
            self._fail(EngineSilent("the engine did not answer in time"))
        else:
            self._arm_silence()


def parse_head(raw: bytes) -> Head:
    lines = raw.decode("latin-1").split("\r\n")
    version, _, rest = lines[0].partition(" ")
    code, _, reason = rest.partition(" ")
    if not version.startswith("HTTP/1.") or len(code) != 3 or not code.isdigit():
        raise EngineError("the engine's answer is not HTTP/1.x")
    headers: CIMultiDict[str] = CIMultiDict()
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise EngineError("the engine sent a malformed header")
        headers.add(name, value.strip())
    connection = headers.get("Connection", "").lower()
    http10 = version == "HTTP/1.0"
    keep_alive = "keep-alive" in connection if http10 else "close" not in connection
    return Head(int(code), reason, headers, keep_alive)


def _chunk_size(line: bytes) -> int:
    digits = line.partition(b";")[0].strip()
    if not digits.isalnum():  # int() would also take signs, underscores and spaces
        raise EngineError("the engine's chunked framing is broken")
    try:
        return int(digits, 16)
    except ValueError:
        raise EngineError("the engine's chunked framing is broken") from None


class EnginePool:
    """Keep-alive connections to one engine."""

    def __init__(
        self,
        base_url: str,
        connect_timeout: float,
        silence_timeout: float,
        keepalive: float = 4.0,
    ) -> None:
        url = URL(base_url)
        if url.scheme not in ("http", "https") or not url.host:
            raise ValueError(f"the engine's URL must be http(s)://HOST[:PORT], got {base_url!r}")
        self.base_url = base_url
        self.host = url.host
        self.port = url.port or (443 if url.scheme == "https" else 80)
        self.tls = url.scheme == "https"
        self.prefix = url.raw_path.rstrip("/")
        self.fixed_headers = _fixed_headers(url)
        self.connect_timeout = connect_timeout
        self.silence_timeout = silence_timeout
        self.keepalive = keepalive
        self._idle: dict[EngineConnection, float] = {}

    async def send(
        self, method: str, target: str, headers: Mapping[str, str], body: bytes
    ) -> EngineConnection:
        """A connection that has sent the request; give it back with `release`."""
        request = encode_request(method, self.prefix + target, self.fixed_headers, headers, body)
        connection = self._idle_connection() or await self._connect()
        connection.send(request, body)
        return connection

    def release(self, connection: EngineConnection) -> None:
        """Keeps a connection whose exchange ended cleanly; closes any other."""
        if connection.framing is Framing.DONE and connection.reusable and not connection.closed:
            self._idle[connection] = connection.loop.time()
        else:
            connection.close()

    def forget(self, connection: EngineConnection) -> None:
        self._idle.pop(connection, None)

    def close(self) -> None:
        idle, self._idle = self._idle, {}
        for connection in idle:
            connection.close()

    def _idle_connection(self) -> EngineConnection | None:
        while self._idle:
            connection, since = self._idle.popitem()
            fresh = connection.loop.time() - since < self.keepalive
            if fresh and connection.reusable and not connection.closed:
                return connection
            connection.close()
        return None

    async def _connect(self) -> EngineConnection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout):
                _, connection = await loop.create_connection(
                    lambda: EngineConnection(self), self.host, self.port, ssl=self.tls or None
                )
        except TimeoutError:
            raise EngineUnreachable(
                f"no connection to {self.host}:{self.port} within {self.connect_timeout} s"
            ) from None
        except OSError as exc:
            raise EngineUnreachable(f"cannot connect to {self.host}:{self.port}: {exc}") from None
        return connection


def _fixed_headers(url: URL) -> str:
    default_port = 443 if url.scheme == "https" else 80
    host = url.raw_host or ""
    if ":" in host:
        host = f"[{host}]"
    if url.explicit_port is not None and url.explicit_port != default_port:
        host = f"{host}:{url.explicit_port}"
    lines = f"Host: {host}\r\n"
    if url.user is not None:
        credentials = f"{url.user}:{url.password or ''}".encode("latin-1")
        lines += f"Authorization: Basic {base64.b64encode(credentials).decode()}\r\n"
    return lines


def encode_request(
    method: str, target: str, fixed: str, headers: Mapping[str, str], body: bytes
) -> bytes:
    """The request line and headers (the body is written after them as it is)."""
    if _FORBIDDEN_HEADER_CHARS.search(":".join(itertools.chain.from_iterable(headers.items()))):
        raise ValueError("a control character in a forwarded header")
    fields = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    head = f"{method} {target} HTTP/1.1\r\n{fixed}{fields}Content-Length: {len(body)}\r\n\r\n"
    return head.encode("utf-8", "surrogateescape")
