"""The streaming reverse proxy in front of the engine (aiohttp handlers).

Inference requests (`POST /v1/chat/completions`, `/v1/completions`) are classified, forwarded
and relayed event by event while their statistics are read on the side; everything else passes
through untouched. Bookkeeping runs after the client has its bytes and never fails a request:
its errors are logged and counted in `specfleet_gateway_errors_total{stage}`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.abc import AbstractStreamWriter

from specfleet.api.gateway import GatewayConfig
from specfleet.api.spec import Engine
from specfleet.gateway.batch import InFlight
from specfleet.gateway.classify import Classifier, RequestView
from specfleet.gateway.exchange import Exchange, StreamReader, account
from specfleet.gateway.metrics import GatewayMetrics, RequestRecord
from specfleet.gateway.mirror import Mirroring
from specfleet.gateway.sse import SseSplitter
from specfleet.gateway.stats import summarize_body
from specfleet.gateway.upstream import EngineConnection, EngineError, EnginePool, Head
from specfleet.gateway.wire import (
    BadRequest,
    bad_request,
    openai_error,
    outcome_of,
    parse_request,
    response_headers,
    too_large,
    upstream_failure,
    upstream_headers,
    usage_injection,
)

log = logging.getLogger(__name__)

WRITE_HEADROOM = 32 * 1024
INFERENCE_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"})


@dataclass(frozen=True)
class ProxySettings:
    upstream: str
    """Base URL of the engine, e.g. `http://127.0.0.1:8000`."""
    connect_timeout: float = 1.5
    upstream_timeout: float = 600.0
    """Longest silence from the engine (a non-streaming answer arrives all at once)."""
    client_timeout: float = 60.0
    """Longest a client may take to send its body or to take a chunk of the answer."""
    stream_deadline: float = 3600.0
    """Longest a streamed answer may take from the request's arrival; then it is cut."""


@dataclass(frozen=True)
class Routing:
    """One configuration and its compiled classifier, swapped as a whole on reload."""

    config: GatewayConfig
    classifier: Classifier


class ClientGone(Exception):
    """The client disconnected or stopped reading."""


class UpstreamBroke(Exception):
    """The engine failed after the response had started; the client connection is cut."""


class PastDeadline(Exception):
    """A stream ran past `stream_deadline`; the client connection is cut."""


class Proxy:
    def __init__(
        self, config: GatewayConfig, settings: ProxySettings, metrics: GatewayMetrics
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.upstream = settings.upstream.rstrip("/")
        self.routing = Routing(config, Classifier(config))
        metrics.ensure_classes(self.routing.classifier.names)
        self._session: aiohttp.ClientSession | None = None
        self._engine: EnginePool | None = None
        self.in_flight = InFlight()
        self.mirroring = Mirroring(config, metrics)

    def apply(self, config: GatewayConfig) -> None:
        self.metrics.ensure_classes(c.name for c in config.classes)
        self.routing = Routing(config, Classifier(config))
        self.mirroring.apply(config)

    async def open(self) -> None:
        self._engine = EnginePool(
            self.upstream, self.settings.connect_timeout, self.settings.upstream_timeout
        )
        connector = aiohttp.TCPConnector(
            limit=4096,
            # Below the engines' own keep-alive (uvicorn: 5 s), so a pooled connection is never
            # one the engine is closing.
            keepalive_timeout=4.0,
        )
        timeout = aiohttp.ClientTimeout(
            total=None,
            sock_connect=self.settings.connect_timeout,
            sock_read=self.settings.upstream_timeout,
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=timeout,
            auto_decompress=False,
            cookie_jar=aiohttp.DummyCookieJar(),  # a proxy keeps no client's cookies
            skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type"),
        )
        await self.mirroring.open()

    async def close(self) -> None:
        await self.mirroring.close()
        if self._engine is not None:
            self._engine.close()
            self._engine = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        assert self._session is not None, "Proxy.open() first"
        return self._session

    @property
    def engine(self) -> EnginePool:
        assert self._engine is not None, "Proxy.open() first"
        return self._engine

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.method == "POST" and request.path in INFERENCE_PATHS:
            return await self._inference(request)
        return await self._passthrough(request)

    # -- pass-through --

    async def _passthrough(self, request: web.Request) -> web.StreamResponse:
        limit = self.routing.config.max_body_bytes
        try:
            raw = await self._read_body(request, limit)
        except ClientGone:
            return web.Response(status=400)
        if raw is None:
            return too_large(limit)
        try:
            async with self.session.request(
                request.method,
                self.upstream + request.path_qs,
                headers=upstream_headers(request.headers, identity=False),
                data=raw if raw or request.can_read_body else None,
                allow_redirects=False,
            ) as upstream:
                response = web.StreamResponse(
                    status=upstream.status,
                    reason=upstream.reason,
                    headers=response_headers(upstream.headers, keep_length=True),
                )
                try:
                    await self._prepare(response, request)
                    await self._relay_raw(request, upstream, response)
                except (ClientGone, UpstreamBroke):
                    upstream.close()
                    self._cut(request)
                return response
        except (aiohttp.ClientError, TimeoutError) as exc:
            return upstream_failure(exc)

    async def _relay_raw(
        self, request: web.Request, upstream: aiohttp.ClientResponse, response: web.StreamResponse
    ) -> None:
        try:
            async for data in upstream.content.iter_any():
                await self._write(request, response, data)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise UpstreamBroke(str(exc)) from exc
        await self._end(response)

    # -- inference --

    async def _inference(self, request: web.Request) -> web.StreamResponse:
        routing = self.routing
        # Until the engine has answered, a failure is the gateway's own.
        record = RequestRecord(class_name=routing.config.default_class, outcome="gateway_error")
        # Only derived counts (TensorRT-LLM) read the batch: vLLM reports its own per request.
        batch = self.in_flight.enter() if routing.config.engine == "tensorrt-llm" else None
        exchange = Exchange(
            request,
            None,
            record,
            time.perf_counter(),
            k=routing.config.num_speculative_tokens,
            drafting=routing.config.drafting,
            batch=batch,
        )
        try:
            return await self._exchange(exchange, routing)
        except asyncio.CancelledError:
            if not exchange.answered:
                record.outcome = "cancelled"
            raise
        except ClientGone:
            if not exchange.answered:
                record.outcome = "cancelled"
        except UpstreamBroke as exc:
            log.warning("engine failed mid-response: %s", exc)
            record.outcome = "upstream_error"
        except PastDeadline:
            deadline = self.settings.stream_deadline
            log.warning("a stream ran past its deadline (%.0f s); cut", deadline)
            record.outcome = "cancelled"
        except Exception as exc:  # the gateway's own bug: answer, count it, never blame the engine
            log.error("serving an inference request failed: %s", type(exc).__name__)
            self.metrics.error("request")
            record.outcome = "gateway_error"
            if exchange.response is None:
                return openai_error(500, "the gateway failed", "InternalServerError")
        finally:
            if batch is not None:
                self.in_flight.leave(batch)
            record.seconds = time.perf_counter() - exchange.started
            # Classified once the client has its answer: nothing on the way to the engine or
            # back waits for it.
            record.class_name = self._classify(routing, request, exchange.body)
            self._record(record)
            self.mirroring.offer(request, exchange.body, exchange.body_bytes, record.class_name)
        self._cut(request)
        return exchange.response or web.Response(status=499)

    async def _exchange(self, exchange: Exchange, routing: Routing) -> web.StreamResponse:
        request, record = exchange.request, exchange.record
        limit = routing.config.max_body_bytes
        raw = await self._read_body(request, limit)
        if raw is None:
            record.outcome = "client_error"
            return too_large(limit)
        exchange.body_bytes = len(raw)
        try:
            body = exchange.body = parse_request(raw)
        except BadRequest as exc:
            record.outcome = "client_error"
            return bad_request(exc)
        upstream_body = raw
        injected = usage_injection(raw, body, routing.config.engine == Engine.TENSORRT_LLM)
        if injected is not None:
            upstream_body = injected
            exchange.strip_usage = True
        headers = upstream_headers(request.headers, identity=True)
        try:
            connection = await self.engine.send("POST", request.path_qs, headers, upstream_body)
        except EngineError as exc:
            record.outcome = "upstream_error"
            return upstream_failure(exc)
        # Released unfinished (a failure, a cancellation), the connection is closed: the engine
        # sees the disconnect and aborts the request.
        try:
            try:
                head = await connection.response_head()
            except EngineError as exc:
                record.outcome = "upstream_error"
                return upstream_failure(exc)
            record.outcome = outcome_of(head.status)
            if head.content_type == "text/event-stream":
                return await self._relay_stream(exchange, connection, head)
            return await self._relay_body(exchange, connection, head)
        finally:
            self.engine.release(connection)

    def _classify(self, routing: Routing, request: web.Request, body: dict[str, Any] | None) -> str:
        try:
            view = RequestView(request.path, request.headers, body)
            return routing.classifier.classify(view)
        except Exception as exc:  # its message could quote a header: the type only
            log.error("classification failed (%s); using the default class", type(exc).__name__)
            self.metrics.error("request")
            return routing.config.default_class

    async def _relay_body(
        self, exchange: Exchange, connection: EngineConnection, head: Head
    ) -> web.StreamResponse:
        try:
            data = await connection.read_body()
        except EngineError as exc:
            exchange.record.outcome = "upstream_error"
            return upstream_failure(exc)
        response = web.StreamResponse(
            status=head.status,
            reason=head.reason,
            headers=response_headers(head.headers, keep_length=False),
        )
        response.content_length = len(data)
        exchange.response = response
        await self._prepare(response, exchange.request)
        await self._write(exchange.request, response, data)
        await self._end(response)
        if head.status < 300:
            self._account_body(exchange, data)
        return response

    async def _relay_stream(
        self, exchange: Exchange, connection: EngineConnection, head: Head
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            status=head.status,
            reason=head.reason,
            headers=response_headers(head.headers, keep_length=False),
        )
        exchange.response = response
        if exchange.request.version >= aiohttp.HttpVersion11:
            response.enable_chunked_encoding()  # as aiohttp would, but told: the relay frames
        writer = await self._prepare(response, exchange.request)
        writer.send_headers()  # the events are written to the client's transport directly
        reader = StreamReader(exchange, self.metrics)
        client = ClientStream(exchange.request, response.chunked, connection, reader)
        left = self.settings.stream_deadline - (time.perf_counter() - exchange.started)
        deadline = asyncio.timeout(left)
        try:
            try:
                async with deadline:
                    await self._relay_events(connection, client, writer)
            except TimeoutError:
                if deadline.expired():
                    raise PastDeadline from None
                raise
            rest = reader.release() + client.splitter.rest
            if rest:
                client.send(rest)
            await self._end(response)
        except (asyncio.CancelledError, ClientGone):
            # Clients (the openai one among them) hang up once they read [DONE], often before the
            # engine ends its response: that answer was whole, and the engine counted it.
            if reader.ended:
                exchange.answered = True
                reader.finish()
            raise
        reader.finish()
        return response

    async def _relay_events(
        self, connection: EngineConnection, client: ClientStream, writer: AbstractStreamWriter
    ) -> None:
        """Relays from the connection's callbacks; wakes only when the client falls behind."""
        try:
            connection.stream_to(client.feed)
            while not await connection.relayed():
                await self._drain(writer)
                connection.resume()
        except EngineError as exc:
            raise UpstreamBroke(str(exc)) from exc

    def _account_body(self, exchange: Exchange, data: bytes) -> None:
        try:
            summary = summarize_body(json.loads(data))
            account(exchange, summary)
        except Exception:
            log.exception("reading a response's statistics failed")
            self.metrics.error("response")

    # -- plumbing --

    async def _read_body(self, request: web.Request, limit: int) -> bytes | None:
        """The whole body, or None when it is larger than `limit`."""
        if request.content_length is not None and request.content_length > limit:
            return None
        if not request.can_read_body:
            return b""
        chunks: list[bytes] = []
        size = 0
        try:
            if request.content.is_eof():  # the whole body came with the request: no waiting
                raw = request.content.read_nowait()
                return raw if len(raw) <= limit else None
            async with asyncio.timeout(self.settings.client_timeout):
                while chunk := await request.content.readany():
                    size += len(chunk)
                    if size > limit:
                        return None
                    chunks.append(chunk)
        except TimeoutError as exc:
            raise ClientGone("the client did not send its body in time") from exc
        except (ConnectionError, aiohttp.ClientError) as exc:
            raise ClientGone(str(exc)) from exc
        return b"".join(chunks)

    async def _prepare(
        self, response: web.StreamResponse, request: web.Request
    ) -> AbstractStreamWriter:
        try:
            writer = await response.prepare(request)
        except ConnectionError as exc:
            raise ClientGone(str(exc)) from exc
        if writer is None:
            raise ClientGone("the client disconnected")
        return writer

    async def _drain(self, writer: AbstractStreamWriter) -> None:
        try:
            async with asyncio.timeout(self.settings.client_timeout):
                await writer.drain()
        except TimeoutError as exc:
            raise ClientGone("the client stopped reading") from exc
        except ConnectionError as exc:
            raise ClientGone(str(exc)) from exc

    async def _end(self, response: web.StreamResponse) -> None:
        try:
            await response.write_eof()
        except ConnectionError as exc:
            raise ClientGone(str(exc)) from exc

    async def _write(self, request: web.Request, response: web.StreamResponse, data: bytes) -> None:
        try:
            if _fits(request, data):
                await response.write(data)  # below the high-water mark: never waits
                return
            async with asyncio.timeout(self.settings.client_timeout):
                await response.write(data)
        except TimeoutError as exc:
            raise ClientGone("the client stopped reading") from exc
        except ConnectionError as exc:
            raise ClientGone(str(exc)) from exc

    def _record(self, record: RequestRecord) -> None:
        try:
            self.metrics.record(record)
        except Exception:
            log.exception("recording a request's metrics failed")
            self.metrics.error("metrics")

    @staticmethod
    def _cut(request: web.Request) -> None:
        """Close the client connection so it sees an incomplete response, not a clean end."""
        transport = request.transport
        if transport is not None:
            transport.close()


class ClientStream:
    """The client's side of a relayed stream, fed from the engine connection's callback: what
    a read completes is relayed in one write (the reader may hold or drop the usage chunk it
    asked for), then read on the side, so the client's next token never waits on parsing."""

    def __init__(
        self,
        request: web.Request,
        chunked: bool,
        connection: EngineConnection,
        reader: StreamReader,
    ) -> None:
        transport = request.transport
        if transport is None:
            raise ClientGone("the client disconnected")
        self.transport = transport
        self.high_water = transport.get_write_buffer_limits()[1]
        self.chunked = chunked
        self.connection = connection
        self.reader = reader
        self.splitter = SseSplitter()

    def feed(self, data: bytes) -> None:
        splitter = self.splitter
        whole = not splitter.rest  # then `data` is its events joined if nothing is left over
        events = splitter.feed(data)
        if not events:
            return
        now = time.perf_counter()
        reader = self.reader
        if whole and not splitter.rest and reader.skims(data, now):
            self.send(data)
            return
        if reader.may_drop(data):
            out = reader.take(events, now)
            if out:
                self.send(out)
            return
        out = events[0] if len(events) == 1 else b"".join(events)
        self.send(out)
        reader.relayed(events, out, now)

    def send(self, data: bytes) -> None:
        transport = self.transport
        if transport.is_closing():
            raise ClientGone("the client disconnected")
        transport.write(b"%x\r\n%b\r\n" % (len(data), data) if self.chunked else data)
        if transport.get_write_buffer_size() > self.high_water:
            self.connection.pause()  # until the client has read what is buffered


def _fits(request: web.Request, data: bytes) -> bool:
    """Whether writing `data` stays below the transport's high-water mark (64 KiB by default),
    so the write cannot wait on the client: the common case needs no timeout timer."""
    transport = request.transport
    if transport is None:
        return False
    return transport.get_write_buffer_size() + len(data) < WRITE_HEADROOM
