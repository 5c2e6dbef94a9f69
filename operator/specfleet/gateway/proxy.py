"""The streaming reverse proxy in front of the engine (the proxy port's handler).

Inference requests (`POST /v1/chat/completions`, `/v1/completions`) are classified, forwarded
and relayed event by event while their statistics are read on the side; everything else passes
through untouched. A request of a class the configuration routes to the plain pool is sent there
instead of to the local engine, and counted as the plain pool's; with no connection to the pool
it is served locally (and the fallback counted), and the pool is left alone for a back-off
(`gateway.plain`). A class on trial has a share of its requests served locally all the same,
drawn at random: the fleet's measure of whether speculation pays for it again. Bookkeeping
runs after the client has its bytes and never fails a request: its errors are logged and
counted in `specfleet_gateway_errors_total{stage}`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from specfleet import series
from specfleet.api.gateway import GatewayConfig
from specfleet.api.spec import Engine
from specfleet.gateway.batch import InFlight
from specfleet.gateway.classify import Classifier, RequestView
from specfleet.gateway.exchange import Exchange, StreamReader, account
from specfleet.gateway.metrics import GatewayMetrics, RequestRecord
from specfleet.gateway.mirror import Mirroring
from specfleet.gateway.plain import NotSent, PlainUpstream
from specfleet.gateway.request import Refused, Request
from specfleet.gateway.sse import SseSplitter
from specfleet.gateway.stats import summarize_body
from specfleet.gateway.upstream import (
    EngineConnection,
    EngineError,
    EnginePool,
    Head,
    Pump,
)
from specfleet.gateway.wire import (
    BadRequest,
    bad_request,
    openai_error,
    outcome_of,
    parse_request,
    response_headers,
    upstream_failure,
    upstream_headers,
    usage_injection,
)

log = logging.getLogger(__name__)

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
    plain: PlainUpstream | None = None
    """The plain pool, when the configuration routes classes to it."""
    routed: frozenset[str] = frozenset()
    """The classes it serves."""
    trial: Mapping[str, float] = field(default_factory=dict)
    """The share of a routed class's requests served locally instead."""


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
        self.routing = self._routing(config, None)
        metrics.ensure_classes(self.routing.classifier.names)
        self._session: aiohttp.ClientSession | None = None
        self._engine: EnginePool | None = None
        self.in_flight = InFlight()
        self.mirroring = Mirroring(config, metrics)
        self.trial_draws = random.Random()
        """Which requests of a class on trial are served locally: drawn from nothing in the
        request, so no client chooses its pool. Seed it for a repeatable run."""

    def apply(self, config: GatewayConfig) -> None:
        self.metrics.ensure_classes(c.name for c in config.classes)
        self.routing = self._routing(config, self.routing.plain)
        self.mirroring.apply(config)

    def _routing(self, config: GatewayConfig, plain: PlainUpstream | None) -> Routing:
        """The configuration's routing; the plain pool's connections and back-off are kept
        while its URL holds (exchanges in flight give theirs back to the pool they came from)."""
        self.metrics.ensure_classes(config.routed(), series.PLAIN_POOL)
        route = config.plain_pool
        if plain is not None and (route is None or plain.url != route.url):
            plain.close()
            plain = None
        if plain is None and route is not None:
            settings = self.settings
            plain = PlainUpstream(route.url, settings.connect_timeout, settings.upstream_timeout)
        trial = route.trial if route else {}
        return Routing(config, Classifier(config), plain, config.routed(), trial)

    async def open(self) -> None:
        if Pump is None:
            log.warning(
                "the native pump is not built (hack/relay.sh): every chunk is relayed in Python"
            )
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
        if self.routing.plain is not None:
            self.routing.plain.close()
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

    @property
    def body_limit(self) -> int:
        return self.routing.config.max_body_bytes

    def refused(self, status: int) -> None:
        self.metrics.count_refusal(status)

    async def handle(self, request: Request) -> None:
        if request.method == "POST" and request.path in INFERENCE_PATHS:
            await self._inference(request)
        else:
            await self._passthrough(request)

    # -- pass-through --

    async def _passthrough(self, request: Request) -> None:
        try:
            raw = await request.read()
        except Refused as exc:
            request.reply(exc.reply)
            return
        try:
            async with self.session.request(
                request.method,
                self.upstream + request.target,
                headers=upstream_headers(request.headers, identity=False),
                data=raw if request.has_body else None,
                allow_redirects=False,
            ) as upstream:
                headers = response_headers(upstream.headers)
                length = upstream.content_length
                request.start(upstream.status, upstream.reason or "", headers, length)
                try:
                    await self._relay_raw(request, upstream)
                except (ClientGone, UpstreamBroke):
                    upstream.close()  # and the client's connection is cut
        except (aiohttp.ClientError, TimeoutError) as exc:
            if not request.responded:
                request.reply(upstream_failure(exc))

    async def _relay_raw(self, request: Request, upstream: aiohttp.ClientResponse) -> None:
        try:
            async for data in upstream.content.iter_any():
                request.write(data)
                await self._drain(request)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise UpstreamBroke(str(exc)) from exc
        request.end()

    # -- inference --

    async def _inference(self, request: Request) -> None:
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
        # A response left unended (the client gone, the engine broken, the deadline passed)
        # has the client's connection cut, so the client sees it incomplete.
        try:
            await self._exchange(exchange, routing)
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
            if not request.responded:
                request.reply(openai_error(500, "the gateway failed", "InternalServerError"))
        finally:
            if batch is not None:
                self.in_flight.leave(batch)
            record.seconds = time.perf_counter() - exchange.started
            # Classified once the client has its answer, unless a route needed it first:
            # nothing on the way to the engine or back waits for it.
            if not exchange.classified:
                record.class_name = self._classify(routing, request, exchange.body)
            self._record(record)
            self.mirroring.offer(request, exchange.body, exchange.body_bytes, record.class_name)

    async def _exchange(self, exchange: Exchange, routing: Routing) -> None:
        request, record = exchange.request, exchange.record
        try:
            raw = await request.read()
            exchange.body_bytes = len(raw)
            body = exchange.body = parse_request(raw)
        except Refused as exc:
            record.outcome = "client_error"
            request.reply(exc.reply)
            return
        except BadRequest as exc:
            record.outcome = "client_error"
            request.reply(bad_request(exc))
            return
        upstream_body = raw
        injected = usage_injection(raw, body, routing.config.engine == Engine.TENSORRT_LLM)
        if injected is not None:
            upstream_body = injected
            exchange.strip_usage = True
        headers = upstream_headers(request.headers, identity=True)
        try:
            connection, pool = await self._send(exchange, routing, headers, upstream_body)
        except EngineError as exc:
            record.outcome = "upstream_error"
            request.reply(upstream_failure(exc))
            return
        client = ClientStream(request, connection, StreamReader(exchange, self.metrics))
        connection.on_head(client.open)
        # Released unfinished (a failure, a cancellation), the connection is closed: the engine
        # sees the disconnect and aborts the request.
        try:
            try:
                head = await connection.response_head()
            except EngineError as exc:
                record.outcome = "upstream_error"
                request.reply(upstream_failure(exc))
                return
            record.outcome = outcome_of(head.status)
            if client.opened:
                await self._relay_stream(exchange, connection, client)
            else:
                await self._relay_body(exchange, connection, head)
        finally:
            pool.release(connection)

    async def _send(
        self, exchange: Exchange, routing: Routing, headers: Mapping[str, str], body: bytes
    ) -> tuple[EngineConnection, EnginePool]:
        """Sends the request to the plain pool if its class is routed there (and not drawn for
        its trial) and the pool takes the connection, else to the local engine."""
        target = exchange.request.target
        plain = self._plain_pool_for(exchange, routing)
        if plain is not None:
            try:
                connection = await plain.send(target, headers, body)
            except NotSent as exc:
                self.metrics.count_fallback(exchange.record.class_name, exc.reason)
            else:
                # Served without speculation: nothing drafted to derive.
                exchange.k, exchange.drafting = None, None
                exchange.record.pool = series.PLAIN_POOL
                return connection, plain.engines
        return await self.engine.send("POST", target, headers, body), self.engine

    def _plain_pool_for(self, exchange: Exchange, routing: Routing) -> PlainUpstream | None:
        if routing.plain is None:
            return None
        record = exchange.record
        name = record.class_name = self._classify(routing, exchange.request, exchange.body)
        exchange.classified = True
        if name not in routing.routed:
            return None
        share = routing.trial.get(name)
        if share is not None and self.trial_draws.random() < share:
            return None
        return routing.plain

    def _classify(self, routing: Routing, request: Request, body: dict[str, Any] | None) -> str:
        try:
            view = RequestView(request.path, request.headers, body)
            return routing.classifier.classify(view)
        except Exception as exc:  # its message could quote a header: the type only
            log.error("classification failed (%s); using the default class", type(exc).__name__)
            self.metrics.error("request")
            return routing.config.default_class

    async def _relay_body(
        self, exchange: Exchange, connection: EngineConnection, head: Head
    ) -> None:
        request = exchange.request
        try:
            data = await connection.read_body()
        except EngineError as exc:
            exchange.record.outcome = "upstream_error"
            request.reply(upstream_failure(exc))
            return
        request.start(head.status, head.reason, response_headers(head.headers), len(data))
        request.write(data)
        request.end()
        if head.status < 300:
            self._account_body(exchange, data)

    async def _relay_stream(
        self, exchange: Exchange, connection: EngineConnection, client: ClientStream
    ) -> None:
        request, reader = exchange.request, client.reader
        left = self.settings.stream_deadline - (time.perf_counter() - exchange.started)
        deadline = asyncio.timeout(left)
        try:
            try:
                async with deadline:
                    await self._relay_events(connection, client, request)
            except TimeoutError:
                if deadline.expired():
                    raise PastDeadline from None
                raise
            rest = reader.release() + client.splitter.rest
            if rest:
                client.send(rest)
            request.end()
        except (asyncio.CancelledError, ClientGone):
            # Clients (the openai one among them) hang up once they read [DONE], often before the
            # engine ends its response: that answer was whole, and the engine counted it.
            if reader.ended:
                exchange.answered = True
                reader.finish()
            raise
        reader.finish()

    async def _relay_events(
        self, connection: EngineConnection, client: ClientStream, request: Request
    ) -> None:
        """Relays from the connection's callbacks; wakes only when the client falls behind."""
        try:
            while not await connection.relayed():
                await self._drain(request)
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

    async def _drain(self, request: Request) -> None:
        try:
            async with asyncio.timeout(self.settings.client_timeout):
                await request.drain()
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


class ClientStream:
    """The client's side of a relayed stream, fed from the engine connection's callback: what
    a read completes is relayed in one write (the reader may hold or drop the usage chunk it
    asked for), then read on the side, so the client's next token never waits on parsing."""

    def __init__(
        self, request: Request, connection: EngineConnection, reader: StreamReader
    ) -> None:
        self.request = request
        transport = self.transport = request.transport
        self.high_water = transport.get_write_buffer_limits()[1]
        self.write = request.write
        self.connection = connection
        self.reader = reader
        self.splitter = SseSplitter()
        self.opened = False

    def open(self, head: Head) -> None:
        """Starts the client's response when the engine's head is read, if it is a stream, so
        the events that came with it are relayed in the same callback, not after a task step."""
        if head.content_type != "text/event-stream":
            return
        self.request.start(head.status, head.reason, response_headers(head.headers), None)
        self.connection.stream_to(self.feed)
        self.opened = True

    def feed(self, data: bytes) -> None:
        splitter, reader = self.splitter, self.reader
        now = time.perf_counter()
        # Whole events (nothing left over before, an event's end last) of plain tokens: relayed
        # as they came, never split (what most reads of a long stream are).
        if splitter.ends_whole(data) and reader.skims(data, now):
            self.send(data)
            self._pump()
            return
        events = splitter.feed(data)
        if not events:
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
        self._check_open()
        self.write(data)
        self._hold_if_behind()

    def _pump(self) -> None:
        """Plain token chunks from here on go through the native pump, when it can take them:
        a chunked response, nothing waiting to be written."""
        separator = self.splitter.separator
        if (
            separator is not None
            and self.request.chunked
            and self.connection.pumpable()
            and not self.transport.get_write_buffer_size()
        ):
            self.connection.pump_to(self.transport, separator, self._pumped_back)

    def _pumped_back(self, unsent: bytes, last_token: float, chunks: int) -> None:
        reader = self.reader
        reader.last_token_t = max(reader.last_token_t, last_token)
        reader.metrics.count_pumped(chunks)
        if unsent:  # already framed for the client
            self._check_open()
            self.transport.write(unsent)
            self._hold_if_behind()

    def _check_open(self) -> None:
        if self.transport.is_closing():
            raise ClientGone("the client disconnected")

    def _hold_if_behind(self) -> None:
        if self.transport.get_write_buffer_size() > self.high_water:
            self.connection.pause()  # until the client has read what is buffered
