"""The simulated engine core: continuous batching over an asyncio loop.

Requests queue (`max_num_seqs` bounds the running batch); each iteration
prefills the newly admitted sequences (their first token) and runs one verify
step for every decoding sequence: `k` drafts, `drafting.draw` accepted, so
`1 + accepted` new tokens, capped by what the sequence still needs. Prompt-lookup
drafters (n-gram, suffix) draft only on steps that find a match (the request's
`draft_match_rate`), from 1 to `k` tokens; a step without a draft yields one
token and counts as no verify step, as in vLLM. Drafts never reach past
`max_model_len`. TensorRT-LLM's acceptance gate (`gate.AcceptanceGate`), where
configured, sees each request that leaves the batch while the engine speculates
and, once tripped, stops all drafting. Iteration length comes from
`timing.TimingModel`.

Time: the loop keeps its own virtual clock (simulated seconds). While busy it
advances by exactly the modelled iteration time, so reported latencies are
deterministic for a given seed and arrival order; when idle it catches up with
the wall clock (`Clock`). Wall sleeps are simulated time x `time_scale`.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import sys
import time
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from specfleet.scenario.drafting import draw
from specfleet.scenario.timing import TimingModel
from specfleet_testbed.engine.args import EngineConfig
from specfleet_testbed.engine.gate import AcceptanceGate
from specfleet_testbed.engine.stats import SpecStats

__all__ = [
    "Clock",
    "EngineCore",
    "EngineObserver",
    "Event",
    "GenRequest",
    "IterationRecord",
    "Sequence",
]


class Clock:
    """Simulated time: seconds since `epoch` (a Unix time) divided by `time_scale`.

    Processes given the same epoch share one scenario timeline.
    """

    def __init__(self, time_scale: float = 1.0, epoch: float | None = None) -> None:
        if time_scale <= 0:
            raise ValueError("time_scale must be > 0")
        self.time_scale = time_scale
        wall = time.time()
        self.epoch = wall if epoch is None else epoch
        self._mono0 = time.monotonic()
        self._offset = (wall - self.epoch) / time_scale

    def now(self) -> float:
        return (time.monotonic() - self._mono0) / self.time_scale + self._offset

    async def sleep_until(self, t: float) -> None:
        delay = (t - self.now()) * self.time_scale
        await asyncio.sleep(max(delay, 0.0))


@dataclass
class Event:
    """New tokens for one choice: pieces `[start, start + count)`."""

    index: int
    start: int
    count: int
    finish_reason: str | None
    t: float


@dataclass
class GenRequest:
    """What the HTTP layer asks the engine for."""

    request_id: str
    prompt_tokens: int
    natural_tokens: list[int]  # per choice: the length at which it stops by itself
    max_tokens: int
    alpha: float
    decay: float = 1.0
    draft_match_rate: float = 1.0  # prompt-lookup drafters: P(a step drafts)
    class_name: str = ""
    queue: asyncio.Queue[Event] = field(default_factory=asyncio.Queue)
    sequences: list[Sequence] = field(default_factory=list)


@dataclass(eq=False)
class Sequence:
    request: GenRequest
    index: int
    limit: int
    stats: SpecStats | None
    generated: int = 0
    iterations: int = 0  # engine iterations that produced tokens for it (prefill included)
    queued_t: float = 0.0
    scheduled_t: float = 0.0
    first_token_t: float = 0.0
    last_token_t: float = 0.0
    finish_reason: str | None = None
    cancelled: bool = False

    @property
    def avg_decoded_tokens_per_iter(self) -> float:
        """TensorRT-LLM's per-request value: output tokens / decoding iterations."""
        return self.generated / self.iterations if self.iterations else 0.0

    @property
    def stop_reason(self) -> str:
        return "stop" if self.limit == self.request.natural_tokens[self.index] else "length"


@dataclass
class IterationRecord:
    iteration: int
    start: float
    seconds: float
    running: int
    waiting: int
    new_sequences: int
    context_tokens: int
    generated_tokens: int
    completed: int
    k: int
    draft_tokens: int
    accepted_tokens: int
    spec_requests: int
    draft_overhead: float
    kv_used_tokens: int


class EngineObserver(Protocol):
    def on_prefill(self, seq: Sequence) -> None: ...
    def on_spec_step(self, seq: Sequence, drafted: int, accepted: int) -> None: ...
    def on_tokens(self, seq: Sequence, count: int, interval: float, first: bool) -> None: ...
    def on_finish(self, seq: Sequence) -> None: ...
    def on_iteration(self, record: IterationRecord) -> None: ...


class EngineCore:
    def __init__(
        self,
        config: EngineConfig,
        timing: TimingModel,
        clock: Clock,
        *,
        seed: int = 0,
        observers: list[EngineObserver] | None = None,
        tpot_factor: Callable[[], float] = lambda: 1.0,
        ttft_factor: Callable[[], float] = lambda: 1.0,
    ) -> None:
        self.config = config
        self.timing = timing
        self.clock = clock
        self.rng = random.Random(seed)
        self.observers = list(observers or [])
        self.tpot_factor = tpot_factor
        self.ttft_factor = ttft_factor
        self.running: list[Sequence] = []
        self.waiting: deque[Sequence] = deque()
        self.vt = clock.now()
        self.iterations = 0
        self.kv_capacity_tokens = 16 * config.max_model_len
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        spec = config.speculation
        self._c = timing.cost(spec.method) if spec else 0.0
        self._o = timing.overhead(spec.method) if spec else 0.0
        gate = spec.acceptance_gate if spec else None
        self.gate = AcceptanceGate(*gate) if gate else None

    # -- lifecycle --

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="specfleet-testbed-engine")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    @property
    def busy(self) -> bool:
        return bool(self.running or self.waiting)

    # -- requests --

    def submit(self, request: GenRequest) -> None:
        if not self.busy:  # idle: catch up with the wall clock
            self.vt = max(self.vt, self.clock.now())
        now = self.vt
        spec = self.config.speculation
        for index, natural in enumerate(request.natural_tokens):
            seq = Sequence(
                request=request,
                index=index,
                limit=max(1, min(natural, request.max_tokens)),
                stats=SpecStats(spec.k) if spec else None,
                queued_t=now,
            )
            request.sequences.append(seq)
            self.waiting.append(seq)
        self._wake.set()

    def abort(self, request: GenRequest) -> None:
        for seq in request.sequences:
            if seq.finish_reason is None:
                seq.cancelled = True
        self._wake.set()

    # -- the loop --

    async def _run(self) -> None:
        while True:
            if not self.busy:
                self._wake.clear()
                await self._wake.wait()
            try:
                await self._iterate()
            except Exception:  # a bug here must not hang every client: end their requests
                traceback.print_exc(file=sys.stderr)
                for seq in [*self.running, *self.waiting]:
                    if seq.finish_reason is None:
                        self._finish(seq, "abort", self.vt)
                self.running.clear()
                self.waiting.clear()

    def _drop_cancelled(self) -> None:
        depth = self._draft_depth(len(self.running))
        for seq in [s for s in self.running if s.cancelled]:
            self.running.remove(seq)
            self._finish(seq, "abort", self.vt)
            self._gate_sees(seq, depth)
        for seq in [s for s in self.waiting if s.cancelled]:
            self.waiting.remove(seq)
            self._finish(seq, "abort", self.vt)

    async def _iterate(self) -> None:
        self._drop_cancelled()
        decoding = list(self.running)
        new: list[Sequence] = []
        while self.waiting and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting.popleft()
            self.running.append(seq)
            new.append(seq)
        if not self.running:
            return
        depth = self._draft_depth(len(self.running))
        k = depth if decoding else 0
        start = self.vt
        prefill_tokens = sum(s.request.prompt_tokens for s in new)
        # decided before the step: what it verifies is what it costs
        drafts = {seq: self._draft_length(seq, k) for seq in decoding}
        seconds = self.timing.iteration_seconds(
            decode_batch=len(decoding),
            drafted=sum(drafts.values()),
            c=self._c,
            o=self._o,
            prefill_tokens=prefill_tokens,
            tpot_factor=self.tpot_factor(),
            ttft_factor=self.ttft_factor(),
        )
        end = start + seconds
        await self.clock.sleep_until(end)
        self.vt = end

        generated = drafted_total = accepted_total = completed = spec_requests = 0
        for seq in new:
            if seq.cancelled:
                continue
            seq.scheduled_t = start
            for obs in self.observers:
                obs.on_prefill(seq)
            generated += self._emit(seq, 1, end, first=True)
        for seq in decoding:
            if seq.cancelled or seq.finish_reason is not None:
                continue
            accepted = 0
            drafted = drafts[seq]
            if drafted and seq.stats is not None:
                accepted = draw(seq.request.alpha, drafted, self.rng, seq.request.decay)
                seq.stats.observe(drafted, accepted)
                drafted_total += drafted
                accepted_total += accepted
                spec_requests += 1
                for obs in self.observers:
                    obs.on_spec_step(seq, drafted, accepted)
            generated += self._emit(seq, 1 + accepted, end, first=False)
        for seq in [s for s in self.running if s.finish_reason is not None]:
            self.running.remove(seq)
            completed += 1
            self._gate_sees(seq, depth)
        self.iterations += 1
        per_request = sum(drafts.values()) / len(decoding) if decoding else 0.0
        overhead = per_request * self._c / (1.0 + per_request * self._c)
        record = IterationRecord(
            iteration=self.iterations,
            start=start,
            seconds=seconds,
            running=len(self.running),
            waiting=len(self.waiting),
            new_sequences=len(new),
            context_tokens=prefill_tokens,
            generated_tokens=generated,
            completed=completed,
            k=k,
            draft_tokens=drafted_total,
            accepted_tokens=accepted_total,
            spec_requests=spec_requests,
            draft_overhead=overhead,
            kv_used_tokens=self.kv_used_tokens(),
        )
        for obs in self.observers:
            obs.on_iteration(record)

    def _draft_depth(self, batch: int) -> int:
        spec = self.config.speculation
        if spec is None or (self.gate is not None and self.gate.tripped):
            return 0
        return spec.k_for_batch(batch)

    def _gate_sees(self, seq: Sequence, depth: int) -> None:
        """TensorRT-LLM records a request as it leaves the batch, and only while the engine
        speculates: requests that end above max_concurrency are not recorded."""
        if self.gate is not None and depth:
            self.gate.record(seq.avg_decoded_tokens_per_iter)

    def _draft_length(self, seq: Sequence, k: int) -> int:
        spec = self.config.speculation
        if not k or spec is None:
            return 0
        context = seq.request.prompt_tokens + seq.generated
        room = max(0, min(k, self.config.max_model_len - context))
        if not spec.drafts_on_match:
            return room
        if self.rng.random() >= seq.request.draft_match_rate:
            return 0
        # the draft is what follows the match in the context, often cut short by its end
        return min(room, self.rng.randint(1, k))

    def kv_used_tokens(self) -> int:
        return sum(s.request.prompt_tokens + s.generated for s in self.running)

    def _emit(self, seq: Sequence, want: int, t: float, *, first: bool) -> int:
        count = min(want, seq.limit - seq.generated)
        start = seq.generated
        seq.generated += count
        seq.iterations += 1
        interval = t - (seq.last_token_t if not first else seq.scheduled_t)
        if first:
            seq.first_token_t = t
        seq.last_token_t = t
        for obs in self.observers:
            obs.on_tokens(seq, count, interval, first)
        reason = None
        if seq.generated >= seq.limit:
            reason = seq.stop_reason
            self._finish(seq, reason, t, notify_client=False)
        seq.request.queue.put_nowait(Event(seq.index, start, count, reason, t))
        return count

    def _finish(self, seq: Sequence, reason: str, t: float, notify_client: bool = True) -> None:
        seq.finish_reason = reason
        if seq.last_token_t == 0.0:
            seq.last_token_t = t
        for obs in self.observers:
            obs.on_finish(seq)
        if notify_client and reason == "abort":
            seq.request.queue.put_nowait(Event(seq.index, seq.generated, 0, reason, t))
