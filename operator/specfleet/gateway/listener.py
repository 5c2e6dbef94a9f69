"""The proxy port: accepts client connections, ends those that idle or stall too long, and
drains them on stop."""

from __future__ import annotations

import asyncio
import contextlib

from specfleet.gateway.connection import ClientConnection, Handler

KEEPALIVE = 75.0
"""How long a client's connection may idle between requests."""


class Listener:
    def __init__(self, handler: Handler, client_timeout: float, keepalive: float = KEEPALIVE):
        self.handler = handler
        self.client_timeout = client_timeout
        """How long a client may take to send a request's head, or its body."""
        self.keepalive = keepalive
        self.loop = asyncio.get_running_loop()
        self.connections: set[ClientConnection] = set()
        self.draining = False
        self._server: asyncio.Server | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._empty = asyncio.Event()

    async def start(self, host: str, port: int) -> int:
        """Listens; returns the port (the OS's choice for port 0)."""
        self._server = await self.loop.create_server(
            lambda: ClientConnection(self), host, port, backlog=1024, reuse_address=True
        )
        self._sweeper = asyncio.create_task(self._sweep(), name="gateway-client-deadlines")
        return int(self._server.sockets[0].getsockname()[1])

    async def _sweep(self) -> None:
        """One timer for every connection's deadline, not one per request."""
        period = min(1.0, self.client_timeout / 4)
        while True:
            await asyncio.sleep(period)
            now = self.loop.time()
            for connection in list(self.connections):
                if connection.deadline is not None and connection.deadline <= now:
                    connection.expire()

    def forget(self, connection: ClientConnection) -> None:
        self.connections.discard(connection)
        if not self.connections:
            self._empty.set()

    async def stop(self, grace: float) -> None:
        """Stops accepting; requests in flight may finish for up to `grace` seconds, then their
        connections are cut."""
        self.draining = True
        if self._server is not None:
            self._server.close()
        for connection in list(self.connections):
            connection.drain()
        if self.connections:
            self._empty.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._empty.wait(), grace)
        tasks = [c.task for c in self.connections if c.task is not None]
        for connection in list(self.connections):
            connection.abort()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
