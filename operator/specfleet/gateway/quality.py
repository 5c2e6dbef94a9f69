"""Output quality signals that catch "cheaper wrong answers": tool-call arguments and JSON
outputs that do not parse or do not match the schema the request gave. Pure.

Compiled validators are cached by the schema's canonical JSON, so a client that sends the same
tools on every request pays for compilation once.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Protocol

from jsonschema import SchemaError
from jsonschema.validators import validator_for

from specfleet.gateway.classify import response_format_type

log = logging.getLogger(__name__)


class _Validator(Protocol):
    def is_valid(self, instance: Any) -> bool: ...


@dataclass(frozen=True)
class ToolCall:
    name: str | None
    arguments: str


@dataclass(frozen=True)
class Verdicts:
    """One response's quality checks: one entry per tool call and per JSON output checked."""

    tool_calls: tuple[bool, ...] = ()
    structured_outputs: tuple[bool, ...] = ()


def tool_schemas(body: Mapping[str, Any]) -> dict[str, Any] | None:
    """Tool name -> its parameters schema (None: no schema), or None when the request offers no
    tools (then any tool call is only checked for being JSON)."""
    tools = body.get("tools")
    if not isinstance(tools, list) or not tools:
        return None
    schemas: dict[str, Any] = {}
    for tool in tools:
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            schemas[function["name"]] = function.get("parameters")
    return schemas


def output_schema(body: Mapping[str, Any]) -> tuple[bool, Any]:
    """(the request asks for JSON output, the schema it must match or None)."""
    kind = response_format_type(body)
    if kind == "json_object":
        return True, None
    if kind == "json_schema":
        spec = body["response_format"].get("json_schema")
        return True, spec.get("schema") if isinstance(spec, dict) else None
    return False, None


def tool_call_valid(call: ToolCall, schemas: Mapping[str, Any] | None) -> bool:
    """Arguments parse as a JSON object and match the offered tool's parameters schema. A call
    to a tool the request did not offer is invalid."""
    parsed = _parse(call.arguments)
    if not isinstance(parsed, dict):
        return False
    if schemas is None:
        return True
    if call.name is None or call.name not in schemas:
        return False
    return _matches(parsed, schemas[call.name])


def structured_output_valid(content: str, schema: Any) -> bool:
    """json_object: the content is a JSON object; json_schema: it also matches the schema."""
    parsed = _parse(content)
    if schema is None:
        return isinstance(parsed, dict)
    return parsed is not _INVALID and _matches(parsed, schema)


def judge(
    body: Mapping[str, Any], contents: Iterable[str | None], calls: Iterable[ToolCall]
) -> Verdicts:
    """Checks every tool call, and every choice's content when the request asked for JSON."""
    schemas = tool_schemas(body)
    tool_verdicts = tuple(tool_call_valid(call, schemas) for call in calls)
    wants, schema = output_schema(body)
    structured: tuple[bool, ...] = ()
    if wants:
        structured = tuple(
            structured_output_valid(content, schema) for content in contents if content is not None
        )
    return Verdicts(tool_verdicts, structured)


_INVALID = object()


def _parse(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, TypeError):
        return _INVALID


def _matches(instance: Any, schema: Any) -> bool:
    if schema is None or schema == {}:
        return True
    try:
        key = json.dumps(schema, sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError):
        return True
    # An unusable schema is the request's fault, not the model's: only JSON-ness is judged.
    validator = _validator(key)
    if validator is None:
        return True
    try:
        return validator.is_valid(instance)
    except Exception:  # e.g. an unresolvable $ref: the request's fault, not the model's
        return True


@lru_cache(maxsize=512)
def _validator(schema_json: str) -> _Validator | None:
    schema = json.loads(schema_json)
    if not isinstance(schema, dict):
        return None
    cls = validator_for(schema)
    try:
        cls.check_schema(schema)
    except SchemaError as exc:
        log.info("unusable JSON schema in a request: %s", exc.message)
        return None
    validator: _Validator = cls(schema)
    return validator
