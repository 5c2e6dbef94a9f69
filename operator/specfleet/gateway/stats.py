"""Per-request statistics read from the engine's responses. Pure: bodies and chunks in, a
summary out; nothing here does I/O or reads a clock.

- vLLM (`--per-request-spec-decode-metrics summary`): a top-level `metrics.speculative_decoding`
  with exact counts; streaming: on the final usage chunk (`choices: []`). Null for n > 1.
- TensorRT-LLM (1.2.1; per-choice counts exist in no release): only
  `avg_decoded_tokens_per_iter` on every choice and chunk, output tokens / (decode iterations
  + 1). Counts are derived from it, the output tokens and how the engine drafts at the batch
  sizes the request saw (it drafts nothing above max_concurrency or at a depth-0 step).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from specfleet.api.gateway import Drafting
from specfleet.gateway.batch import BatchSpan
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
    answered: bool = False
    """Some content or a tool call came, kept or not: a finished choice without is empty."""
    tool_calls: dict[int, _ToolCallParts] = field(default_factory=dict)
    finish_reason: str | None = None
    avg_decoded_tokens_per_iter: float | None = None

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

    def empty_answers(self) -> int:
        """Choices that finished with no content and no tool call (a reasoning model's thinking
        alone is no answer)."""
        return sum(c.finish_reason is not None and not c.answered for c in self.choices.values())

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
        out.answered = bool(text) or bool(out.tool_calls)
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
        if text or out.tool_calls:
            out.answered = True
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


def _read_root(summary: ResponseSummary, body: dict[str, Any]) -> None:
    usage = body.get("usage")
    if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
        summary.output_tokens = usage["completion_tokens"]
    metrics = body.get("metrics")
    if isinstance(metrics, dict) and isinstance(metrics.get("speculative_decoding"), dict):
        summary.vllm_spec = metrics["speculative_decoding"]


def spec_counts(
    summary: ResponseSummary,
    k: int | None,
    drafting: Drafting | None = None,
    batch: BatchSpan | None = None,
) -> SpecCounts | None:
    """vLLM's exact counts, else counts derived from TensorRT-LLM's mean acceptance length
    (needs k and n == 1); None when the response says nothing usable."""
    if summary.vllm_spec is not None:
        return _vllm_counts(summary.vllm_spec)
    choices = list(summary.choices.values())
    if len(choices) != 1 or not k or not summary.output_tokens:
        return None
    return derive_counts(
        choices[0].avg_decoded_tokens_per_iter,
        summary.output_tokens,
        depths_seen(drafting, k, batch),
        every_step=drafting.every_step if drafting else True,
        gated=drafting.gated if drafting else False,
    )


def depths_seen(drafting: Drafting | None, k: int, batch: BatchSpan | None) -> set[int]:
    """The draft depths the engine may have used while the request was in flight: those of
    every batch size between the smallest and largest batch it saw (all, when unknown)."""
    table = drafting.depth_by_batch_size if drafting else {}
    if not table:
        return {k}
    if batch is None:
        return set(table.values())
    starts = sorted(table)
    ends = [*(start - 1 for start in starts[1:]), batch.largest]
    return {
        table[start]
        for start, end in zip(starts, ends, strict=True)
        if start <= batch.largest and end >= batch.smallest
    }


def derive_counts(
    avg_tokens_per_iter: float | None,
    output_tokens: int,
    depths: set[int],
    every_step: bool,
    gated: bool = False,
) -> SpecCounts | None:
    """TensorRT-LLM counts its prefill iteration (one token, no drafts) in the mean, so
    iterations = output / mean, verify steps = iterations - 1, and every token beyond one per
    iteration was an accepted draft. Drafted is depth x steps only when the engine drafted the
    same depth on every step. A step it did not draft on (depth 0) is no rejection: a request
    that saw only depth 0 drafted nothing, and so may one with nothing accepted once the
    engine's own gate can have tripped. Where steps may have drafted differently (the batch
    crossed a depth boundary, or n-gram found no match) drafted is unknown, so the request
    counts nothing rather than a guess that would read as a collapse."""
    if not avg_tokens_per_iter or avg_tokens_per_iter < 1.0 or output_tokens < 1:
        return None
    iterations = min(max(round(output_tokens / avg_tokens_per_iter), 1), output_tokens)
    steps = iterations - 1
    accepted = output_tokens - iterations
    if accepted == 0 and (gated or depths == {0}):
        return SpecCounts(drafted=0, accepted=0, steps=0)
    if len(depths) > 1 or 0 in depths or not every_step:
        return None
    drafted = steps * next(iter(depths))
    return SpecCounts(drafted=drafted, accepted=min(accepted, drafted), steps=steps)


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


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _dicts(value: Any) -> list[dict[str, Any]]:
    return [item for item in _list(value) if isinstance(item, dict)]


def _int(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default
