"""The per-request speculative stats the engines report (how many drafts a step
accepts: `specfleet.scenario.drafting.draw`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["SpecStats"]


@dataclass
class SpecStats:
    """One request's speculative-decoding counts.

    `num_spec_tokens` is the configured depth `k` (the histogram has `k + 1`
    buckets: index `j` counts verify steps that accepted exactly `j` drafts).
    """

    num_spec_tokens: int
    num_spec_steps: int = 0
    num_draft_tokens: int = 0
    num_accepted_draft_tokens: int = 0
    acceptance_histogram: list[int] = field(default_factory=list)
    per_step_accepted: list[int] = field(default_factory=list)
    per_step_drafted: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.acceptance_histogram:
            self.acceptance_histogram = [0] * (self.num_spec_tokens + 1)

    def observe(self, drafted: int, accepted: int) -> None:
        """Record one verify step that proposed `drafted` and accepted `accepted`."""
        self.num_spec_steps += 1
        self.num_draft_tokens += drafted
        self.num_accepted_draft_tokens += accepted
        self.acceptance_histogram[accepted] += 1
        self.per_step_accepted.append(accepted)
        self.per_step_drafted.append(drafted)

    @property
    def mean_acceptance_length(self) -> float:
        if not self.num_spec_steps:
            return 1.0
        return 1.0 + self.num_accepted_draft_tokens / self.num_spec_steps

    @property
    def draft_acceptance_rate(self) -> float:
        if not self.num_draft_tokens:
            return 0.0
        return self.num_accepted_draft_tokens / self.num_draft_tokens

    def vllm(self, level: str = "summary") -> dict[str, Any]:
        """vLLM 0.33 `metrics.speculative_decoding` (SpeculativeDecodingMetrics)."""
        detailed = level == "detailed"
        return {
            "mean_acceptance_length": self.mean_acceptance_length,
            "draft_acceptance_rate": self.draft_acceptance_rate,
            "acceptance_histogram": list(self.acceptance_histogram),
            "num_spec_steps": self.num_spec_steps,
            "num_accepted_draft_tokens": self.num_accepted_draft_tokens,
            "num_draft_tokens": self.num_draft_tokens,
            "num_spec_tokens": self.num_spec_tokens,
            "per_step_accepted": list(self.per_step_accepted) if detailed else None,
            "per_step_drafted": list(self.per_step_drafted) if detailed else None,
        }
