"""The engines' own metrics, fed by the engine loop (each server has a private
`CollectorRegistry`).

- vLLM 0.33: Prometheus text on `/metrics`, names `vllm:*`, labels
  `model_name` (first served name) and `engine` ("0"); spec-decode counters
  exist only when speculation is configured.
- TensorRT-LLM 1.2.1: Prometheus on `/prometheus/metrics` only with
  `return_perf_metrics: true` — request latencies and successes, labels
  `model_name`/`engine_type` both `"undefined"` — and JSON iteration stats on
  `/metrics`, drained on read, only with `enable_iter_perf_stats: true`.

All durations are simulated seconds.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from specfleet_testbed.engine.args import EngineConfig
from specfleet_testbed.engine.core import IterationRecord, Sequence

__all__ = ["TrtllmIterationStats", "TrtllmMetrics", "VllmMetrics"]

TTFT_BUCKETS = [
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
]
TPOT_BUCKETS = [
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
]
LATENCY_BUCKETS = [
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
]


class _Base:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.registry = CollectorRegistry(auto_describe=True)
        self.kv_capacity_tokens = 16 * config.max_model_len

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    def on_iteration(self, record: IterationRecord) -> None: ...

    @staticmethod
    def _request_times(seq: Sequence) -> dict[str, float]:
        arrival = seq.queued_t
        return {
            "e2e": seq.last_token_t - arrival,
            "queue": max(seq.scheduled_t - arrival, 0.0),
            "prefill": max(seq.first_token_t - seq.scheduled_t, 0.0),
            "decode": max(seq.last_token_t - seq.first_token_t, 0.0),
            "inference": max(seq.last_token_t - seq.scheduled_t, 0.0),
        }


class VllmMetrics(_Base):
    def __init__(self, config: EngineConfig) -> None:
        super().__init__(config)
        labels = ["model_name", "engine"]
        self.labels = {"model_name": config.model_name, "engine": "0"}
        r = self.registry

        def counter(name: str, doc: str, extra: list[str] | None = None) -> Counter:
            return Counter(name, doc, labels + (extra or []), registry=r)

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, labels, registry=r)

        def histogram(name: str, doc: str, buckets: list[float]) -> Histogram:
            return Histogram(name, doc, labels, buckets=buckets, registry=r)

        self.running = gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches."
        )
        self.waiting = gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed."
        )
        self.kv_usage = gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."
        )
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = counter(
            "vllm:generation_tokens", "Number of generation tokens processed."
        )
        self.success = counter(
            "vllm:request_success", "Count of successfully processed requests.", ["finished_reason"]
        )
        self.ttft = histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            TTFT_BUCKETS,
        )
        self.itl = histogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            TPOT_BUCKETS,
        )
        self.tpot = histogram(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            TPOT_BUCKETS,
        )
        self.e2e = histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            LATENCY_BUCKETS,
        )
        self.queue = histogram(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            LATENCY_BUCKETS,
        )
        self.prefill = histogram(
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            LATENCY_BUCKETS,
        )
        self.decode = histogram(
            "vllm:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            LATENCY_BUCKETS,
        )
        self.inference = histogram(
            "vllm:request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request.",
            LATENCY_BUCKETS,
        )
        for metric in (
            self.running,
            self.waiting,
            self.kv_usage,
            self.prompt_tokens,
            self.generation_tokens,
            self.ttft,
            self.itl,
            self.tpot,
            self.e2e,
            self.queue,
            self.prefill,
            self.decode,
            self.inference,
        ):
            metric.labels(**self.labels)
        for reason in ("stop", "length", "abort"):
            self.success.labels(**self.labels, finished_reason=reason)

        spec = config.speculation
        self.spec_enabled = spec is not None
        if spec is not None:
            self.num_drafts = counter(
                "vllm:spec_decode_num_drafts", "Number of spec decoding drafts."
            )
            self.num_draft_tokens = counter(
                "vllm:spec_decode_num_draft_tokens", "Number of draft tokens."
            )
            self.num_accepted = counter(
                "vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens."
            )
            self.per_pos = counter(
                "vllm:spec_decode_num_accepted_tokens_per_pos",
                "Accepted tokens per draft position.",
                ["position"],
            )
            for m in (self.num_drafts, self.num_draft_tokens, self.num_accepted):
                m.labels(**self.labels)
            for pos in range(spec.k):
                self.per_pos.labels(**self.labels, position=str(pos))

    def on_prefill(self, seq: Sequence) -> None:
        self.prompt_tokens.labels(**self.labels).inc(seq.request.prompt_tokens)

    def on_spec_step(self, seq: Sequence, drafted: int, accepted: int) -> None:
        self.num_drafts.labels(**self.labels).inc()
        self.num_draft_tokens.labels(**self.labels).inc(drafted)
        self.num_accepted.labels(**self.labels).inc(accepted)
        for pos in range(accepted):
            self.per_pos.labels(**self.labels, position=str(pos)).inc()

    def on_tokens(self, seq: Sequence, count: int, interval: float, first: bool) -> None:
        self.generation_tokens.labels(**self.labels).inc(count)
        if first:
            self.ttft.labels(**self.labels).observe(seq.first_token_t - seq.queued_t)
        elif count:
            self.itl.labels(**self.labels).observe(interval)

    def on_finish(self, seq: Sequence) -> None:
        reason = seq.finish_reason or "abort"
        self.success.labels(**self.labels, finished_reason=reason).inc()
        if reason == "abort" or seq.first_token_t == 0.0:
            return
        t = self._request_times(seq)
        self.e2e.labels(**self.labels).observe(t["e2e"])
        self.queue.labels(**self.labels).observe(t["queue"])
        self.prefill.labels(**self.labels).observe(t["prefill"])
        self.decode.labels(**self.labels).observe(t["decode"])
        self.inference.labels(**self.labels).observe(t["inference"])
        if seq.generated > 1:
            self.tpot.labels(**self.labels).observe(t["decode"] / (seq.generated - 1))

    def on_iteration(self, record: IterationRecord) -> None:
        self.running.labels(**self.labels).set(record.running)
        self.waiting.labels(**self.labels).set(record.waiting)
        self.kv_usage.labels(**self.labels).set(
            min(1.0, record.kv_used_tokens / self.kv_capacity_tokens)
        )


class TrtllmIterationStats:
    """The JSON iteration stats `GET /metrics` returns (drained on read)."""

    def __init__(self, config: EngineConfig, maxlen: int = 1000) -> None:
        self.config = config
        self.enabled = config.enable_iter_perf_stats
        self.buffer: deque[dict[str, Any]] = deque(maxlen=maxlen)
        self.completed = 0

    def on_prefill(self, seq: Sequence) -> None: ...
    def on_spec_step(self, seq: Sequence, drafted: int, accepted: int) -> None: ...
    def on_tokens(self, seq: Sequence, count: int, interval: float, first: bool) -> None: ...
    def on_finish(self, seq: Sequence) -> None: ...

    def on_iteration(self, record: IterationRecord) -> None:
        if not self.enabled:
            return
        self.completed += record.completed
        stats: dict[str, Any] = {
            "iter": record.iteration,
            "iterLatencyMS": record.seconds * 1000.0,
            "newActiveRequestsQueueLatencyMS": 0.0,
            "numNewActiveRequests": record.new_sequences,
            "numActiveRequests": record.running + record.completed,
            "numQueuedRequests": record.waiting,
            "numCompletedRequests": record.completed,
            "maxNumActiveRequests": self.config.max_num_seqs,
            "maxBatchSizeStatic": self.config.max_num_seqs,
            "gpuMemUsage": 0,
            "cpuMemUsage": 0,
            "pinnedMemUsage": 0,
            "timestamp": time.strftime("%m-%d-%Y %H:%M:%S"),
            "kvCacheStats": {
                "maxNumBlocks": 16 * self.config.max_model_len // 32,
                "freeNumBlocks": max(
                    0, (16 * self.config.max_model_len - record.kv_used_tokens) // 32
                ),
                "usedNumBlocks": record.kv_used_tokens // 32,
                "tokensPerBlock": 32,
                "allocTotalBlocks": record.kv_used_tokens // 32,
                "allocNewBlocks": 0,
                "reusedBlocks": 0,
                "missedBlocks": 0,
                "cacheHitRate": 0.0,
            },
            "inflightBatchingStats": {
                "numScheduledRequests": record.running + record.completed,
                "numContextRequests": record.new_sequences,
                "numGenRequests": record.running + record.completed - record.new_sequences,
                "numPausedRequests": 0,
                "numCtxTokens": record.context_tokens,
                "microBatchId": 0,
                "avgNumDecodedTokensPerIter": (
                    1.0 + record.accepted_tokens / record.spec_requests
                    if record.spec_requests
                    else 1.0
                ),
            },
        }
        if self.config.speculation is not None:
            stats["specDecodingStats"] = {
                "numDraftTokens": record.draft_tokens,
                "numAcceptedTokens": record.accepted_tokens,
                "numRequestsWithDraftTokens": record.spec_requests,
                "acceptanceLength": (
                    1.0 + record.accepted_tokens / record.spec_requests
                    if record.spec_requests
                    else 1.0
                ),
                "iterLatencyMS": record.seconds * 1000.0,
                "draftOverhead": record.draft_overhead,
            }
        self.buffer.append(stats)

    def drain(self) -> list[dict[str, Any]]:
        out = list(self.buffer)
        self.buffer.clear()
        return out


class TrtllmMetrics(_Base):
    """TensorRT-LLM 1.2.1's few request metrics, labels `"undefined"`. The spec-decode,
    request-count and KV-cache series (with real labels) arrived in the 1.3 line."""

    def __init__(self, config: EngineConfig) -> None:
        super().__init__(config)
        self.enabled = config.return_perf_metrics
        self.labels = {"model_name": "undefined", "engine_type": "undefined"}
        names = list(self.labels)
        r = self.registry
        p = "trtllm_"

        def histogram(name: str, doc: str, buckets: list[float]) -> Histogram:
            return Histogram(p + name, doc, names, buckets=buckets, registry=r)

        self.success = Counter(
            p + "request_success",
            "Count of successfully processed requests.",
            [*names, "finished_reason"],
            registry=r,
        )
        self.e2e = histogram(
            "e2e_request_latency_seconds",
            "Histogram of end to end request latency in seconds.",
            LATENCY_BUCKETS,
        )
        self.ttft = histogram(
            "time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            TTFT_BUCKETS,
        )
        self.tpot = histogram(
            "time_per_output_token_seconds",
            "Histogram of time per output token in seconds.",
            TPOT_BUCKETS,
        )
        self.queue = histogram(
            "request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            LATENCY_BUCKETS,
        )
        for m in (self.e2e, self.ttft, self.tpot, self.queue):
            m.labels(**self.labels)

    def on_prefill(self, seq: Sequence) -> None: ...

    def on_spec_step(self, seq: Sequence, drafted: int, accepted: int) -> None: ...

    def on_tokens(self, seq: Sequence, count: int, interval: float, first: bool) -> None:
        if first:
            self.ttft.labels(**self.labels).observe(seq.first_token_t - seq.queued_t)

    def on_finish(self, seq: Sequence) -> None:
        reason = seq.finish_reason or "abort"
        self.success.labels(
            **self.labels, finished_reason="cancelled" if reason == "abort" else reason
        ).inc()
        if reason == "abort" or seq.first_token_t == 0.0:
            return
        t = self._request_times(seq)
        self.e2e.labels(**self.labels).observe(t["e2e"])
        self.queue.labels(**self.labels).observe(t["queue"])
        if seq.generated > 1:
            self.tpot.labels(**self.labels).observe(t["decode"] / (seq.generated - 1))
