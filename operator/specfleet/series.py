"""The series the gateway exports and telemetry reads: their names, their labels, and the label
values telemetry selects on. A contract between the two. Also the names of the series the
operator exports about itself (`controller.metrics`, `alerts.metrics`): with the gateway's,
the only names the chart's dashboard and alert rules may select (tests/test_series_names.py).

Prometheus adds `_total` to counters and `_bucket`/`_sum`/`_count` to histograms. The gateway
labels each series by class (and outcome, validity, ...); the scrape adds `namespace`, and the
monitors' relabelings the pod's SpecModel, revision and speculation
(`render.workload.pod_relabelings`).
"""

from __future__ import annotations

REQUESTS = "specfleet_requests"
DRAFT_TOKENS = "specfleet_spec_draft_tokens"
ACCEPTED_TOKENS = "specfleet_spec_accepted_tokens"
SPEC_STEPS = "specfleet_spec_steps"
REQUEST_MOMENTS = "specfleet_request_moments"
"""Per-request sums behind the spread of the acceptance rate, TPOT and TTFT, by `MOMENT`."""
OUTPUT_TOKENS = "specfleet_output_tokens"
REQUEST_SECONDS = "specfleet_request_seconds"
TTFT = "specfleet_ttft_seconds"
TPOT = "specfleet_tpot_seconds"
TOOL_CALLS = "specfleet_tool_calls"
STRUCTURED_OUTPUTS = "specfleet_structured_outputs"
QUALITY_UNJUDGED = "specfleet_quality_unjudged"
FINISH_REASONS = "specfleet_finish_reasons"
EMPTY_ANSWERS = "specfleet_empty_answers"
GATEWAY_ERRORS = "specfleet_gateway_errors"
GATEWAY_REFUSED = "specfleet_gateway_refused"
GATEWAY_PUMPED = "specfleet_gateway_pumped_chunks"
PLAIN_POOL_FALLBACKS = "specfleet_gateway_plain_pool_fallbacks"
MIRROR_SENT = "specfleet_mirror_sent"
MIRROR_DROPPED = "specfleet_mirror_dropped"
MIRROR_ERRORS = "specfleet_mirror_errors"
MIRROR_COMPARED = "specfleet_mirror_compared"
MIRROR_EXACT_MATCHES = "specfleet_mirror_exact_matches"
MIRROR_AGREEMENT = "specfleet_mirror_agreement"
VLLM_KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"
"""The engine's own gauge (0..1), scraped from its pods: an experiment's memory headroom."""

# The operator's own series, served on its --metrics-port.
RECONCILES = "specfleet_reconcile"
RECONCILE_SECONDS = "specfleet_reconcile_duration_seconds"
API_WRITES = "specfleet_api_writes"
SPECMODELS = "specfleet_specmodels"
KILL_SWITCH_ENGAGED = "specfleet_kill_switch_engaged"
GUARD_DECISIONS = "specfleet_guard_decisions"
ROLLBACKS = "specfleet_rollbacks"
GUARD_BLIND = "specfleet_guard_blind"
ACTIVE_REVISION = "specfleet_active_revision"
ALERT_RECEIVERS_UNREADABLE = "specfleet_alert_receivers_unreadable"
ROLLOUT_CANARY_PODS = "specfleet_rollout_canary_pods"
ROLLOUT_STEP = "specfleet_rollout_step"
LEADER = "specfleet_leader"
CLASS_BREACHING = "specfleet_class_breaching"
ALERT_DELIVERIES = "specfleet_alert_deliveries"

# Labels the gateway sets.
CLASS = "class"
OUTCOME = "outcome"
VALID = "valid"
KIND = "kind"
REASON = "reason"
STAGE = "stage"
STATUS = "status"
ARM = "arm"
MOMENT = "moment"
POOL = "pool"
"""Which pool served: the gateway's per-class series say it of each request (`FLEET_POOL`, its
own engine, or `PLAIN_POOL`); the plain pool's engine series carry it from its pods' label."""

# Labels the scrape adds.
NAMESPACE = "namespace"
SPECMODEL = "specmodel"
REVISION = "revision"
SPECULATION = "speculation"

EXPERIMENT = "experiment"
"""An experiment arm's pods carry its experiment's name, and `ARM` the arm's: the fleet's
mirrored series name in `ARM` the arm they went to."""

OUTCOMES = ("ok", "client_error", "upstream_error", "gateway_error", "cancelled")
"""upstream_error is the engine's failure only; gateway_error the gateway's own."""
UPSTREAM_ERROR = "upstream_error"
MOMENTS = (
    "drafting_requests",
    "accepted_squared",
    "drafted_squared",
    "accepted_drafted",
    "tpot_squared_seconds",
    "ttft_squared_seconds",
)
"""The `MOMENT`s of REQUEST_MOMENTS: requests that reported drafts, Σ accepted², Σ drafted²,
Σ accepted·drafted over them, and Σ TPOT² and Σ TTFT² over the requests the TPOT and TTFT
histograms observed."""
TRUNCATED = "length"
"""The finish `reason` of a choice cut at its token limit (max_tokens or the context)."""


FLEET_POOL = "fleet"
PLAIN_POOL = "plain"


def valid_value(valid: bool) -> str:
    """The `valid` label of a tool call or JSON output."""
    return "true" if valid else "false"


def speculation_value(on: bool) -> str:
    """The `speculation` label: the pod's label, as the pod runs it."""
    return "on" if on else "off"
