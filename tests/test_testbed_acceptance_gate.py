"""TensorRT-LLM 1.2's acceptance gate in the simulated engine."""

from __future__ import annotations

import asyncio

import pytest

from specfleet.scenario.timing import TimingModel
from specfleet_testbed.engine.args import EngineConfig, parse_trtllm
from specfleet_testbed.engine.core import (
    Clock,
    EngineCore,
    GenRequest,
    IterationRecord,
    Sequence,
)
from specfleet_testbed.engine.gate import AcceptanceGate

TWO_MODEL_EAGLE = (
    "decoding_type: Eagle, max_draft_len: 4, speculative_model: d, eagle3_one_model: false"
)
GATE = "acceptance_window: 4, acceptance_length_threshold: 1.0"


def engine_config(speculative_config: str) -> EngineConfig:
    text = f"speculative_config: {{{speculative_config}}}"
    return parse_trtllm(["m", "--config", "/x"], read_file=lambda _: text)


def test_the_gate_waits_for_a_full_window() -> None:
    gate = AcceptanceGate(window=3, threshold=0.5)
    gate.record(1.0)
    gate.record(1.0)
    assert not gate.tripped
    gate.record(1.0)
    assert gate.tripped


def test_the_mean_rolls_over_the_last_window_of_requests() -> None:
    gate = AcceptanceGate(window=3, threshold=0.5)
    for avg_decoded in (1.0, 3.0, 3.0, 1.0, 1.0):  # accepted lengths 0, 2, 2, 0, 0
        gate.record(avg_decoded)
    assert not gate.tripped  # the last three: (2 + 0 + 0) / 3
    gate.record(1.0)
    assert gate.tripped


def test_a_request_that_decoded_nothing_counts_as_zero_not_less() -> None:
    gate = AcceptanceGate(window=2, threshold=0.5)
    gate.record(0.0)
    gate.record(2.0)
    assert not gate.tripped  # (0 + 1) / 2, not (-1 + 1) / 2


def test_once_tripped_the_gate_stays_shut() -> None:
    gate = AcceptanceGate(window=1, threshold=0.5)
    gate.record(1.2)
    for _ in range(5):
        gate.record(5.0)
    assert gate.tripped


class Iterations:
    def __init__(self) -> None:
        self.records: list[IterationRecord] = []

    def on_prefill(self, seq: Sequence) -> None: ...
    def on_spec_step(self, seq: Sequence, drafted: int, accepted: int) -> None: ...
    def on_tokens(self, seq: Sequence, count: int, interval: float, first: bool) -> None: ...
    def on_finish(self, seq: Sequence) -> None: ...

    def on_iteration(self, record: IterationRecord) -> None:
        self.records.append(record)


async def serve_requests(
    engine: EngineCore, count: int, *, alpha: float, together: int = 1, match: float = 1.0
) -> None:
    """`count` requests of 40 tokens, `together` at a time."""
    for _ in range(count // together):
        requests = [
            GenRequest(
                request_id=str(i),
                prompt_tokens=16,
                natural_tokens=[40],
                max_tokens=40,
                alpha=alpha,
                draft_match_rate=match,
            )
            for i in range(together)
        ]
        for request in requests:
            engine.submit(request)
        for request in requests:
            while (await request.queue.get()).finish_reason is None:
                pass


async def engine_after(
    speculative_config: str, count: int, alpha: float, *, together: int = 1, match: float = 1.0
) -> tuple[EngineCore, Iterations]:
    iterations = Iterations()
    engine = EngineCore(
        engine_config(speculative_config),
        TimingModel(),
        Clock(time_scale=0.0001),
        observers=[iterations],
    )
    engine.start()
    try:
        traffic = serve_requests(engine, count, alpha=alpha, together=together, match=match)
        await asyncio.wait_for(traffic, timeout=30)
    finally:
        await engine.stop()
    return engine, iterations


async def test_ngram_steps_without_a_draft_shut_the_gate_though_every_draft_is_accepted() -> None:
    """1 token per step without a match: the request's accepted length per iteration stays
    below 1 although the drafts that were made were all accepted."""
    engine, iterations = await engine_after(
        f"decoding_type: NGram, max_draft_len: 4, {GATE}", 8, 1.0, match=0.2
    )
    assert engine.gate is not None and engine.gate.tripped
    drafted = [r for r in iterations.records if r.draft_tokens]
    assert drafted and all(r.accepted_tokens == r.draft_tokens for r in drafted)
    decode_steps = [r for r in iterations.records if not r.new_sequences]
    shut = next(i for i, r in enumerate(decode_steps) if r.k == 0)
    assert all(r.k == 0 and r.draft_tokens == 0 for r in decode_steps[shut:])
    assert len(decode_steps[shut:]) >= 3 * 39  # at least the last three requests


async def test_good_acceptance_keeps_the_engine_drafting() -> None:
    engine, iterations = await engine_after(f"{TWO_MODEL_EAGLE}, {GATE}", 8, 0.9)
    assert engine.gate is not None and not engine.gate.tripped
    assert iterations.records[-1].draft_tokens == 4


async def test_one_model_eagle3_ignores_the_gate() -> None:
    one_model = TWO_MODEL_EAGLE.replace("false", "true")
    engine, iterations = await engine_after(f"{one_model}, {GATE}", 8, 0.0)
    assert engine.gate is None
    assert iterations.records[-1].draft_tokens == 4


@pytest.mark.parametrize(("together", "tripped"), [(2, False), (1, True)])
async def test_requests_that_end_above_max_concurrency_are_not_recorded(
    together: int, tripped: bool
) -> None:
    engine, _ = await engine_after(
        f"{TWO_MODEL_EAGLE}, max_concurrency: 1, acceptance_window: 2, "
        "acceptance_length_threshold: 0.5",
        4,
        0.0,
        together=together,
    )
    assert engine.gate is not None and engine.gate.tripped is tripped


async def test_a_cancelled_request_counts_like_a_finished_one() -> None:
    """1.2.1 finishes a cancelled request in the batch and records it as it responds."""
    engine = EngineCore(
        engine_config(f"{TWO_MODEL_EAGLE}, acceptance_window: 1, acceptance_length_threshold: 0.5"),
        TimingModel(),
        Clock(time_scale=0.0001),
    )
    request = GenRequest("0", prompt_tokens=16, natural_tokens=[40], max_tokens=40, alpha=0.0)
    engine.start()
    try:
        engine.submit(request)
        await request.queue.get()  # its first token: it is in the batch
        engine.abort(request)
        while (await asyncio.wait_for(request.queue.get(), 30)).finish_reason != "abort":
            pass
    finally:
        await engine.stop()
    assert engine.gate is not None and engine.gate.tripped
