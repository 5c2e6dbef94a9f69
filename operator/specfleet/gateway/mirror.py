"""Mirroring a sample of the traffic to an experiment's arms (issue 18: the same traffic).

Off the client's path: once the client has its answer, the proxy offers the request
(`Mirror.offer`: no I/O, no await); a sampled one waits in a bounded queue, and a fixed pool of
workers sends it to every arm at once, streamed (so the arm's gateway times its first and every
output token), with the class the fleet gave it in the class header, so each arm's own gateway
measures it in the same class. A full queue drops the
request and counts it; so do an arm's failures. An arm that is slow or down costs the client
nothing: at worst the queue fills.

Sampling: the gateway numbers the requests it serves, and mirrors those whose number hashes
under their class's share. Deterministic, evenly spread, and no client can choose to be
mirrored or not.

Greedy requests (an explicit `temperature: 0`; vLLM's default is 1.0 unless the model's
generation config says otherwise, so an absent temperature is not greedy) have each arm's
output compared with the baseline arm's: exact match (texts and tool calls) and word-prefix
agreement, the share of leading words in common over the longer output's words (greedy outputs
that part once part for good, so their common prefix is what agrees). Responses are dropped
once compared.

The sample of prompts: when the mirror asks (`keep_sample`, an experiment with a capacity phase),
the workers also keep a uniform sample of each class's mirrored requests (reservoir sampling),
bounded in requests and bytes, in memory only, served as JSONL at `GET /mirror/sample` on the
metrics port for the operator to replay. It goes with the mirror: a configuration that stops
asking drops it.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import random
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from specfleet.api.gateway import (
    MIRRORED_HEADER,
    SAMPLE_EXPERIMENT_HEADER,
    GatewayConfig,
    Mirror,
    MirrorArm,
)
from specfleet.gateway.metrics import GatewayMetrics
from specfleet.gateway.quality import ToolCall
from specfleet.gateway.request import Request
from specfleet.gateway.sse import DONE, SseSplitter, data_payload
from specfleet.gateway.stats import ResponseSummary, StreamTally, summarize_body

log = logging.getLogger(__name__)

MAX_RESPONSE_BYTES = 4 * 1024 * 1024
"""An arm's answer longer than this is not compared (counted `unreadable`)."""
SAMPLE_BYTES = 1024 * 1024
"""The kept sample's bytes, shared evenly by the mirrored classes: what a ConfigMap holds."""
SAMPLE_CONTENT_TYPE = "application/jsonl"


@dataclass(frozen=True)
class Sampled:
    """A request waiting to be mirrored."""

    path: str
    class_name: str
    body: dict[str, Any]


@dataclass(frozen=True)
class Answer:
    """An arm's 2xx answer, read whole."""

    content_type: str
    body: bytes


@dataclass(frozen=True)
class Output:
    """What an arm answered: its choices' texts and tool calls."""

    contents: tuple[str | None, ...]
    calls: tuple[ToolCall, ...]

    def words(self) -> list[str]:
        texts = [text for text in self.contents if text]
        texts += [f"{call.name} {call.arguments}" for call in self.calls]
        return " ".join(texts).split()


def is_greedy(body: dict[str, Any]) -> bool:
    temperature = body.get("temperature")
    return (
        isinstance(temperature, int | float)
        and not isinstance(temperature, bool)
        and (temperature == 0)
    )


def word_prefix_agreement(baseline: list[str], arm: list[str]) -> float:
    """Leading words in common over the longer output's words; two empty outputs agree."""
    longest = max(len(baseline), len(arm))
    if not longest:
        return 1.0
    common = next(
        (i for i, (b, a) in enumerate(zip(baseline, arm, strict=False)) if b != a),
        min(len(baseline), len(arm)),
    )
    return common / longest


def arm_body(body: dict[str, Any]) -> bytes:
    """The request as an arm gets it: streamed, whatever the client asked, so that the arm's
    gateway measures its time to first token and per output token as the fleet's does (the
    client's stream options go; the arm's gateway asks for usage where its engine needs it)."""
    mirrored = {k: v for k, v in body.items() if k != "stream_options"}
    mirrored["stream"] = True
    return json.dumps(mirrored).encode()


def output_of(raw: bytes, content_type: str = "application/json") -> Output | None:
    """The texts and tool calls of an arm's answer: a stream of chunks or a whole body."""
    try:
        if content_type.startswith("text/event-stream"):
            summary = _streamed_summary(raw)
        else:
            summary = summarize_body(json.loads(raw))
    except ValueError:
        return None
    if summary.error or not summary.choices:
        return None
    return Output(tuple(summary.contents()), tuple(summary.tool_calls()))


def _streamed_summary(raw: bytes) -> ResponseSummary:
    tally = StreamTally(keep_content=True)
    for event in SseSplitter().feed(raw + b"\n\n"):
        payload = data_payload(event)
        if payload is not None and payload != DONE:
            tally.feed(json.loads(payload))
    return tally.summary


def sampled(number: int, share: float) -> bool:
    digest = hashlib.blake2b(number.to_bytes(8, "little"), digest_size=8).digest()
    return int.from_bytes(digest, "little") < share * 2**64


class Reservoir:
    """A uniform sample of each class's requests (Algorithm R): at most `size` requests and
    `class_bytes` bytes per class. A request whose line would overflow its class's bytes is not
    kept: under that bound the sample leans towards shorter prompts."""

    def __init__(self, size: int, class_bytes: int, rng: random.Random | None = None) -> None:
        self.size, self.class_bytes = size, class_bytes
        self._rng = rng or random.Random()
        self._lines: dict[str, list[bytes]] = {}
        self._bytes: dict[str, int] = {}
        self._seen: dict[str, int] = {}

    def offer(self, klass: str, body: dict[str, Any]) -> None:
        seen = self._seen[klass] = self._seen.get(klass, 0) + 1
        lines = self._lines.setdefault(klass, [])
        slot = len(lines) if len(lines) < self.size else self._rng.randrange(seen)
        if slot >= self.size:
            return
        line = json.dumps({**body, "class": klass}, separators=(",", ":")).encode() + b"\n"
        replaced = len(lines[slot]) if slot < len(lines) else 0
        size = self._bytes.get(klass, 0) - replaced + len(line)
        if size > self.class_bytes:
            return
        self._bytes[klass] = size
        if slot < len(lines):
            lines[slot] = line
        else:
            lines.append(line)

    def jsonl(self) -> bytes:
        return b"".join(line for lines in self._lines.values() for line in lines)


class ArmFailed(Exception):
    """An arm gave no readable answer; `reason` is the metric's label."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Mirroring:
    """The queue, the workers and the arms of the running configuration (swapped on reload)."""

    def __init__(self, config: GatewayConfig, metrics: GatewayMetrics) -> None:
        self.metrics = metrics.mirror
        self.gateway_metrics = metrics
        self.mirror: Mirror | None = None
        self.class_header = config.class_header
        self._queue: asyncio.Queue[Sampled] = asyncio.Queue()  # bounded by `offer`
        self._workers: list[asyncio.Task[None]] = []
        self._session: aiohttp.ClientSession | None = None
        self._served = 0
        self.reservoir: Reservoir | None = None
        self.apply(config)

    def apply(self, config: GatewayConfig) -> None:
        before, mirror = self.mirror, config.mirror
        self.mirror = mirror
        self.class_header = config.class_header
        if mirror is None:
            self._drop_queued()
        else:
            self.metrics.ensure((arm.name for arm in mirror.arms), mirror.sample)
            log.info("mirroring to experiment %s: %s", mirror.experiment, _arms(mirror))
        if _sample_of(mirror) != _sample_of(before):
            self.reservoir = _reservoir(mirror)
        self._resize()

    async def open(self) -> None:
        # A pool of its own: arms never take connections from the engine's.
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=4.0),
            cookie_jar=aiohttp.DummyCookieJar(),
        )
        self._resize()

    async def close(self) -> None:
        workers, self._workers = self._workers, []
        for worker in workers:
            worker.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        self._drop_queued()
        if self._session is not None:
            await self._session.close()
            self._session = None

    def offer(self, request: Request, body: dict[str, Any] | None, size: int, klass: str) -> None:
        """Queues the request if it is sampled. Called once the client has its answer; never
        raises."""
        try:
            self._offer(request, body, size, klass)
        except Exception:
            log.exception("offering a request to the mirror failed")
            self.gateway_metrics.error("mirror")

    def _offer(self, request: Request, body: dict[str, Any] | None, size: int, klass: str) -> None:
        mirror = self.mirror
        if mirror is None or body is None or MIRRORED_HEADER in request.headers:
            return
        self._served += 1
        if not sampled(self._served, mirror.sample.get(klass, 0.0)):
            return
        if size > mirror.max_request_bytes:
            self.metrics.dropped.labels("too_large").inc()
        elif self._queue.qsize() >= mirror.queue_bound:
            self.metrics.dropped.labels("queue_full").inc()
        else:
            self._queue.put_nowait(Sampled(request.path, klass, body))

    def _resize(self) -> None:
        wanted = self.mirror.concurrency if self.mirror and self._session else 0
        while len(self._workers) < wanted:
            self._workers.append(asyncio.create_task(self._work(), name="gateway-mirror"))
        while len(self._workers) > wanted:
            self._workers.pop().cancel()

    def _drop_queued(self) -> None:
        while not self._queue.empty():
            self._queue.get_nowait()
            self.metrics.dropped.labels("stopped").inc()

    async def _work(self) -> None:
        while True:
            sample = await self._queue.get()
            try:
                await self._mirror(sample)
            except asyncio.CancelledError:
                self.metrics.dropped.labels("stopped").inc()
                raise
            except Exception:
                log.exception("mirroring a request failed")
                self.gateway_metrics.error("mirror")

    async def _mirror(self, sample: Sampled) -> None:
        mirror = self.mirror
        if mirror is None:
            self.metrics.dropped.labels("stopped").inc()
            return
        if self.reservoir is not None:
            self.reservoir.offer(sample.class_name, sample.body)
        data = arm_body(sample.body)
        asks = (self._ask(mirror, arm, sample, data) for arm in mirror.arms)
        answers = await asyncio.gather(*asks)
        if is_greedy(sample.body):
            self._compare(mirror, sample.class_name, self._outputs(mirror.arms, answers))

    def _outputs(self, arms: list[MirrorArm], answers: list[Answer | None]) -> dict[str, Output]:
        """The answers that read as outputs, by arm; the rest counted `unreadable`."""
        outputs = {}
        for arm, answer in zip(arms, answers, strict=True):
            output = output_of(answer.body, answer.content_type) if answer is not None else None
            if output is not None:
                outputs[arm.name] = output
            elif answer is not None:
                self.metrics.errors.labels(arm.name, "unreadable").inc()
        return outputs

    async def _ask(
        self, mirror: Mirror, arm: MirrorArm, sample: Sampled, data: bytes
    ) -> Answer | None:
        """The arm's answer; None (counted) when it failed."""
        self.metrics.sent.labels(arm.name, sample.class_name).inc()
        try:
            async with asyncio.timeout(mirror.timeout_seconds):
                return await self._post(arm.url + sample.path, data, sample.class_name, mirror)
        except TimeoutError:
            reason = "timeout"
        except aiohttp.ClientError:
            reason = "unreachable"
        except ArmFailed as exc:
            reason = exc.reason
        self.metrics.errors.labels(arm.name, reason).inc()
        return None

    async def _post(self, url: str, data: bytes, klass: str, mirror: Mirror) -> Answer:
        assert self._session is not None
        headers = {
            "Content-Type": "application/json",
            self.class_header: klass,
            MIRRORED_HEADER: mirror.experiment,
        }
        async with self._session.post(url, data=data, headers=headers, allow_redirects=False) as r:
            if r.status >= 300:
                raise ArmFailed("status")
            return Answer(r.content_type, await _read_capped(r.content, MAX_RESPONSE_BYTES))

    async def sample(self, request: web.Request) -> web.Response:
        """The kept sample, as JSONL: a request body and its `class` a line."""
        mirror, reservoir = self.mirror, self.reservoir
        if mirror is None or reservoir is None:
            raise web.HTTPNotFound(text="no sample kept: no mirror asks for one\n")
        if not _bearer(request, mirror.sample_token):
            raise web.HTTPUnauthorized(
                text="the sample holds live prompts: send the mirror's sampleToken as a "
                "bearer token\n",
                headers={"WWW-Authenticate": "Bearer"},
            )
        return web.Response(
            body=reservoir.jsonl(),
            content_type=SAMPLE_CONTENT_TYPE,
            headers={SAMPLE_EXPERIMENT_HEADER: mirror.experiment},
        )

    def _compare(self, mirror: Mirror, klass: str, outputs: dict[str, Output]) -> None:
        baseline = outputs.get(mirror.baseline)
        if baseline is None:
            return
        for name, output in outputs.items():
            if name == mirror.baseline:
                continue
            self.metrics.compared.labels(name, klass).inc()
            if output == baseline:
                self.metrics.exact_matches.labels(name, klass).inc()
            agreement = word_prefix_agreement(baseline.words(), output.words())
            self.metrics.agreement.labels(name, klass).inc(agreement)


def _bearer(request: web.Request, token: str | None) -> bool:
    presented = request.headers.get("Authorization", "").removeprefix("Bearer ")
    return token is not None and hmac.compare_digest(presented.encode(), token.encode())


async def _read_capped(content: aiohttp.StreamReader, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while chunk := await content.readany():
        size += len(chunk)
        if size > limit:
            raise ArmFailed("unreadable")
        chunks.append(chunk)
    return b"".join(chunks)


def _sample_of(mirror: Mirror | None) -> tuple[str, int, frozenset[str]] | None:
    """What a kept sample is a sample of: a change starts a new one."""
    if mirror is None or mirror.keep_sample is None:
        return None
    return mirror.experiment, mirror.keep_sample, frozenset(mirror.sample)


def _reservoir(mirror: Mirror | None) -> Reservoir | None:
    if mirror is None or mirror.keep_sample is None:
        return None
    return Reservoir(mirror.keep_sample, SAMPLE_BYTES // len(mirror.sample))


def _arms(mirror: Mirror) -> str:
    return ", ".join(f"{arm.name} ({arm.url})" for arm in mirror.arms)
