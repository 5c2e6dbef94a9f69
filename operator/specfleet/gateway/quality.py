"""Output quality signals that catch "cheaper wrong answers": tool-call arguments and JSON
outputs that do not parse or do not match the schema the request gave. Pure but for the
bounded cache of screened schemas (`schemas.SchemaCache`).

A check is judged (valid or not) only against a schema a sane validator can check; a check
against any other schema is not judged, and its reason is counted apart, so crafted schemas
cannot move the validity the guard reads.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from specfleet.gateway.classify import response_format_type
from specfleet.gateway.schemas import Checker, Reason, SchemaCache

Kind = Literal["tool_call", "structured_output"]
KINDS: Final[tuple[Kind, ...]] = ("tool_call", "structured_output")
Judgement = bool | Reason
"""Valid, invalid, or the reason the output was not judged."""

SCHEMAS = SchemaCache()


@dataclass(frozen=True)
class ToolCall:
    name: str | None
    arguments: str


@dataclass(frozen=True)
class Verdicts:
    """One response's quality checks: one entry per tool call and per JSON output judged,
    and (kind, reason) per check that was not."""

    tool_calls: tuple[bool, ...] = ()
    structured_outputs: tuple[bool, ...] = ()
    unjudged: tuple[tuple[Kind, Reason], ...] = ()


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


def tool_call_valid(call: ToolCall, schemas: Mapping[str, Any] | None) -> Judgement:
    """Arguments parse as a JSON object and match the offered tool's parameters schema. A call
    to a tool the request did not offer is invalid; a call to one whose schema is not sane is
    not judged, whatever its arguments (the schema may be why they are what they are)."""
    checker: Checker | None = None
    if schemas is not None:
        if call.name is None or call.name not in schemas:
            return False
        screened = _checker(schemas[call.name], want_object=True)
        if isinstance(screened, str):
            return screened
        checker = screened
    parsed = _parse(call.arguments)
    if parsed is _TOO_DEEP:
        return "budget"
    if not isinstance(parsed, dict):
        return False
    return checker.check(parsed) if checker is not None else True


def structured_output_valid(content: str, schema: Any) -> Judgement:
    """json_object: the content is a JSON object; json_schema: it also matches the schema (not
    judged when the schema is not sane)."""
    checker = _checker(schema, want_object=False) if schema is not None else None
    if isinstance(checker, str):
        return checker
    parsed = _parse(content)
    if parsed is _TOO_DEEP:
        return "budget"
    if checker is None:
        return isinstance(parsed, dict) if schema is None else parsed is not _INVALID
    return parsed is not _INVALID and checker.check(parsed)


def judge(
    body: Mapping[str, Any], contents: Iterable[str | None], calls: Iterable[ToolCall]
) -> Verdicts:
    """Checks every tool call, and every choice's content when the request asked for JSON."""
    schemas = tool_schemas(body)
    judged: dict[Kind, list[bool]] = {kind: [] for kind in KINDS}
    unjudged: list[tuple[Kind, Reason]] = []

    def add(kind: Kind, judgement: Judgement) -> None:
        if isinstance(judgement, bool):
            judged[kind].append(judgement)
        else:
            unjudged.append((kind, judgement))

    for call in calls:
        add("tool_call", tool_call_valid(call, schemas))
    wants, schema = output_schema(body)
    if wants:
        for content in contents:
            if content is not None:
                add("structured_output", structured_output_valid(content, schema))
    return Verdicts(tuple(judged["tool_call"]), tuple(judged["structured_output"]), tuple(unjudged))


_INVALID = object()
_TOO_DEEP = object()


def _parse(text: str) -> Any:
    """The JSON value; _INVALID when it is not JSON, _TOO_DEEP when it nests too deep to read."""
    try:
        return json.loads(text)
    except (ValueError, TypeError):
        return _INVALID
    except RecursionError:
        return _TOO_DEEP


def _checker(schema: Any, want_object: bool) -> Checker | Reason | None:
    """The schema's checker, why outputs are not judged against it, or None when it allows
    anything (absent or `{}`)."""
    if schema is None or schema == {}:
        return None
    return SCHEMAS.get(schema, want_object)
