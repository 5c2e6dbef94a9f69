"""The gateway's Prometheus metrics (names and labels are a contract with telemetry: see
`specfleet.series`).

A private registry, so the gateway exports exactly its own series. Every class's series exist
from the start (zero), so `rate()` works before the first request of a class arrives.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from specfleet import series
from specfleet.gateway.plain import FALLBACK_REASONS
from specfleet.gateway.quality import KINDS, Verdicts
from specfleet.gateway.schemas import REASONS
from specfleet.gateway.stats import SpecCounts

FINISH_REASONS = ("stop", "length", "tool_calls", "content_filter", "abort", "other")
ERROR_STAGES = ("request", "response", "stream", "metrics", "config", "mirror")
MIRROR_DROP_REASONS = ("queue_full", "too_large", "stopped")
MIRROR_ERROR_REASONS = ("timeout", "unreachable", "status", "unreadable")

CLASS_POOL = [series.CLASS, series.POOL]
"""Every per-class series says which pool served the request."""

# Time to first token: 10 ms (short prompt, idle engine) to 60 s (long prefill under load).
TTFT_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75,
    1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0,
)  # fmt: skip
# Time per output token: 1 ms (small model, speculation paying) to 1 s (overloaded).
TPOT_BUCKETS = (
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.0125, 0.015, 0.02, 0.025, 0.03,
    0.04, 0.05, 0.06, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0,
)  # fmt: skip


@dataclass
class RequestRecord:
    """Everything the gateway learned about one inference request."""

    class_name: str
    outcome: str
    seconds: float = 0.0
    """From the request's arrival to its last byte (or failure)."""
    ttft: float | None = None
    tpot: float | None = None
    output_tokens: int | None = None
    spec: SpecCounts | None = None
    verdicts: Verdicts = field(default_factory=Verdicts)
    finish_reasons: Sequence[str | None] = ()
    empty_answers: int = 0
    """Finished choices with no content and no tool call."""
    pool: str = series.FLEET_POOL
    """Which pool served it: the local engine's fleet or the plain pool."""


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            series.REQUESTS, "Inference requests by prompt class and outcome.",
            [series.CLASS, series.POOL, series.OUTCOME], registry=r,
        )  # fmt: skip
        self.draft_tokens = Counter(
            series.DRAFT_TOKENS, "Draft tokens proposed.", CLASS_POOL, registry=r
        )
        self.accepted_tokens = Counter(
            series.ACCEPTED_TOKENS,
            "Draft tokens accepted (bonus tokens excluded).",
            CLASS_POOL,
            registry=r,
        )
        self.spec_steps = Counter(
            series.SPEC_STEPS, "Speculative verify steps.", CLASS_POOL, registry=r
        )
        self.moments = Counter(
            series.REQUEST_MOMENTS, "Per-request sums behind the spread of the acceptance "
            "rate, TPOT and TTFT: requests that reported drafts, the sums of accepted², drafted² "
            "and accepted·drafted tokens over them, of TPOT² (seconds²) over the streams and of "
            "TTFT² (seconds²) over the requests that had a first token.",
            [*CLASS_POOL, series.MOMENT], registry=r,
        )  # fmt: skip
        self.output_tokens = Counter(
            series.OUTPUT_TOKENS, "Output tokens (usage.completion_tokens).", CLASS_POOL,
            registry=r,
        )  # fmt: skip
        self.request_seconds = Counter(
            series.REQUEST_SECONDS, "Seconds inference requests spent in flight; its "
            "rate is the mean number of requests in flight (Little's law).", CLASS_POOL,
            registry=r,
        )  # fmt: skip
        self.ttft = Histogram(
            series.TTFT, "Time to first token as the client sees it (streams).",
            CLASS_POOL, buckets=TTFT_BUCKETS, registry=r,
        )  # fmt: skip
        self.tpot = Histogram(
            series.TPOT, "Time per output token after the first (streams).",
            CLASS_POOL, buckets=TPOT_BUCKETS, registry=r,
        )  # fmt: skip
        self.tool_calls = Counter(
            series.TOOL_CALLS, "Tool calls, by whether the arguments are valid JSON that "
            "matches the tool's schema.", [*CLASS_POOL, series.VALID], registry=r,
        )  # fmt: skip
        self.structured_outputs = Counter(
            series.STRUCTURED_OUTPUTS, "JSON outputs (response_format json_object or "
            "json_schema), by whether they parse and match the schema.",
            [*CLASS_POOL, series.VALID], registry=r,
        )  # fmt: skip
        self.unjudged = Counter(
            series.QUALITY_UNJUDGED, "Tool calls and JSON outputs not judged, by why: the "
            "request's schema was not one a sane validator can check, or checking cost too much.",
            [*CLASS_POOL, series.KIND, series.REASON], registry=r,
        )  # fmt: skip
        self.finish_reasons = Counter(
            series.FINISH_REASONS, "Choices by finish reason; `length` is a truncation.",
            [*CLASS_POOL, series.REASON], registry=r,
        )  # fmt: skip
        self.empty_answers = Counter(
            series.EMPTY_ANSWERS, "Choices that finished with no content and no tool call "
            "(of a stream read only to its first token, none): over the finish reasons, the "
            "share of empty answers.", CLASS_POOL, registry=r,
        )  # fmt: skip
        self.errors = Counter(
            series.GATEWAY_ERRORS, "The gateway's own bookkeeping failures (requests were "
            "still served).", [series.STAGE], registry=r,
        )  # fmt: skip
        for stage in ERROR_STAGES:
            self.errors.labels(stage)
        self.refused = Counter(
            series.GATEWAY_REFUSED, "Requests the gateway's server answered at their head "
            "(malformed, too large, asking what it does not do): never forwarded, in no class.",
            [series.STATUS], registry=r,
        )  # fmt: skip
        self.pumped = Counter(
            series.GATEWAY_PUMPED, "Token chunks the native pump relayed (never entering the "
            "interpreter); 0 while the pump is not built.",
            registry=r,
        )  # fmt: skip
        self.plain_fallbacks = Counter(
            series.PLAIN_POOL_FALLBACKS, "Requests of a class routed to the plain pool that "
            "the gateway served with its own engine, by why: the connection to the pool failed "
            "(unreachable), or the pool was not tried while it backs off from failing "
            "(backing_off).", [series.CLASS, series.REASON], registry=r,
        )  # fmt: skip
        self._series: dict[tuple[str, str], _ClassSeries] = {}
        self.mirror = MirrorMetrics(r)

    def ensure_classes(self, names: Iterable[str], pool: str = series.FLEET_POOL) -> None:
        for name in names:
            self._of(name, pool)
            if pool == series.PLAIN_POOL:
                for reason in FALLBACK_REASONS:
                    self.plain_fallbacks.labels(name, reason)

    def record(self, record: RequestRecord) -> None:
        self._of(record.class_name, record.pool).record(record)

    def count_fallback(self, class_name: str, reason: str) -> None:
        self.plain_fallbacks.labels(class_name, reason).inc()

    def _of(self, name: str, pool: str) -> _ClassSeries:
        found = self._series.get((name, pool))
        if found is None:
            found = self._series[name, pool] = _ClassSeries(self, name, pool)
        return found

    def error(self, stage: str) -> None:
        self.errors.labels(stage).inc()

    def count_refusal(self, status: int) -> None:
        self.refused.labels(str(status)).inc()

    def count_pumped(self, chunks: int) -> None:
        self.pumped.inc(chunks)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class MirrorMetrics:
    """What mirroring to an experiment's arms did, per arm and class (`gateway.mirror`)."""

    def __init__(self, r: CollectorRegistry) -> None:
        arm_class = [series.ARM, series.CLASS]
        self.sent = Counter(
            series.MIRROR_SENT, "Sampled requests sent to an arm.", arm_class, registry=r
        )
        self.dropped = Counter(
            series.MIRROR_DROPPED, "Sampled requests not mirrored, by why: the queue was full "
            "(arms slow or down), the request was too large, or mirroring stopped or shrank.",
            [series.REASON], registry=r,
        )  # fmt: skip
        self.errors = Counter(
            series.MIRROR_ERRORS, "Mirrored requests an arm did not answer with a readable "
            "2xx, by why.", [series.ARM, series.REASON], registry=r,
        )  # fmt: skip
        self.compared = Counter(
            series.MIRROR_COMPARED, "Greedy requests (temperature 0) whose output of an arm "
            "was compared with the baseline arm's.", arm_class, registry=r,
        )  # fmt: skip
        self.exact_matches = Counter(
            series.MIRROR_EXACT_MATCHES, "Compared outputs identical to the baseline's (texts "
            "and tool calls).", arm_class, registry=r,
        )  # fmt: skip
        self.agreement = Counter(
            series.MIRROR_AGREEMENT, "Sum of the compared outputs' word-prefix agreement with "
            "the baseline's (leading words in common over the longer output's words); over "
            "compared: the mean.", arm_class, registry=r,
        )  # fmt: skip
        for reason in MIRROR_DROP_REASONS:
            self.dropped.labels(reason)

    def ensure(self, arms: Iterable[str], classes: Iterable[str]) -> None:
        """Every series of these arms and classes, at zero."""
        names = list(classes)
        for arm in arms:
            for reason in MIRROR_ERROR_REASONS:
                self.errors.labels(arm, reason)
            for name in names:
                for counter in (self.sent, self.compared, self.exact_matches, self.agreement):
                    counter.labels(arm, name)


class _ClassSeries:
    """One class's children of every metric, created (at zero) once: recording a request is
    then plain attribute access, no label lookups."""

    def __init__(self, metrics: GatewayMetrics, name: str, pool: str) -> None:
        self.requests = {o: metrics.requests.labels(name, pool, o) for o in series.OUTCOMES}
        self.draft_tokens = metrics.draft_tokens.labels(name, pool)
        self.accepted_tokens = metrics.accepted_tokens.labels(name, pool)
        self.spec_steps = metrics.spec_steps.labels(name, pool)
        *self.spec_moments, self.tpot_squared, self.ttft_squared = (
            metrics.moments.labels(name, pool, m) for m in series.MOMENTS
        )
        self.output_tokens = metrics.output_tokens.labels(name, pool)
        self.request_seconds = metrics.request_seconds.labels(name, pool)
        self.ttft = metrics.ttft.labels(name, pool)
        self.tpot = metrics.tpot.labels(name, pool)
        valid = series.valid_value
        self.tool_calls = {
            v: metrics.tool_calls.labels(name, pool, valid(v)) for v in (True, False)
        }
        self.structured_outputs = {
            v: metrics.structured_outputs.labels(name, pool, valid(v)) for v in (True, False)
        }
        self.unjudged = {
            (kind, reason): metrics.unjudged.labels(name, pool, kind, reason)
            for kind in KINDS
            for reason in REASONS
        }
        self.finish_reasons = {
            r: metrics.finish_reasons.labels(name, pool, r) for r in FINISH_REASONS
        }
        self.empty_answers = metrics.empty_answers.labels(name, pool)

    def record(self, record: RequestRecord) -> None:
        self.requests[record.outcome].inc()
        self.request_seconds.inc(record.seconds)
        if record.ttft is not None:
            self.ttft.observe(record.ttft)
            self.ttft_squared.inc(record.ttft * record.ttft)
        if record.tpot is not None:
            self.tpot.observe(record.tpot)
            self.tpot_squared.inc(record.tpot * record.tpot)
        if record.output_tokens:
            self.output_tokens.inc(record.output_tokens)
        if record.spec is not None:
            self.draft_tokens.inc(record.spec.drafted)
            self.accepted_tokens.inc(record.spec.accepted)
            self.spec_steps.inc(record.spec.steps)
            self._record_moments(record.spec)
        for valid in record.verdicts.tool_calls:
            self.tool_calls[valid].inc()
        for valid in record.verdicts.structured_outputs:
            self.structured_outputs[valid].inc()
        for unjudged in record.verdicts.unjudged:
            self.unjudged[unjudged].inc()
        for reason in record.finish_reasons:
            if reason is not None:
                self.finish_reasons.get(reason, self.finish_reasons["other"]).inc()
        if record.empty_answers:
            self.empty_answers.inc(record.empty_answers)

    def _record_moments(self, spec: SpecCounts) -> None:
        requests, accepted_squared, drafted_squared, both = self.spec_moments
        requests.inc()
        accepted_squared.inc(spec.accepted * spec.accepted)
        drafted_squared.inc(spec.drafted * spec.drafted)
        both.inc(spec.accepted * spec.drafted)
