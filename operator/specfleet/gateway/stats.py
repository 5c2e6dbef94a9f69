"""Per-request statistics read from the engine's responses. Pure: bodies and chunks in, a
summary out; nothing here does I/O or reads a clock.

- vLLM (`--per-request-spec-decode-metrics summary`): a top-level `metrics.speculative_decoding`
  with exact counts; streaming: on the final usage chunk (`choices: []`). Null for n > 1.
- TensorRT-LLM: `avg_decoded_tokens_per_iter` on every choice (the mean acceptance length,
  prefill iteration included); newer builds add `choices[i].speculative_decoding` with exact
  counts. Without those, counts are derived from the mean, the output tokens and k.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from specfleet.gateway.quality import ToolCall


@dataclass(frozen=True)
class SpecCounts:
    drafted: int
    accepted: int
    steps: int


@dataclass
class _ToolCallParts:
    name: str | None = None
    arguments: list[str] = field(default_factory=list)


@dataclass
class ChoiceOutput:
    index: int
    content: list[str] = field(default_factory=list)
    has_content: bool = False
    tool_calls: dict[int, _ToolCallParts] = field(default_factory=dict)
    finish_reason: str | None = None
    avg_decoded_tokens_per_iter: float | None = None
    speculative_decoding: dict[str, Any] | None = None

    def text(self) -> str | None:
        """The content; None when there is none (a tool call's empty content is none)."""
        if not self.has_content:
            return None
        joined = "".join(self.content)
        return None if not joined and self.tool_calls else joined

    def calls(self) -> list[ToolCall]:
        return [
            ToolCall(parts.name, "".join(parts.arguments))
            for _, parts in sorted(self.tool_calls.items())
        ]


@dataclass
class ResponseSummary:
    choices: dict[int, ChoiceOutput] = field(default_factory=dict)
    output_tokens: int | None = None
    vllm_spec: dict[str, Any] | None = None
    error: bool = False

    def choice(self, index: int) -> ChoiceOutput:
        found = self.choices.get(index)
        if found is None:
            found = self.choices[index] = ChoiceOutput(index)
        return found

    def finish_reasons(self) -> list[str | None]:
        return [c.finish_reason for _, c in sorted(self.choices.items())]

    def contents(self) -> list[str | None]:
        return [c.text() for _, c in sorted(self.choices.items())]

    def tool_calls(self) -> list[ToolCall]:
        return [call for _, c in sorted(self.choices.items()) for call in c.calls()]


def summarize_body(body: Any) -> ResponseSummary:
    """A non-streaming chat or completion response."""
    summary = ResponseSummary()
    if not isinstance(body, dict):
        return summary
    summary.error = is_error(body)
    for raw in _dicts(body.get("choices")):
        out = summary.choice(_int(raw.get("index"), 0))
        message = raw.get("message")
        text = message.get("content") if isinstance(message, dict) else raw.get("text")
        if isinstance(text, str):
            out.content.append(text)
            out.has_content = True
        if isinstance(message, dict):
            for position, call in enumerate(_list(message.get("tool_calls"))):
                _add_tool_call_delta(out, call, position)
        _read_choice_tail(out, raw)
    _read_root(summary, body)
    return summary


class StreamTally:
    """Accumulates a stream's chunks. `feed` returns whether the chunk carries output (for
    TTFT/TPOT). Content is only kept when `keep_content` (the request asked for JSON)."""

    def __init__(self, keep_content: bool) -> None:
        self.summary = ResponseSummary()
        self.keep_content = keep_content

    def feed(self, chunk: Any) -> bool:
        if not isinstance(chunk, dict):
            return False
        if is_error(chunk):
            self.summary.error = True
            return False
        bearing = False
        for raw in _dicts(chunk.get("choices")):
            out = self.summary.choice(_int(raw.get("index"), 0))
            bearing = self._feed_choice(out, raw) or bearing
        _read_root(self.summary, chunk)
        return bearing

    def _feed_choice(self, out: ChoiceOutput, raw: dict[str, Any]) -> bool:
        delta = raw.get("delta")
        bearing = False
        if isinstance(delta, dict):
            text = delta.get("content")
            calls = _list(delta.get("tool_calls"))
            for call in calls:
                _add_tool_call_delta(out, call, len(out.tool_calls))
            reasoning = delta.get("reasoning_content") or delta.get("reasoning")
            bearing = bool(text) or bool(calls) or bool(reasoning)
        else:
            text = raw.get("text")
            bearing = bool(text)
        if isinstance(text, str):
            out.has_content = True
            if self.keep_content:
                out.content.append(text)
        _read_choice_tail(out, raw)
        return bearing


def is_error(body: dict[str, Any]) -> bool:
    """vLLM's `{"error": {...}}` or TensorRT-LLM's flat `{"object": "error", ...}`."""
    return "choices" not in body and ("error" in body or body.get("object") == "error")


def _add_tool_call_delta(out: ChoiceOutput, call: Any, position: int) -> None:
    if not isinstance(call, dict):
        return
    parts = out.tool_calls.setdefault(_int(call.get("index"), position), _ToolCallParts())
    function = call.get("function")
    if not isinstance(function, dict):
        return
    if isinstance(function.get("name"), str) and function["name"]:
        parts.name = function["name"]
    if isinstance(function.get("arguments"), str):
        parts.arguments.append(function["arguments"])


def _read_choice_tail(out: ChoiceOutput, raw: dict[str, Any]) -> None:
    reason = raw.get("finish_reason")
    if isinstance(reason, str):
        out.finish_reason = reason
    avg = raw.get("avg_decoded_tokens_per_iter")
    if isinstance(avg, int | float):
        out.avg_decoded_tokens_per_iter = float(avg)
    spec = raw.get("speculative_decoding")
    if isinstance(spec, dict):
        out.speculative_decoding = spec


def _read_root(summary: ResponseSummary, body: dict[str, Any]) -> None:
    usage = body.get("usage")
    if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
        summary.output_tokens = usage["completion_tokens"]
    metrics = body.get("metrics")
    if isinstance(metrics, dict) and isinstance(metrics.get("speculative_decoding"), dict):
        summary.vllm_spec = metrics["speculative_decoding"]


def spec_counts(summary: ResponseSummary, k: int | None) -> SpecCounts | None:
    """Exact counts when the engine reports them, else derived from TensorRT-LLM's mean
    acceptance length (needs k, n == 1); None when the response says nothing usable."""
    if summary.vllm_spec is not None:
        return _vllm_counts(summary.vllm_spec)
    choices = list(summary.choices.values())
    if choices and all(c.speculative_decoding is not None for c in choices):
        return _sum(_trtllm_counts(c.speculative_decoding or {}) for c in choices)
    if len(choices) == 1 and k and summary.output_tokens:
        return derive_counts(choices[0].avg_decoded_tokens_per_iter, summary.output_tokens, k)
    return None


def derive_counts(
    avg_tokens_per_iter: float | None, output_tokens: int, k: int
) -> SpecCounts | None:
    """TensorRT-LLM counts its prefill iteration (one token, no drafts) in the mean, so
    iterations = output / mean, verify steps = iterations - 1, and every token beyond one per
    iteration was an accepted draft. Drafted assumes k drafts per step (exact unless the engine
    shortened drafts near max_tokens or above max_concurrency)."""
    if not avg_tokens_per_iter or avg_tokens_per_iter < 1.0 or output_tokens < 1:
        return None
    iterations = min(max(round(output_tokens / avg_tokens_per_iter), 1), output_tokens)
    steps = iterations - 1
    drafted = steps * k
    accepted = min(output_tokens - iterations, drafted)
    return SpecCounts(drafted=drafted, accepted=accepted, steps=steps)


def tpot(first_token_t: float, last_token_t: float, output_tokens: int | None) -> float | None:
    """(end - first token) / (output tokens - 1), when there are at least two tokens."""
    if output_tokens is None or output_tokens < 2 or last_token_t < first_token_t:
        return None
    return (last_token_t - first_token_t) / (output_tokens - 1)


def _vllm_counts(spec: dict[str, Any]) -> SpecCounts | None:
    values = (spec.get("num_draft_tokens"), spec.get("num_accepted_draft_tokens"))
    if not all(isinstance(v, int) for v in values):
        return None
    return SpecCounts(
        drafted=spec["num_draft_tokens"],
        accepted=spec["num_accepted_draft_tokens"],
        steps=_int(spec.get("num_spec_steps"), 0),
    )


def _trtllm_counts(spec: dict[str, Any]) -> SpecCounts | None:
    values = (spec.get("total_draft_tokens"), spec.get("total_accepted_draft_tokens"))
    if not all(isinstance(v, int) for v in values):
        return None
    return SpecCounts(
        drafted=spec["total_draft_tokens"],
        accepted=spec["total_accepted_draft_tokens"],
        steps=_int(spec.get("num_spec_steps"), 0),
    )


def _sum(parts: Any) -> SpecCounts | None:
    drafted = accepted = steps = 0
    for part in parts:
        if part is None:
            return None
        drafted, accepted, steps = (
            drafted + part.drafted,
            accepted + part.accepted,
            steps + part.steps,
        )
    return SpecCounts(drafted, accepted, steps)


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _dicts(value: Any) -> list[dict[str, Any]]:
    return [item for item in _list(value) if isinstance(item, dict)]


def _int(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default
