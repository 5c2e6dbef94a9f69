"""What the simulated model "says": filler text, token counts, tool-call
arguments and JSON answers generated from a JSON schema (valid, or broken on
purpose).

Token counting is an approximation, documented so tests can rely on it:
a chat prompt counts `3 + Σ_messages (4 + ⌈chars/4⌉)` plus `⌈chars/4⌉` of the
JSON-encoded `tools`; a completions prompt counts `max(1, ⌈chars/4⌉)`. Output
tokens are exact: one token is one generated piece.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "PlannedOutput",
    "arguments_for_schema",
    "count_chat_prompt_tokens",
    "count_text_prompt_tokens",
    "filler_pieces",
    "split_pieces",
    "value_for_schema",
]

_WORDS = (
    "the", "fleet", "drafts", "tokens", "and", "target", "verifies", "them", "while",
    "guard", "watches", "acceptance", "per", "class", "so", "speculation", "pays", "for",
    "itself", "or", "steps", "aside", "quietly", "latency", "stays", "inside", "budget",
    "that", "each", "prompt", "declares", "in", "its", "spec",
)  # fmt: skip


def _chars(value: Any) -> int:
    if value is None:
        return 0
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list):
        total = 0
        for part in value:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                total += len(part["text"])
            else:
                total += len(json.dumps(part))
        return total
    return len(json.dumps(value))


def count_chat_prompt_tokens(messages: list[Any], tools: list[Any] | None = None) -> int:
    total = 3
    for message in messages:
        chars = 0
        if isinstance(message, dict):
            chars = _chars(message.get("content"))
            if message.get("tool_calls"):
                chars += len(json.dumps(message["tool_calls"]))
        total += 4 + math.ceil(chars / 4)
    if tools:
        total += math.ceil(len(json.dumps(tools)) / 4)
    return total


def count_text_prompt_tokens(prompt: str) -> int:
    return max(1, math.ceil(len(prompt) / 4))


def filler_pieces(n: int, rng: random.Random) -> list[str]:
    """`n` word tokens; all but the first carry a leading space."""
    words = [rng.choice(_WORDS) for _ in range(n)]
    return [w if i == 0 else " " + w for i, w in enumerate(words)]


def split_pieces(text: str, size: int = 4) -> list[str]:
    """Cut `text` into tokens of at most `size` characters (their join is `text`)."""
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


# ------------------------------------------------------------- JSON from a schema


def value_for_schema(schema: Any, rng: random.Random, depth: int = 0) -> Any:
    """A value that satisfies the (simple) JSON schema: types, properties,
    required, enum, const, items, min/max, anyOf/oneOf/allOf (first branch)."""
    if not isinstance(schema, dict) or depth > 6:
        return {}
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return rng.choice(schema["enum"])
    for key in ("anyOf", "oneOf"):
        if schema.get(key):
            return value_for_schema(schema[key][0], rng, depth + 1)
    if schema.get("allOf"):
        merged: dict[str, Any] = {}
        for part in schema["allOf"]:
            if isinstance(part, dict):
                merged.update(part)
        return value_for_schema(merged, rng, depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((t for t in kind if t != "null"), kind[0] if kind else None)
    if kind is None:
        kind = "object" if "properties" in schema else "string"
    if kind == "object":
        props = schema.get("properties") or {}
        return {name: value_for_schema(sub, rng, depth + 1) for name, sub in props.items()}
    if kind == "array":
        lo = int(schema.get("minItems", 1))
        hi = max(lo, int(schema.get("maxItems", lo + 1)))
        return [
            value_for_schema(schema.get("items", {}), rng, depth + 1)
            for _ in range(min(hi, lo + 1))
        ]
    if kind == "integer":
        lo = int(schema.get("minimum", 0))
        hi = int(schema.get("maximum", lo + 100))
        return rng.randint(lo, max(lo, hi))
    if kind == "number":
        flo = float(schema.get("minimum", 0.0))
        fhi = float(schema.get("maximum", flo + 100.0))
        return round(rng.uniform(flo, max(flo, fhi)), 2)
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "null":
        return None
    length = int(schema.get("minLength", 0))
    text = " ".join(rng.choice(_WORDS) for _ in range(2))
    return text.ljust(length, "x")


def _break(schema: Any, value: Any, rng: random.Random) -> str:
    """Serialize an answer that is wrong: schema-violating if possible, else not JSON."""
    if isinstance(value, dict) and isinstance(schema, dict) and rng.random() < 0.5:
        required = [r for r in schema.get("required") or [] if r in value]
        if required:
            broken = dict(value)
            del broken[rng.choice(required)]
            return json.dumps(broken)
        props = [p for p in (schema.get("properties") or {}) if p in value]
        if props:
            broken = dict(value)
            name = rng.choice(props)
            broken[name] = [] if not isinstance(value[name], list) else "not-a-list"
            return json.dumps(broken)
    text = json.dumps(value)
    return text[: max(1, len(text) - 1)] if len(text) > 1 else "{"


def arguments_for_schema(schema: Any, rng: random.Random, *, valid: bool) -> str:
    """JSON text for a tool call / structured answer; `valid=False` breaks it."""
    value = value_for_schema(schema or {"type": "object"}, rng)
    if valid:
        return json.dumps(value)
    return _break(schema, value, rng)


@dataclass(frozen=True)
class PlannedOutput:
    """The whole answer a request will get if nothing cuts it short."""

    kind: Literal["text", "tool_call", "json"]
    pieces: tuple[str, ...]  # one per output token
    valid: bool = True
    tool_name: str | None = None

    def text(self, n: int | None = None) -> str:
        return "".join(self.pieces if n is None else self.pieces[:n])
