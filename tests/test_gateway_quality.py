"""Output quality checks: tool-call arguments and JSON outputs."""

from __future__ import annotations

from typing import Any

import pytest

from specfleet.gateway import quality
from specfleet.gateway.quality import ToolCall, judge, structured_output_valid, tool_call_valid
from specfleet.gateway.satisfiable import admits, unsatisfiable

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city"],
}
TOOLS = [{"type": "function", "function": {"name": "weather", "parameters": WEATHER}}]
SCHEMAS = {"weather": WEATHER}


def test_tool_call_validity() -> None:
    assert tool_call_valid(ToolCall("weather", '{"city": "Oslo", "days": 3}'), SCHEMAS) is True
    assert tool_call_valid(ToolCall("weather", '{"city": "Oslo", "days": 3'), SCHEMAS) is False
    assert tool_call_valid(ToolCall("weather", '{"days": 3}'), SCHEMAS) is False  # required
    assert tool_call_valid(ToolCall("weather", '{"city": "Oslo", "days": 9}'), SCHEMAS) is False
    assert tool_call_valid(ToolCall("weather", '["Oslo"]'), SCHEMAS) is False  # not an object
    assert tool_call_valid(ToolCall("stocks", '{"city": "Oslo"}'), SCHEMAS) is False  # not offered
    assert tool_call_valid(ToolCall(None, "{}"), SCHEMAS) is False


def test_without_offered_tools_only_json_is_judged() -> None:
    assert tool_call_valid(ToolCall("anything", '{"x": 1}'), None) is True
    assert tool_call_valid(ToolCall("anything", "{x: 1}"), None) is False


def test_a_tool_without_parameters_accepts_any_object() -> None:
    assert tool_call_valid(ToolCall("ping", "{}"), {"ping": None}) is True


def test_structured_outputs() -> None:
    assert structured_output_valid('{"a": [1]}', None) is True
    assert structured_output_valid("[1, 2]", None) is False  # json_object means an object
    assert structured_output_valid('{"a": ', None) is False
    assert structured_output_valid('{"city": "Oslo"}', WEATHER) is True
    assert structured_output_valid('{"city": 7}', WEATHER) is False
    assert structured_output_valid("", WEATHER) is False
    assert structured_output_valid('"Oslo"', {"type": "string"}) is True  # a string is no reason


def test_an_unusable_schema_is_not_judged_and_says_why() -> None:
    assert structured_output_valid('{"a": 1}', {"type": "no-such-type"}) == "invalid"
    remote_ref = {"$ref": "https://example.invalid/schema.json"}
    assert structured_output_valid('{"a": 1}', remote_ref) == "remote_ref"
    # not even JSON: the schema may be why (a model constrained by it), so not judged either
    assert structured_output_valid("{", {"type": "no-such-type"}) == "invalid"
    assert tool_call_valid(ToolCall("f", "{"), {"f": remote_ref}) == "remote_ref"
    assert tool_call_valid(ToolCall("g", "{}"), {"f": remote_ref}) is False  # not offered


def test_judge_counts_every_call_and_json_choice() -> None:
    body: dict[str, Any] = {
        "tools": TOOLS,
        "response_format": {"type": "json_schema", "json_schema": {"name": "w", "schema": WEATHER}},
    }
    calls = [ToolCall("weather", '{"city": "a"}'), ToolCall("weather", "{")]
    verdicts = judge(body, ['{"city": "a"}', '{"city": 1}', None], calls)
    assert verdicts.tool_calls == (True, False)
    assert verdicts.structured_outputs == (True, False)
    assert verdicts.unjudged == ()


def test_judge_sets_checks_against_unsane_schemas_apart() -> None:
    never = {"type": "function", "function": {"name": "never", "parameters": {"not": {}}}}
    body: dict[str, Any] = {
        "tools": [*TOOLS, never],
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "r", "schema": {"$ref": "http://127.0.0.1:1/x"}},
        },
    }
    calls = [ToolCall("never", "{}"), ToolCall("weather", '{"city": "a"}')]
    verdicts = judge(body, ['{"a": 1}'], calls)
    assert verdicts.tool_calls == (True,)
    assert verdicts.structured_outputs == ()
    assert verdicts.unjudged == (
        ("tool_call", "unsatisfiable"),
        ("structured_output", "remote_ref"),
    )


def test_plain_requests_are_not_judged_for_json() -> None:
    assert judge({"messages": []}, ["not json"], []).structured_outputs == ()
    verdicts = judge({"response_format": {"type": "json_object"}}, ["{}"], [])
    assert verdicts.structured_outputs == (True,)


def test_validators_are_compiled_once_per_schema() -> None:
    cache = quality.SCHEMAS
    before = (cache.misses, cache.hits)
    schema = {**WEATHER, "title": "compiled once"}
    for _ in range(5):
        tool_call_valid(ToolCall("weather", '{"city": "x"}'), {"weather": dict(schema)})
    assert (cache.misses - before[0], cache.hits - before[1]) == (1, 4)


@pytest.mark.parametrize(
    ("schema", "expected"),
    [
        (False, True), ({"not": {}}, True), ({"not": True}, True), ({"enum": []}, True),
        ({"type": []}, True), ({"type": "string", "const": 3}, True),
        ({"type": "integer", "enum": ["a", 1.5]}, True), ({"minimum": 5, "maximum": 1}, True),
        ({"allOf": [{}, False]}, True), ({"anyOf": [False, {"not": {}}]}, True),
        ({"required": ["a"], "properties": {"a": False}}, True),
        ({"required": ["b"], "properties": {"a": {}}, "additionalProperties": False}, True),
        ({"const": 1.0, "type": "integer"}, False), ({"anyOf": [False, {}]}, False),
        ({"required": ["b"], "additionalProperties": False, "patternProperties": {"b": {}}},
         False),
        (True, False), ({}, False), ({"type": "number", "enum": [1]}, False),
        ({"$ref": "#/$defs/a", "$defs": {"a": {"not": {}}}}, True),
        ({"anyOf": [{"$ref": "#/$defs/a~1b"}], "$defs": {"a/b": {"enum": []}}}, True),
        ({"$ref": "#"}, False), ({"$ref": "#/$defs/missing"}, False),
    ],
)  # fmt: skip
def test_trivially_unsatisfiable_schemas(schema: Any, expected: bool) -> None:
    assert unsatisfiable(schema) is expected


def test_tool_call_schemas_must_admit_an_object() -> None:
    assert admits({"type": ["string", "object"]}, "object")
    assert not admits({"type": "object", "const": [1]}, "object")
    assert not admits({"enum": [1, "a"]}, "object")
    assert admits({"enum": [1, {"a": 1}]}, "object")
    assert not admits({"$ref": "#/$defs/n", "$defs": {"n": {"type": "integer"}}}, "object")
    assert not admits({"anyOf": [{"type": "string"}, {"type": "array"}]}, "object")
    assert not admits({"allOf": [{"type": ["object", "string"]}, {"type": "string"}]}, "object")
