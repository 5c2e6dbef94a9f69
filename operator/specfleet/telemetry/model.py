"""What telemetry hands the guard: per (SpecModel, class) numbers over one window.

A value of None means "no data" (series missing, Prometheus down), never zero.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime


@dataclass(slots=True)
class ClassWindow:
    """One prompt class over one window, from counter increases (not averages of ratios).
    Not frozen (though never changed) and slotted: the guard builds one per class of every
    window it sums (`guard.evidence`), and a frozen one's __init__ costs four times as much."""

    requests: float | None = None
    errors: float | None = None
    """Requests with outcome upstream_error."""
    draft_tokens: float | None = None
    accepted_tokens: float | None = None
    spec_requests: float | None = None
    """Requests whose drafted and accepted tokens the engine reported: the terms of the draft
    and accepted tokens above and of the three sums below."""
    accepted_squares: float | None = None
    """Σ accepted² over those requests."""
    drafted_squares: float | None = None
    """Σ drafted² over those requests."""
    accepted_by_drafted: float | None = None
    """Σ accepted·drafted over those requests."""
    steps: float | None = None
    """Verify steps (engine `num_drafts`): the decode steps that drafted, not the others (an
    n-gram step without a match, k = 0 in a depth schedule)."""
    output_tokens: float | None = None
    """Every decode step makes one of its own plus the drafts it accepted: decode steps =
    output - accepted tokens."""
    request_seconds: float | None = None
    """Seconds requests spent in flight; over the window, the mean requests in flight."""
    p95_ttft_seconds: float | None = None
    mean_ttft_seconds: float | None = None
    ttft_samples: float | None = None
    """The requests behind the TTFTs (one that failed before its first token has none)."""
    ttft_squares: float | None = None
    """Σ TTFT² (seconds²) over those requests."""
    p95_tpot_seconds: float | None = None
    mean_tpot_seconds: float | None = None
    tpot_samples: float | None = None
    """The streams behind the TPOTs (a request that did not stream has none)."""
    tpot_squares: float | None = None
    """Σ TPOT² (seconds²) over those streams: how much they differ from their mean."""
    tool_calls_valid: float | None = None
    tool_calls_invalid: float | None = None
    structured_valid: float | None = None
    structured_invalid: float | None = None
    choices: float | None = None
    """Choices that finished, whatever the reason: the samples behind the truncation rate."""
    truncated: float | None = None
    """Choices cut at their token limit (finish reason `length`)."""
    empty_answers: float | None = None
    """Choices that finished with no content and no tool call (None: the gateway counts none)."""
    tool_calls_unjudged: Mapping[str, float] = field(default_factory=dict)
    """Tool calls not judged, by reason (the request's schema was not one a sane validator can
    check, or checking cost too much): outside the validity above, whatever they were."""
    structured_unjudged: Mapping[str, float] = field(default_factory=dict)
    """Structured outputs not judged, by reason."""

    def measured_tpot(self, min_samples: int) -> float | None:
        """The mean TPOT, as evidence only from at least `min_samples` streams: one stalled
        stream among two moves a mean by half its stall."""
        if not self.mean_tpot_seconds or (self.tpot_samples or 0.0) < min_samples:
            return None
        return self.mean_tpot_seconds

    @property
    def acceptance_rate(self) -> float | None:
        """The engines' accepted / drafted: evidence only where something was drafted."""
        if not self.draft_tokens or self.accepted_tokens is None:
            return None
        return self.accepted_tokens / self.draft_tokens

    @property
    def acceptance_deviations(self) -> float | None:
        """Σ (accepted - acceptance rate·drafted)² over the requests: how much they differ
        from one another, in tokens²; None without the sums."""
        rate = self.acceptance_rate
        sums = (self.accepted_squares, self.drafted_squares, self.accepted_by_drafted)
        if rate is None or any(value is None for value in sums):
            return None
        accepted, drafted, both = (value or 0.0 for value in sums)
        return max(accepted - 2.0 * rate * both + rate * rate * drafted, 0.0)

    @property
    def mean_acceptance_length(self) -> float | None:
        """The engines' E: of the drafting steps alone."""
        if not self.steps or self.accepted_tokens is None:
            return None
        return 1 + self.accepted_tokens / self.steps

    @property
    def tool_calls_judged(self) -> float:
        """Tool calls the gateway judged, valid or not: the samples behind their validity."""
        return (self.tool_calls_valid or 0.0) + (self.tool_calls_invalid or 0.0)

    @property
    def structured_judged(self) -> float:
        """Structured outputs the gateway judged, valid or not."""
        return (self.structured_valid or 0.0) + (self.structured_invalid or 0.0)

    @property
    def tool_call_validity(self) -> float | None:
        return _share(self.tool_calls_valid, self.tool_calls_judged)

    @property
    def structured_output_validity(self) -> float | None:
        return _share(self.structured_valid, self.structured_judged)

    @property
    def truncation_rate(self) -> float | None:
        return _share(self.truncated, self.choices or 0.0)

    @property
    def error_rate(self) -> float | None:
        if not self.requests or self.errors is None:
            return None
        return self.errors / self.requests


@dataclass(frozen=True)
class GreedyComparison:
    """Greedy requests whose outputs of one arm were compared with the baseline arm's."""

    compared: float = 0.0
    exact_matches: float = 0.0


def _share(good: float | None, total: float) -> float | None:
    return (good or 0.0) / total if total else None


@dataclass(frozen=True, slots=True)
class Observation:
    """One SpecModel's classes over one window, as served by one (revision, speculation) state.

    `blind` names why there is no data at all (Prometheus unreachable, query failed); a class
    missing from `classes` simply had no series."""

    at: datetime
    window_seconds: float
    revision: int
    speculation: bool
    classes: dict[str, ClassWindow] = field(default_factory=dict)
    blind: str | None = None
    canary: Observation | None = None
    """The canary's pods over the same window, when any served: a trial's (the same revision
    with speculation the other way) or a rollout's (the new revision beside the control)."""
    plain: dict[str, ClassWindow] = field(default_factory=dict)
    """The requests the pods' gateways sent to the plain pool, per class, over the same window:
    served without speculation, so never part of `classes` (they would read as speculation that
    drafts nothing)."""
