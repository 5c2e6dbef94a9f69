"""The gateway's metric names, a contract between the gateway that exports them and telemetry
that queries them (Prometheus adds `_total` to counters, `_bucket`/`_sum`/`_count` to
histograms)."""

REQUESTS = "specfleet_requests"
DRAFT_TOKENS = "specfleet_spec_draft_tokens"
ACCEPTED_TOKENS = "specfleet_spec_accepted_tokens"
SPEC_STEPS = "specfleet_spec_steps"
OUTPUT_TOKENS = "specfleet_output_tokens"
REQUEST_SECONDS = "specfleet_request_seconds"
TTFT = "specfleet_ttft_seconds"
TPOT = "specfleet_tpot_seconds"
TOOL_CALLS = "specfleet_tool_calls"
STRUCTURED_OUTPUTS = "specfleet_structured_outputs"
QUALITY_UNJUDGED = "specfleet_quality_unjudged"
FINISH_REASONS = "specfleet_finish_reasons"
GATEWAY_ERRORS = "specfleet_gateway_errors"
