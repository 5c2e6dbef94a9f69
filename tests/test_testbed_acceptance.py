"""Acceptance draws, per-request stats and the timing model."""

from __future__ import annotations

import random

import pytest

from specfleet.guard.speedup import expected_speedup, expected_tokens_per_step
from specfleet.scenario.drafting import draw
from specfleet.scenario.timing import TimingModel, simulate_tpot
from specfleet_testbed.engine.stats import SpecStats


@pytest.mark.parametrize("alpha", [0.2, 0.6, 0.9])
def test_draws_converge_to_alpha(alpha: float) -> None:
    k, n = 4, 20_000
    rng = random.Random(42)
    stats = SpecStats(k)
    for _ in range(n):
        stats.observe(k, draw(alpha, k, rng))
    # i.i.d. positions: P(exactly j accepted) = a^j (1 - a) for j < k, a^k for j = k
    for j in range(k + 1):
        p = alpha**j * (1 - alpha) if j < k else alpha**k
        assert abs(stats.acceptance_histogram[j] / n - p) < 0.015, j
    # the engines' mean acceptance length converges to (1 - a^(k+1)) / (1 - a)
    assert stats.mean_acceptance_length == pytest.approx(
        expected_tokens_per_step(alpha, k), abs=0.03
    )
    assert sum(stats.acceptance_histogram) == stats.num_spec_steps == n
    assert stats.num_draft_tokens == n * k


def test_draws_are_deterministic_and_decay_with_position() -> None:
    a = [draw(0.7, 5, random.Random(3)) for _ in range(1)]
    b = [draw(0.7, 5, random.Random(3)) for _ in range(1)]
    assert a == b
    rng = random.Random(5)
    flat = sum(draw(0.8, 4, rng) for _ in range(5000))
    rng = random.Random(5)
    decayed = sum(draw(0.8, 4, rng, decay=0.5) for _ in range(5000))
    assert decayed < flat * 0.7
    assert draw(1.0, 4, rng) == 4 and draw(0.0, 4, rng) == 0


def test_spec_stats_shapes() -> None:
    s = SpecStats(3)
    for accepted in (0, 3, 2, 2):
        s.observe(3, accepted)
    v = s.vllm("summary")
    assert list(v) == [
        "mean_acceptance_length",
        "draft_acceptance_rate",
        "acceptance_histogram",
        "num_spec_steps",
        "num_accepted_draft_tokens",
        "num_draft_tokens",
        "num_spec_tokens",
        "per_step_accepted",
        "per_step_drafted",
    ]
    assert v["acceptance_histogram"] == [1, 0, 2, 1]
    assert v["mean_acceptance_length"] == 1 + 7 / 4
    assert v["draft_acceptance_rate"] == 7 / 12
    assert v["per_step_accepted"] is None
    assert s.vllm("detailed")["per_step_accepted"] == [0, 3, 2, 2]
    assert SpecStats(3).vllm()["mean_acceptance_length"] == 1.0


def test_speculation_helps_at_high_acceptance_and_hurts_at_low() -> None:
    timing = TimingModel()
    base = simulate_tpot(timing, alpha=0, k=0, method=None, output_tokens=400, rng=random.Random(1))
    high = simulate_tpot(
        timing, alpha=0.8, k=4, method="eagle3", output_tokens=400, rng=random.Random(1)
    )
    low = simulate_tpot(
        timing, alpha=0.1, k=4, method="eagle3", output_tokens=400, rng=random.Random(1)
    )
    assert high < 0.5 * base
    assert low > 1.05 * base
    # and the closed form agrees on the direction
    assert expected_speedup(0.8, 4, timing.cost("eagle3")) > 1 > expected_speedup(0.1, 4, 0.06)


def test_load_erodes_the_gain() -> None:
    timing = TimingModel()
    ratios = []
    for batch in (1, 64):
        plain = simulate_tpot(
            timing, alpha=0, k=0, method=None, output_tokens=400, batch=batch, rng=random.Random(2)
        )
        spec = simulate_tpot(
            timing,
            alpha=0.6,
            k=4,
            method="eagle3",
            output_tokens=400,
            batch=batch,
            rng=random.Random(2),
        )
        ratios.append(spec / plain)
    assert ratios[0] < 0.7 and ratios[1] > 1.0


def test_iteration_time() -> None:
    t = TimingModel(target_forward_ms=10, per_token_compute=0.0, prefill_ms_per_token=0.1)

    def seconds(batch: int, drafted: int, c: float, prefill: int = 0, factor: float = 1) -> float:
        return t.iteration_seconds(
            decode_batch=batch, drafted=drafted, c=c, prefill_tokens=prefill, tpot_factor=factor
        )

    assert seconds(0, 0, 0, prefill=100) == pytest.approx(0.02)
    assert seconds(1, 4, 0.25) == pytest.approx(0.02)
    assert seconds(1, 0, 0, factor=2) == pytest.approx(0.02)
    # four requests, one drafting 4 tokens: the step pays for one draft token a request
    assert seconds(4, 4, 0.25) == pytest.approx(0.0125)
    # a step in which nothing drafted costs what plain decoding costs
    assert seconds(4, 0, 0.25) == pytest.approx(0.01)
    assert t.with_overrides(draft_cost={"eagle3": 0.5}).cost("eagle3") == 0.5
    assert t.cost("something-new") == 0.1 and t.cost(None) == 0.0
