"""Running the gateway: the proxy port, the metrics port, the config watcher, graceful stop.

`GatewayServer` is the in-process API (tests, benchmarks); `run` is what the CLI calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web
from yarl import URL

from specfleet.api.gateway import SAMPLE_PATH, GatewayConfig
from specfleet.gateway.config import ConfigWatcher, Loader
from specfleet.gateway.listener import Listener
from specfleet.gateway.metrics import GatewayMetrics
from specfleet.gateway.proxy import Proxy, ProxySettings

log = logging.getLogger(__name__)

METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class ClientBytesFilter(logging.Filter):
    """aiohttp (the metrics port's server) logs a malformed request with its exception, whose
    message quotes the request's bytes (header lines, tokens in them): keep the exception's
    type, drop its text."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and record.exc_info[1] is not None:
            record.msg = f"{record.msg} ({type(record.exc_info[1]).__name__})"
            record.exc_info = None
            record.exc_text = None
        return True


CLIENT_BYTES_FILTER = ClientBytesFilter()
for _name in ("aiohttp.server", "aiohttp.web"):
    logging.getLogger(_name).addFilter(CLIENT_BYTES_FILTER)


@dataclass(frozen=True)
class Address:
    host: str
    port: int

    @classmethod
    def parse(cls, text: str) -> Address:
        """`HOST:PORT`, `[IPv6]:PORT` or `:PORT` (all interfaces)."""
        host, sep, port = text.rpartition(":")
        if not sep or not port.isdigit():
            raise ValueError(f"expected HOST:PORT, got {text!r}")
        host = host.strip("[]") or "0.0.0.0"
        return cls(host, int(port))


@dataclass(frozen=True)
class Watch:
    """Which file to reload the configuration from, and how."""

    path: Path
    loader: Loader
    interval: float = 2.0


class GatewayServer:
    def __init__(
        self,
        config: GatewayConfig,
        settings: ProxySettings,
        listen: Address,
        metrics_listen: Address,
        watch: Watch | None = None,
        shutdown_grace: float = 30.0,
    ) -> None:
        self.metrics = GatewayMetrics()
        self.proxy = Proxy(config, settings, self.metrics)
        self.listen = listen
        self.metrics_listen = metrics_listen
        self.watch = watch
        self.shutdown_grace = shutdown_grace
        self.port = 0
        self.metrics_port = 0
        self._listener: Listener | None = None
        self._metrics_runner: web.AppRunner | None = None
        self._watcher: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        return f"http://{_connect_host(self.listen.host)}:{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{_connect_host(self.metrics_listen.host)}:{self.metrics_port}"

    def metrics_app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get(SAMPLE_PATH, self.proxy.mirroring.sample)
        return app

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(
            body=self.metrics.exposition(), headers={"Content-Type": METRICS_CONTENT_TYPE}
        )

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def start(self) -> None:
        await self.proxy.open()
        self._listener = Listener(self.proxy, self.proxy.settings.client_timeout)
        self.port = await self._listener.start(self.listen.host, self.listen.port)
        self.metrics_port = await self._serve_metrics()
        if self.watch is not None:
            watcher = ConfigWatcher(
                self.watch.path,
                self.watch.loader,
                self.proxy.apply,
                on_error=lambda: self.metrics.error("config"),
                interval=self.watch.interval,
            )
            self._watcher = asyncio.create_task(watcher.run(), name="gateway-config-watch")
        log.info(
            "gateway listening on %s:%d (metrics %s:%d), upstream %s",
            self.listen.host, self.port, self.metrics_listen.host, self.metrics_port,
            URL(self.proxy.upstream).with_user(None),  # no credentials in logs
        )  # fmt: skip

    async def _serve_metrics(self) -> int:
        runner = self._metrics_runner = web.AppRunner(
            self.metrics_app(),
            access_log=None,
            handle_signals=False,
            shutdown_timeout=self.shutdown_grace,
            keepalive_timeout=75.0,
        )
        await runner.setup()
        address = self.metrics_listen
        await web.TCPSite(runner, address.host, address.port).start()
        return int(runner.addresses[0][1])

    async def stop(self) -> None:
        """Stops accepting, lets in-flight requests finish for up to `shutdown_grace` seconds,
        then closes the metrics port and the upstream pool."""
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
            self._watcher = None
        if self._listener is not None:  # first: metrics stay scrapeable while it drains
            await self._listener.stop(self.shutdown_grace)
            self._listener = None
        if self._metrics_runner is not None:
            await self._metrics_runner.cleanup()
            self._metrics_runner = None
        await self.proxy.close()


@contextlib.asynccontextmanager
async def running(
    config: GatewayConfig,
    upstream: str,
    *,
    watch: Watch | None = None,
    shutdown_grace: float = 5.0,
    **settings: float,
) -> AsyncIterator[GatewayServer]:
    """An in-process gateway on loopback (ports chosen by the OS), for tests and benchmarks."""
    server = GatewayServer(
        config,
        ProxySettings(upstream=upstream, **settings),
        Address("127.0.0.1", 0),
        Address("127.0.0.1", 0),
        watch=watch,
        shutdown_grace=shutdown_grace,
    )
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


async def run(server: GatewayServer) -> None:
    """Serves until SIGTERM or SIGINT, then stops gracefully."""
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    await server.start()
    # Everything loaded so far lives as long as the process: keep the collector from rescanning
    # it, so collections triggered by per-chunk garbage stay short (pauses stall every stream).
    gc.freeze()
    await stopping.wait()
    log.info("stopping: draining in-flight requests for up to %.0f s", server.shutdown_grace)
    await server.stop()


def _connect_host(host: str) -> str:
    if host in ("0.0.0.0", "::", ""):
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host
