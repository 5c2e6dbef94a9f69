"""How long an engine iteration takes (simulated seconds).

The simulator runs continuous batching: each iteration prefills the newly
admitted requests and runs one decode step for every decoding request, which
verifies the draft tokens proposed for it, if any.

    decode  = T0 · (1 + g · B · (1 + δ)) · (1 + o + δ · c) · tpot_factor     (B > 0)
    prefill = p · P · ttft_factor
    iteration = decode + prefill          (a prefill-only iteration costs T0 + prefill)

- `δ`: draft tokens per decoding request in this iteration (drafted / B). Draft
  models and EAGLE draft `k` on every step (δ = k); prompt-lookup drafters only
  where the context holds a match, so δ < k, and a step where nothing drafts
  costs plain decoding's plus the overhead o. The guard's model
  (`guard/speedup.py`, whose `step_cost` this uses) is the same: tokens per
  step / (1 + o + δ·c), load aside.

- `T0` (`target_forward_ms`, default 15 ms): one target forward at batch 1,
  dominated by reading the weights.
- `g` (`per_token_compute`, default 0.01): the extra cost per token verified in
  the batch; `B` requests each verify `k + 1` tokens, so the concurrency factor
  grows with in-flight requests *and* with the drafts verified - speculation
  turns into a loss at high load even when acceptance holds.
- `c` (`draft_cost`): one draft forward relative to a target forward, by method
  (`DRAFT_COST`).
- `o` (`step_overhead`, default 0): what speculation being on costs every step,
  drafts or none, relative to a target forward; 0 without speculation.
- `p` (`prefill_ms_per_token`, default 0.05 ms): prefill cost per prompt token.
- `tpot_factor`, `ttft_factor`: a revision's effects (see `scenario.Effects`).

Without speculation `δ = 0` and every step yields one token; with it a step
yields `1 + accepted` tokens (see `drafting.draw`), so per-token time is
roughly `T0 (1 + gB(1+δ)) (1 + o + δc) / E[1 + accepted]`: at alpha = 0.8, k = 4 that
beats plain decoding, at alpha = 0.1 it loses.

Wall time = simulated time x `time_scale` (the CLI's `--time-scale`).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field

from specfleet.guard.speedup import forward_cost, step_cost
from specfleet.scenario.drafting import draw

__all__ = ["DRAFT_COST", "TimingModel", "simulate_tpot"]

DRAFT_COST: Mapping[str, float] = {
    "eagle": 0.06,
    "eagle3": 0.06,
    "draft_model": 0.2,
    "mtp": 0.05,
    "dflash": 0.05,
    "dspark": 0.05,
    "ngram": 0.01,
    "ngram_gpu": 0.01,
    "suffix": 0.01,
    "medusa": 0.03,
    "lookahead": 0.02,
}
DEFAULT_DRAFT_COST = 0.1


@dataclass(frozen=True)
class TimingModel:
    target_forward_ms: float = 15.0
    per_token_compute: float = 0.01
    prefill_ms_per_token: float = 0.05
    draft_cost: Mapping[str, float] = field(default_factory=lambda: dict(DRAFT_COST))
    step_overhead: float = 0.0

    def cost(self, method: str | None) -> float:
        if method is None:
            return 0.0
        return self.draft_cost.get(method, DRAFT_COST.get(method, DEFAULT_DRAFT_COST))

    def overhead(self, method: str | None) -> float:
        """o with speculation by `method` on, 0 with it off."""
        return 0.0 if method is None else self.step_overhead

    def decode_seconds(self, batch: float, drafts: float, c: float, o: float = 0.0) -> float:
        """One decode step for `batch` requests verifying `drafts` draft tokens each on
        average (0: none, k: every request drafted k), at overhead o (0: plain decoding)."""
        t0 = self.target_forward_ms / 1000.0
        load = forward_cost(batch * (1 + drafts), self.per_token_compute)
        return t0 * load * step_cost(drafts, c, o)

    def iteration_seconds(
        self,
        *,
        decode_batch: int,
        drafted: int,
        c: float,
        o: float = 0.0,
        prefill_tokens: int,
        tpot_factor: float = 1.0,
        ttft_factor: float = 1.0,
    ) -> float:
        prefill = self.prefill_ms_per_token * prefill_tokens / 1000.0 * ttft_factor
        if decode_batch == 0:
            return self.target_forward_ms / 1000.0 + prefill
        drafts = drafted / decode_batch
        return self.decode_seconds(decode_batch, drafts, c, o) * tpot_factor + prefill

    def with_overrides(
        self,
        *,
        target_forward_ms: float | None = None,
        per_token_compute: float | None = None,
        prefill_ms_per_token: float | None = None,
        draft_cost: Mapping[str, float] | None = None,
        step_overhead: float | None = None,
    ) -> TimingModel:
        costs = dict(self.draft_cost)
        costs.update(draft_cost or {})
        return TimingModel(
            target_forward_ms=target_forward_ms or self.target_forward_ms,
            per_token_compute=(
                self.per_token_compute if per_token_compute is None else per_token_compute
            ),
            prefill_ms_per_token=(
                self.prefill_ms_per_token if prefill_ms_per_token is None else prefill_ms_per_token
            ),
            draft_cost=costs,
            step_overhead=self.step_overhead if step_overhead is None else step_overhead,
        )


def simulate_tpot(
    timing: TimingModel,
    *,
    alpha: float,
    k: int,
    method: str | None,
    output_tokens: int,
    batch: int = 1,
    rng: random.Random,
    decay: float = 1.0,
) -> float:
    """Mean simulated seconds per output token after the first, for one request
    decoding alongside `batch - 1` others, every one drafting k tokens on every
    step (k = 0: no speculation).

    The same step rule the server's engine loop uses, without the event loop:
    for the offline `specfleet simulate` and for tests.
    """
    c = timing.cost(method) if k else 0.0
    o = timing.overhead(method) if k else 0.0
    step = timing.decode_seconds(batch, k, c, o)
    produced, elapsed = 1, 0.0  # the first token comes from prefill
    while produced < output_tokens:
        accepted = draw(alpha, k, rng, decay) if k else 0
        produced += 1 + accepted
        elapsed += step
    return elapsed / max(output_tokens - 1, 1)
