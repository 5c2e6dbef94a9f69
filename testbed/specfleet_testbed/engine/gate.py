"""TensorRT-LLM 1.2's acceptance gate (`SpeculationGate`,
tensorrt_llm/_torch/speculative/speculation_gate.py): one per engine process, fed by every
request that completes while the engine speculates. A request counts as its accepted length
per iteration, max(0, avg_decoded_tokens_per_iter - 1), so one that drafted nothing counts 0.
Once `acceptance_window` requests are in, a rolling mean over the last `acceptance_window`
below `acceptance_length_threshold` shuts speculation off until the process restarts."""

from __future__ import annotations

import sys
from collections import deque
from dataclasses import dataclass, field

__all__ = ["AcceptanceGate"]


@dataclass
class AcceptanceGate:
    window: int
    threshold: float
    tripped: bool = field(default=False, init=False)
    accepted_lengths: deque[float] = field(init=False)

    def __post_init__(self) -> None:
        self.accepted_lengths = deque(maxlen=self.window)

    def record(self, avg_decoded_tokens_per_iter: float) -> None:
        if self.tripped:
            return
        self.accepted_lengths.append(max(0.0, avg_decoded_tokens_per_iter - 1.0))
        if len(self.accepted_lengths) < self.window:
            return
        mean = sum(self.accepted_lengths) / self.window
        if mean < self.threshold:
            self.tripped = True
            print(
                f"[SpeculationGate] Speculative decoding disabled: rolling acceptance avg "
                f"{mean:.3f} < threshold {self.threshold} over last {self.window} requests",
                file=sys.stderr,
            )
