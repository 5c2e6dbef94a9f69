"""One inference request in flight, and the reader that watches its stream go by.

The reader sits in the relay path, so it is built to cost little: it parses every event until
the first token, then only the events that can carry something it needs (a finish reason,
usage, an error), unless the request needs the whole output (JSON or tool-call validation).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from specfleet.api.gateway import Drafting
from specfleet.gateway.batch import BatchSpan
from specfleet.gateway.classify import has_tools, wants_json
from specfleet.gateway.metrics import GatewayMetrics, RequestRecord
from specfleet.gateway.quality import judge
from specfleet.gateway.request import Request
from specfleet.gateway.sse import DONE, data_payload
from specfleet.gateway.stats import ResponseSummary, StreamTally, spec_counts, tpot

log = logging.getLogger(__name__)


@dataclass
class Exchange:
    """One inference request in flight."""

    request: Request
    body: dict[str, Any] | None
    record: RequestRecord
    started: float
    body_bytes: int = 0
    k: int | None = None
    drafting: Drafting | None = None
    batch: BatchSpan | None = None
    """The engine's batch while this request was in flight."""
    strip_usage: bool = False
    """The gateway asked for the usage chunk on the client's behalf: remove it."""
    answered: bool = False
    """The client has the whole answer: a hang-up from here on is not a cancellation."""
    classified: bool = False
    """Its class is known before it is sent (a class may be routed to the plain pool)."""


def account(exchange: Exchange, summary: ResponseSummary) -> None:
    """Fills the request record from a finished response."""
    record = exchange.record
    record.output_tokens = summary.output_tokens
    record.finish_reasons = summary.finish_reasons()
    record.empty_answers = summary.empty_answers()
    record.spec = spec_counts(summary, exchange.k, exchange.drafting, exchange.batch)
    if exchange.body is not None:
        record.verdicts = judge(exchange.body, summary.contents(), summary.tool_calls())


def worth_parsing(payload: bytes) -> bool:
    """Whether chunks after the first token can carry a finish reason, usage (and vLLM's
    per-request metrics with it) or an error. False positives only cost a parse. `payload`
    may hold several events (a burst read at once): one finish among null ones counts."""
    if b'"usage"' in payload or b'"error"' in payload:  # also TensorRT-LLM's "object":"error"
        return True
    finishes = payload.count(b'"finish_reason"')
    if not finishes:
        return False
    nulls = payload.count(b'"finish_reason":null')
    if nulls < finishes:
        nulls += payload.count(b'"finish_reason": null')
    return finishes > nulls


def is_plain(events: bytes) -> bool:
    """Whether `events` (whole ones, joined) are only plain token chunks: ones the gateway may
    relay without parsing once the first token is read. `data:` events, no `[DONE]`, nothing
    `worth_parsing`. The one definition: the reader's skim and the native pump (`relay/`, a
    port tested against this function) decide with it."""
    return events.startswith(b"data:") and DONE not in events and not worth_parsing(events)


class StreamReader:
    """Reads a relayed stream's events on the side: times, usage, speculative stats, outputs.
    Drops the usage chunk the gateway asked for on the client's behalf; relays everything
    else byte for byte. A failure here stops the reading, never the relay.

    vLLM stamps `system_fingerprint` on the usage chunk when there is one, else on the finish
    chunks: while the usage chunk is to be dropped, finish chunks without it wait for it (it
    follows them at once) and get its fingerprint, so the client sees what vLLM would have
    sent it."""

    def __init__(self, exchange: Exchange, metrics: GatewayMetrics) -> None:
        self.exchange = exchange
        self.metrics = metrics
        body = exchange.body or {}
        keep_content = wants_json(body)
        self.tally = StreamTally(keep_content=keep_content)
        self.skim = not keep_content and not has_tools(body)
        self.first_token_t: float | None = None
        self.last_token_t = 0.0
        self.reading = exchange.body is not None
        self.held: list[bytes] = []
        """Finish chunks waiting for the dropped usage chunk's fingerprint."""
        self.ended = False
        """The engine's stream reached [DONE]."""

    def may_drop(self, data: bytes) -> bool:
        """Whether `take` could change an event of `data`: drop the usage chunk, hold a finish
        chunk for it."""
        if not self.exchange.strip_usage:
            return False
        return bool(self.held) or b'"usage"' in data or worth_parsing(data)

    def skims(self, events: bytes, now: float) -> bool:
        """Whether `events` (whole ones, joined) are plain (`is_plain`) past the first token,
        which `take` would relay as they are without parsing: then they are read here, at once."""
        if (
            self.skim
            and self.reading
            and self.first_token_t is not None
            and not self.held
            and is_plain(events)
        ):
            self.last_token_t = now
            return True
        return False

    def take(self, events: list[bytes], now: float) -> bytes:
        """The bytes to relay for these events."""
        if not self.reading and not self.exchange.strip_usage:
            return b"".join(events)
        return b"".join(self._relayed(event, now) for event in events)

    def relayed(self, events: list[bytes], out: bytes, now: float) -> None:
        """Reads events already relayed unchanged (`out` is them joined; none is held, or
        `may_drop` would have sent them to `take`)."""
        if not self.skims(out, now):
            self.take(events, now)

    def release(self) -> bytes:
        """Held finish chunks, as they came (the stream ended without a usage chunk)."""
        held, self.held = self.held, []
        return b"".join(held)

    def _relayed(self, event: bytes, now: float) -> bytes:
        payload = data_payload(event)
        if payload == DONE:
            self.ended = True
        if payload is None or payload == DONE:
            return self.release() + event if self.held else event
        if not self.reading:
            if b'"usage"' not in payload and not worth_parsing(payload):
                return event
        elif self.skim and self.first_token_t is not None and not worth_parsing(payload):
            self.last_token_t = now  # a plain token chunk
            return event
        try:
            chunk = json.loads(payload)
        except ValueError:
            return event
        if self.reading:
            self._read(chunk, now)
        if not self.exchange.strip_usage:
            return event
        if _is_usage_chunk(chunk):
            fingerprint = chunk.get("system_fingerprint")
            held, self.held = self.held, []
            return b"".join(_stamped(e, fingerprint) for e in held)
        if _finishes(chunk) and "system_fingerprint" not in chunk:
            self.held.append(event)
            return b""
        return event

    def _read(self, chunk: Any, now: float) -> None:
        try:
            if self.tally.feed(chunk):
                if self.first_token_t is None:
                    self.first_token_t = now
                self.last_token_t = now
        except Exception:
            log.exception("reading a stream chunk failed; relaying the rest unread")
            self.metrics.error("stream")
            self.reading = False

    def finish(self) -> None:
        """Called after the client has the whole stream."""
        record = self.exchange.record
        if self.first_token_t is not None:
            record.ttft = self.first_token_t - self.exchange.started
        if not self.reading:
            return
        summary = self.tally.summary
        if summary.error:
            record.outcome = "upstream_error"
        try:
            account(self.exchange, summary)
            if self.first_token_t is not None:
                record.tpot = tpot(self.first_token_t, self.last_token_t, summary.output_tokens)
                if self.skim:  # chunks past the first token went unread: no answer known empty
                    record.empty_answers = 0
        except Exception:
            log.exception("reading a stream's statistics failed")
            self.metrics.error("stream")


def _is_usage_chunk(chunk: Any) -> bool:
    return isinstance(chunk, dict) and chunk.get("choices") == [] and "usage" in chunk


def _finishes(chunk: Any) -> bool:
    choices = chunk.get("choices") if isinstance(chunk, dict) else None
    return isinstance(choices, list) and any(
        isinstance(c, dict) and c.get("finish_reason") is not None for c in choices
    )


def _stamped(event: bytes, fingerprint: Any) -> bytes:
    """The event with the fingerprint added as its chunk's last field, as vLLM writes it."""
    if not isinstance(fingerprint, str):
        return event
    end = event.rindex(b"}")
    field = b',"system_fingerprint":' + json.dumps(fingerprint).encode()
    return event[:end] + field + event[end:]
