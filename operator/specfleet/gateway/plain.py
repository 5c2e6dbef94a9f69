"""The plain pool as the proxy sends to it: its connections, and whether it is worth trying.

A pool that failed to connect is not tried again before its back-off has passed (`Backoff`):
its classes are served locally at once instead of each request waiting out a connect timeout
(a blackholed Service costs the whole timeout). One warning when it goes, one info line when it
is back; the requests served locally meanwhile are counted, not logged.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

from specfleet.gateway.backoff import Backoff
from specfleet.gateway.upstream import EngineConnection, EnginePool, EngineUnreachable

log = logging.getLogger(__name__)

UNREACHABLE = "unreachable"
"""A connection attempt failed."""
BACKING_OFF = "backing_off"
"""Not tried: the pool failed to connect and its back-off has not passed."""
FALLBACK_REASONS = (UNREACHABLE, BACKING_OFF)


class NotSent(Exception):
    """The request was not sent to the plain pool; `reason` is one of `FALLBACK_REASONS`."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class PlainUpstream:
    """The plain pool's engines, as the gateway sends to them."""

    def __init__(self, url: str, connect_timeout: float, silence_timeout: float) -> None:
        self.engines = EnginePool(url, connect_timeout, silence_timeout)
        self.backoff = Backoff(time.monotonic)

    @property
    def url(self) -> str:
        return self.engines.base_url

    async def send(self, target: str, headers: Mapping[str, str], body: bytes) -> EngineConnection:
        """A connection that has sent the request (give it back to `engines`); `NotSent` when
        the pool is not tried or cannot be reached."""
        attempt = self.backoff.admit()
        if attempt is None:
            raise NotSent(BACKING_OFF)
        try:
            connection = await self.engines.send("POST", target, headers, body)
        except EngineUnreachable as exc:
            if self.backoff.failed(attempt):
                log.warning(
                    "the plain pool is unreachable, serving its classes locally; trying it "
                    "again in %.0f s, then backing off up to %.0f s: %s",
                    self.backoff.delay, self.backoff.cap, exc,
                )  # fmt: skip
            raise NotSent(UNREACHABLE) from None
        except BaseException:
            self.backoff.abandoned(attempt)
            raise
        if self.backoff.succeeded():
            log.info("the plain pool at %s is reachable again: routing its classes there", self.url)
        return connection

    def close(self) -> None:
        self.engines.close()
