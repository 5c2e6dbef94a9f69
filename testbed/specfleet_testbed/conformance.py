"""The simulator held to the real vLLM: the same requests to both, compared by wire shape.

A *shape* keeps what a client or our gateway depends on and drops what varies from run to run:
every key of every object, the JSON type of every value (`"str"`, `"int"`, `"float"`,
`"bool"`, `"null"`), and the values of the keys that say what a message *is* (`object`,
`role`, `type`, `param`, `code`, error messages, `finish_reason`). Ids keep their prefix and
length (`chatcmpl-<16 hex>`), the fingerprint its form (`vllm-<version>-<hash>`). A stream
becomes its distinct chunk shapes in the order they first appear, so neither the number of
content chunks (which depends on the text) nor how the choices of `n > 1` interleave counts,
but which chunk carries which keys, and what comes first and last, does. A `/metrics`
page becomes its `vllm:*` families with their type and label names.

`CASES` are the requests, `exchange` sends one to an engine; `hack/record_real_vllm.py`
writes the real engine's shapes as fixtures (`tests/data/real-vllm/`), which
`tests/test_conformance_fixtures.py` compares with the simulator's offline and
`e2e/test_conformance.py` live.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

__all__ = [
    "CASES",
    "Case",
    "engine_families",
    "exchange",
    "shape",
    "stream_shape",
]

# Keys whose values are part of the contract (normalized where they vary).
_KEPT = {"object", "role", "type", "param", "code", "message", "finish_reason"}
_ID = re.compile(r"^(chatcmpl-tool|chatcmpl|cmpl)-([0-9a-f]+)$")
_FINGERPRINT = re.compile(r"^vllm-[^-]+(-(tp|pp|dp)\d+|-ep)*-[0-9a-f]{8}$")


def _scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    return type(value).__name__


def _kept(key: str, value: Any) -> Any:
    if key == "id" and isinstance(value, str) and (m := _ID.match(value)):
        return f"{m.group(1)}-<{len(m.group(2))} hex>"
    if key == "system_fingerprint" and isinstance(value, str) and _FINGERPRINT.match(value):
        return "vllm-<version>-<hash>"
    if key in _KEPT and not isinstance(value, dict | list):
        return value
    return None


def shape(value: Any, key: str = "") -> Any:
    """The shape of a JSON value (see the module doc)."""
    if isinstance(value, dict):
        return {k: shape(v, k) for k, v in sorted(value.items())}
    if isinstance(value, list):
        return [shape(v, key) for v in value]
    kept = _kept(key, value)
    return kept if kept is not None else _scalar(value)


def stream_shape(events: list[Any]) -> list[Any]:
    """The distinct chunk shapes of an SSE stream (`[DONE]` included), in order of first
    appearance."""
    out: list[Any] = []
    for event in events:
        s = event if event == "[DONE]" else shape(event)
        if s not in out:
            out.append(s)
    return out


def engine_families(text: str) -> dict[str, dict[str, Any]]:
    """A `/metrics` page's `vllm:*` families as `{name: {"type", "labels"}}` (label names
    without histogram `le`; the `_created` companions left out)."""
    families: dict[str, dict[str, Any]] = {}
    for family in text_string_to_metric_families(text):
        if not family.name.startswith("vllm:") or family.name.endswith("_created"):
            continue
        labels = {name for sample in family.samples for name in sample.labels}
        families[family.name] = {"type": family.type, "labels": sorted(labels - {"le"})}
    return families


@dataclass(frozen=True)
class Case:
    """One request: `body` is sent to `path` (GET when None); `{model}` is the served name."""

    name: str
    path: str
    body: dict[str, Any] | None = None
    stream: bool = field(default=False)


_MESSAGES = [{"role": "user", "content": "def add(a, b): return a + b. def add(a, b): return"}]
_CHAT = {"model": "{model}", "messages": _MESSAGES, "max_tokens": 12, "temperature": 0}
# Seeded: unseeded, the random model now and then samples a last token that decodes to no text
# (a byte of a character), and the real engine then ends that choice with an empty delta.
_SAMPLED_TWICE = {"n": 2, "temperature": 0.8, "ignore_eos": True, "seed": 1234}
_COMPLETION = {"model": "{model}", "prompt": "one two three one two", "max_tokens": 12}
_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 8}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
_NAMED = {"type": "function", "function": {"name": "get_weather"}}
_SCHEMA = {
    "type": "json_schema",
    "json_schema": {
        "name": "answer",
        "schema": {
            "type": "object",
            "properties": {"answer": {"type": "string", "maxLength": 8}},
            "required": ["answer"],
            "additionalProperties": False,
        },
    },
}


def _stream(body: dict[str, Any], **options: Any) -> dict[str, Any]:
    out = {**body, "stream": True}
    if options:
        out["stream_options"] = options
    return out


CASES: tuple[Case, ...] = (
    Case("chat", "/v1/chat/completions", _CHAT),
    Case("completion", "/v1/completions", _COMPLETION),
    Case("chat-stream", "/v1/chat/completions", _stream(_CHAT), stream=True),
    Case(
        "chat-stream-usage",
        "/v1/chat/completions",
        _stream(_CHAT, include_usage=True),
        stream=True,
    ),
    Case(
        "chat-stream-options-empty",
        "/v1/chat/completions",
        _stream(_CHAT) | {"stream_options": {}},
        stream=True,
    ),
    Case(
        "chat-stream-continuous-only",
        "/v1/chat/completions",
        _stream(_CHAT, continuous_usage_stats=True),
        stream=True,
    ),
    Case(
        "chat-stream-continuous-usage",
        "/v1/chat/completions",
        _stream(_CHAT, include_usage=True, continuous_usage_stats=True),
        stream=True,
    ),
    Case("completion-stream", "/v1/completions", _stream(_COMPLETION), stream=True),
    Case(
        "completion-stream-usage",
        "/v1/completions",
        _stream(_COMPLETION, include_usage=True),
        stream=True,
    ),
    Case(
        "chat-tool-named",
        "/v1/chat/completions",
        _CHAT | {"tools": [_TOOL], "tool_choice": _NAMED, "max_tokens": 200},
    ),
    Case(
        "chat-tool-named-stream",
        "/v1/chat/completions",
        _stream(_CHAT, include_usage=True)
        | {"tools": [_TOOL], "tool_choice": _NAMED, "max_tokens": 200},
        stream=True,
    ),
    Case(
        "chat-json-schema",
        "/v1/chat/completions",
        _CHAT | {"response_format": _SCHEMA, "max_tokens": 200},
    ),
    # ignore_eos: a sampled choice of the random model may draw its end token (finish "stop").
    Case("chat-n2-sampled", "/v1/chat/completions", _CHAT | _SAMPLED_TWICE),
    Case(
        "chat-n2-sampled-stream",
        "/v1/chat/completions",
        _stream(_CHAT, include_usage=True) | _SAMPLED_TWICE,
        stream=True,
    ),
    Case("error-n2-greedy", "/v1/chat/completions", _CHAT | {"n": 2}),
    Case("error-max-tokens", "/v1/completions", _COMPLETION | {"max_tokens": 100_000}),
    Case("error-unknown-model", "/v1/chat/completions", _CHAT | {"model": "no-such-model"}),
    Case("load", "/load"),
    Case("models", "/v1/models"),
    Case("version", "/version"),
)


def _with_model(value: Any, model: str) -> Any:
    if isinstance(value, dict):
        return {k: _with_model(v, model) for k, v in value.items()}
    return model if value == "{model}" else value


def _events(text: str) -> list[Any]:
    events = [e.removeprefix("data: ").strip() for e in text.split("\n\n") if e.startswith("data:")]
    return [e if e == "[DONE]" else json.loads(e) for e in events]


async def exchange(http: httpx.AsyncClient, base_url: str, case: Case, model: str) -> Any:
    """Send `case`; its status and shape (`chunks` for a stream, else `body`)."""
    if case.body is None:
        response = await http.get(base_url + case.path)
    else:
        response = await http.post(base_url + case.path, json=_with_model(case.body, model))
    out: dict[str, Any] = {"status": response.status_code}
    if case.stream and response.status_code == 200:
        out["chunks"] = stream_shape(_events(response.text))
    else:
        out["body"] = shape(response.json())
    return out
