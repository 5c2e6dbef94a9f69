"""Response and stream-chunk shapes, field for field, as pure functions.

vLLM 0.33 (read from vLLM's `chat_completion/protocol.py`, `completion/protocol.py`,
`generate/base/protocol.py` and `serving.py` of that era):
- non-streaming bodies are full pydantic dumps (every field, nulls included),
  except that an empty `message.tool_calls` is omitted;
- stream chunks are dumped with `exclude_unset`: only fields the server set;
- the final usage chunk (`choices: []`) is dumped with `exclude_none`, and
  carries the per-request `metrics` object;
- `system_fingerprint` (`vllm-<version>[-tpN]-<config hash>`) is on every
  non-streaming body and on a stream's last message: the usage chunk when there
  is one, else each choice's finish chunk;
- ids are `chatcmpl-` / `cmpl-` / `chatcmpl-tool-` + 16 hex digits.

TensorRT-LLM 1.2.1 (`serve/openai_protocol.py`, `postprocess_handlers.py`):
- non-streaming bodies are full dumps; chat stream chunks use `exclude_none`,
  completion chunks and the final usage chunk are full dumps;
- `avg_decoded_tokens_per_iter` (output tokens / (decode iterations + 1)) rides
  every choice and every streamed chunk; it is the only per-request speculative
  number (a per-choice `speculative_decoding` object exists in no release);
- errors are flat: `{"object": "error", "message", "type", "param", "code"}`.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from dataclasses import dataclass
from typing import Any

from specfleet_testbed.engine.args import EngineConfig
from specfleet_testbed.engine.stats import SpecStats

__all__ = [
    "ChoiceResult",
    "ToolCallResult",
    "new_id",
    "trtllm_chat_chunk",
    "trtllm_chat_completion",
    "trtllm_completion",
    "trtllm_completion_chunk",
    "trtllm_error",
    "trtllm_models",
    "trtllm_usage_chunk",
    "vllm_chat_chunk",
    "vllm_chat_completion",
    "vllm_completion",
    "vllm_completion_chunk",
    "vllm_error",
    "vllm_fingerprint",
    "vllm_models",
    "vllm_per_request_metrics",
    "vllm_usage_chunk",
]

VLLM_VERSION = "0.33.0"
TRTLLM_VERSION = "1.2.1"


def new_id(prefix: str) -> str:
    """vLLM's random_uuid: 64 random bits as 16 hex digits."""
    return f"{prefix}-{uuid.uuid4().int & (2**64 - 1):016x}"


@dataclass(frozen=True)
class ToolCallResult:
    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class ChoiceResult:
    """One finished choice, engine-neutral."""

    index: int
    text: str  # message content, or the tool call's arguments
    finish_reason: str  # API value: stop | length | tool_calls | abort
    tool_call: ToolCallResult | None = None
    # vLLM's content beside a tool call: "" when the request named the tool or required one
    tool_call_content: str | None = None
    stats: SpecStats | None = None
    avg_decoded_tokens_per_iter: float | None = None


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
    }


# =========================================================================== vLLM


def vllm_fingerprint(config: EngineConfig) -> str:
    """`--fingerprint-mode full`: version, the parallel layout beyond 1, 8 hex digits of a
    hash of the engine config (here: of its args)."""
    digest = hashlib.sha256("\0".join(config.args).encode()).hexdigest()[:8]
    layout = [f"tp{config.tp_size}"] if config.tp_size > 1 else []
    return "-".join([f"vllm-{VLLM_VERSION}", *layout, digest])


def vllm_error(
    message: str, err_type: str = "BadRequestError", code: int = 400, param: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": err_type, "param": param, "code": code}}


def vllm_models(config: EngineConfig, created: int | None = None) -> dict[str, Any]:
    created = int(time.time()) if created is None else created
    cards = []
    for name in config.served_model_names:
        cards.append(
            {
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": "vllm",
                "root": config.model,
                "parent": None,
                "max_model_len": config.max_model_len,
                "permission": [
                    {
                        "id": new_id("modelperm"),
                        "object": "model_permission",
                        "created": created,
                        "allow_create_engine": False,
                        "allow_sampling": True,
                        "allow_logprobs": True,
                        "allow_search_indices": False,
                        "allow_view": True,
                        "allow_fine_tuning": False,
                        "organization": "*",
                        "group": None,
                        "is_blocking": False,
                    }
                ],
            }
        )
    return {"object": "list", "data": cards}


_TIMING_KEYS = (
    "time_to_first_token_ms",
    "generation_time_ms",
    "queue_time_ms",
    "mean_itl_ms",
    "tokens_per_second",
)


def vllm_per_request_metrics(
    config: EngineConfig,
    stats: SpecStats | None,
    *,
    timing: dict[str, float | None] | None,
    n: int = 1,
) -> dict[str, Any] | None:
    """The response's top-level `metrics` (PerRequestMetrics), or None.

    `timing` holds time_to_first_token_ms, generation_time_ms, queue_time_ms,
    mean_itl_ms, tokens_per_second (reported with --enable-per-request-metrics);
    `speculative_decoding` needs --per-request-spec-decode-metrics. Suppressed
    for n > 1, like vLLM.
    """
    timing_on = config.enable_per_request_metrics
    spec_on = stats is not None and config.per_request_spec_decode_metrics != "none"
    if n != 1 or not (timing_on or spec_on):
        return None
    out: dict[str, Any] = {k: (timing or {}).get(k) if timing_on else None for k in _TIMING_KEYS}
    out["speculative_decoding"] = (
        stats.vllm(config.per_request_spec_decode_metrics) if spec_on and stats else None
    )
    return out


def _vllm_tool_call(tc: ToolCallResult) -> dict[str, Any]:
    return {
        "id": tc.id,
        "type": "function",
        "function": {"name": tc.name, "arguments": tc.arguments},
    }


def vllm_chat_completion(
    *,
    request_id: str,
    created: int,
    model: str,
    choices: list[ChoiceResult],
    prompt_tokens: int,
    completion_tokens: int,
    metrics: dict[str, Any] | None,
    fingerprint: str,
) -> dict[str, Any]:
    out_choices = []
    for c in choices:
        message: dict[str, Any] = {
            "role": "assistant",
            "content": c.tool_call_content if c.tool_call else c.text,
            "refusal": None,
            "annotations": None,
            "audio": None,
            "function_call": None,
        }
        if c.tool_call:
            message["tool_calls"] = [_vllm_tool_call(c.tool_call)]
        message["reasoning"] = None
        out_choices.append(
            {
                "index": c.index,
                "message": message,
                "logprobs": None,
                "finish_reason": c.finish_reason,
                "stop_reason": None,
                "token_ids": None,
                "routed_experts": None,
            }
        )
    return {
        "id": request_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": out_choices,
        "service_tier": None,
        "system_fingerprint": fingerprint,
        "usage": {
            **_usage(prompt_tokens, completion_tokens),
            "prompt_tokens_details": None,
            "completion_tokens_details": None,
        },
        "prompt_logprobs": None,
        "prompt_token_ids": None,
        "prompt_text": None,
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "metrics": metrics,
    }


def vllm_chat_chunk(
    *,
    request_id: str,
    created: int,
    model: str,
    index: int,
    delta: dict[str, Any],
    finish_reason: str | None = None,
    first: bool = False,
    usage: dict[str, Any] | None = None,
    fingerprint: str | None = None,
) -> dict[str, Any]:
    """One `chat.completion.chunk`. `delta` is what the server set, e.g.
    `{"role": "assistant", "content": ""}`, `{"content": "..."}` or
    `{"tool_calls": [{"index": 0, "function": {"arguments": "..."}}]}`.
    `usage` is the continuous usage (stream_options.continuous_usage_stats or
    --enable-force-include-usage); `fingerprint` goes on a finish chunk that no usage
    chunk follows."""
    choice: dict[str, Any] = {
        "index": index,
        "delta": delta,
        "logprobs": None,
        "finish_reason": finish_reason,
    }
    if not first:
        if finish_reason is not None:
            choice["stop_reason"] = None
        choice["token_ids"] = None
    chunk: dict[str, Any] = {
        "id": request_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [choice],
    }
    if usage is not None:
        chunk["usage"] = usage
    if fingerprint is not None:
        chunk["system_fingerprint"] = fingerprint
    if first:
        chunk["prompt_token_ids"] = None
        chunk["prompt_text"] = None
    return chunk


def vllm_continuous_usage(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return {**_usage(prompt_tokens, completion_tokens), "completion_tokens_details": None}


def vllm_usage_chunk(
    *,
    request_id: str,
    created: int,
    model: str,
    prompt_tokens: int,
    completion_tokens: int,
    metrics: dict[str, Any] | None,
    fingerprint: str,
    object_type: str = "chat.completion.chunk",
) -> dict[str, Any]:
    """The final usage chunk (`choices: []`), dumped with exclude_none."""
    chunk: dict[str, Any] = {
        "id": request_id,
        "object": object_type,
        "created": created,
        "model": model,
        "choices": [],
        "usage": _usage(prompt_tokens, completion_tokens),
        "system_fingerprint": fingerprint,
    }
    if metrics is not None:
        chunk["metrics"] = _drop_none(metrics)
    return chunk


def _drop_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_none(v) for k, v in value.items() if v is not None}
    return value


def vllm_completion(
    *,
    request_id: str,
    created: int,
    model: str,
    choices: list[ChoiceResult],
    prompt_tokens: int,
    completion_tokens: int,
    metrics: dict[str, Any] | None,
    fingerprint: str,
) -> dict[str, Any]:
    return {
        "id": request_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": c.index,
                "text": c.text,
                "logprobs": None,
                "finish_reason": c.finish_reason,
                "stop_reason": None,
                "token_ids": None,
                "prompt_logprobs": None,
                "prompt_token_ids": None,
                "routed_experts": None,
            }
            for c in choices
        ],
        "service_tier": None,
        "system_fingerprint": fingerprint,
        "usage": {
            **_usage(prompt_tokens, completion_tokens),
            "prompt_tokens_details": None,
            "completion_tokens_details": None,
        },
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "metrics": metrics,
    }


def vllm_completion_chunk(
    *,
    request_id: str,
    created: int,
    model: str,
    index: int,
    text: str,
    finish_reason: str | None,
    usage: dict[str, Any] | None = None,
    fingerprint: str | None = None,
) -> dict[str, Any]:
    chunk: dict[str, Any] = {
        "id": request_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": index,
                "text": text,
                "logprobs": None,
                "finish_reason": finish_reason,
                "stop_reason": None,
                "prompt_token_ids": None,
                "token_ids": None,
            }
        ],
    }
    if fingerprint is not None:
        chunk["system_fingerprint"] = fingerprint
    if usage is not None:
        chunk["usage"] = usage
    return chunk


# =================================================================== TensorRT-LLM


def trtllm_error(
    message: str, err_type: str = "BadRequestError", code: int = 400, param: str | None = None
) -> dict[str, Any]:
    return {"object": "error", "message": message, "type": err_type, "param": param, "code": code}


def trtllm_models(config: EngineConfig, created: int | None = None) -> dict[str, Any]:
    created = int(time.time()) if created is None else created
    return {
        "object": "list",
        "data": [
            {
                "id": config.model_name,
                "object": "model",
                "created": created,
                "owned_by": "tensorrt_llm",
            }
        ],
    }


def _trt_usage(prompt: int, completion: int) -> dict[str, Any]:
    return {**_usage(prompt, completion), "prompt_tokens_details": {"cached_tokens": 0}}


def trtllm_chat_completion(
    *,
    request_id: str,
    created: int,
    model: str,
    choices: list[ChoiceResult],
    prompt_tokens: int,
    completion_tokens: int,
) -> dict[str, Any]:
    out_choices = []
    for c in choices:
        choice: dict[str, Any] = {
            "index": c.index,
            "message": {
                "role": "assistant",
                "content": "" if c.tool_call else c.text,
                "reasoning_content": "",
                "reasoning": None,
                "tool_calls": (
                    [
                        {
                            "id": c.tool_call.id,
                            "type": "function",
                            "function": {
                                "name": c.tool_call.name,
                                "arguments": c.tool_call.arguments,
                            },
                        }
                    ]
                    if c.tool_call
                    else []
                ),
            },
            "logprobs": None,
            "finish_reason": c.finish_reason,
            "stop_reason": None,
            "mm_embedding_handle": None,
            "disaggregated_params": None,
            "avg_decoded_tokens_per_iter": c.avg_decoded_tokens_per_iter,
        }
        out_choices.append(choice)
    return {
        "id": request_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": out_choices,
        "usage": _trt_usage(prompt_tokens, completion_tokens),
        "prompt_token_ids": None,
        "prompt_token_ids_b64": None,
    }


def trtllm_chat_chunk(
    *,
    request_id: str,
    created: int,
    model: str,
    index: int,
    delta: dict[str, Any],
    finish_reason: str | None = None,
    avg_decoded_tokens_per_iter: float | None = None,
    usage: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A chat chunk dumped with exclude_none (so absent keys are simply missing)."""
    choice: dict[str, Any] = {"index": index, "delta": delta}
    if finish_reason is not None:
        choice["finish_reason"] = finish_reason
    if avg_decoded_tokens_per_iter is not None:
        choice["avg_decoded_tokens_per_iter"] = avg_decoded_tokens_per_iter
    chunk: dict[str, Any] = {
        "id": request_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [choice],
    }
    if usage is not None:
        chunk["usage"] = usage
    return chunk


def trtllm_usage_chunk(
    *,
    request_id: str,
    created: int,
    model: str,
    prompt_tokens: int,
    completion_tokens: int,
    object_type: str = "chat.completion.chunk",
) -> dict[str, Any]:
    """The final usage chunk, a full dump."""
    return {
        "id": request_id,
        "object": object_type,
        "created": created,
        "model": model,
        "choices": [],
        "usage": _trt_usage(prompt_tokens, completion_tokens),
    }


def trtllm_continuous_usage(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return _trt_usage(prompt_tokens, completion_tokens)


def trtllm_completion(
    *,
    request_id: str,
    created: int,
    model: str,
    choices: list[ChoiceResult],
    prompt_tokens: int,
    completion_tokens: int,
) -> dict[str, Any]:
    out = []
    for c in choices:
        choice: dict[str, Any] = {
            "index": c.index,
            "text": c.text,
            "token_ids": None,
            "logprobs": None,
            "context_logits": None,
            "finish_reason": c.finish_reason,
            "stop_reason": None,
            "disaggregated_params": None,
            "avg_decoded_tokens_per_iter": c.avg_decoded_tokens_per_iter,
        }
        out.append(choice)
    return {
        "id": request_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": out,
        "usage": _trt_usage(prompt_tokens, completion_tokens),
        "prompt_token_ids": None,
    }


def trtllm_completion_chunk(
    *,
    request_id: str,
    created: int,
    model: str,
    index: int,
    text: str,
    finish_reason: str | None,
    avg_decoded_tokens_per_iter: float | None = None,
    usage: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A completion chunk, a full dump (exclude_unset=False)."""
    choice: dict[str, Any] = {
        "index": index,
        "text": text,
        "token_ids": None,
        "logprobs": None,
        "finish_reason": finish_reason,
        "stop_reason": None,
        "avg_decoded_tokens_per_iter": avg_decoded_tokens_per_iter,
    }
    return {
        "id": request_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [choice],
        "usage": usage,
    }
