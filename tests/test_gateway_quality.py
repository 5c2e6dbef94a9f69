"""Output quality checks: tool-call arguments and JSON outputs."""

from __future__ import annotations

from typing import Any

from specfleet.gateway import quality
from specfleet.gateway.quality import ToolCall, judge, structured_output_valid, tool_call_valid

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
    assert tool_call_valid(ToolCall("weather", '{"city": "Oslo", "days": 3}'), SCHEMAS)
    assert not tool_call_valid(ToolCall("weather", '{"city": "Oslo", "days": 3'), SCHEMAS)
    assert not tool_call_valid(ToolCall("weather", '{"days": 3}'), SCHEMAS)  # required missing
    assert not tool_call_valid(ToolCall("weather", '{"city": "Oslo", "days": 9}'), SCHEMAS)
    assert not tool_call_valid(ToolCall("weather", '["Oslo"]'), SCHEMAS)  # not an object
    assert not tool_call_valid(ToolCall("stocks", '{"city": "Oslo"}'), SCHEMAS)  # not offered
    assert not tool_call_valid(ToolCall(None, "{}"), SCHEMAS)


def test_without_offered_tools_only_json_is_judged() -> None:
    assert tool_call_valid(ToolCall("anything", '{"x": 1}'), None)
    assert not tool_call_valid(ToolCall("anything", "{x: 1}"), None)


def test_a_tool_without_parameters_accepts_any_object() -> None:
    assert tool_call_valid(ToolCall("ping", "{}"), {"ping": None})


def test_structured_outputs() -> None:
    assert structured_output_valid('{"a": [1]}', None)
    assert not structured_output_valid("[1, 2]", None)  # json_object means an object
    assert not structured_output_valid('{"a": ', None)
    assert structured_output_valid('{"city": "Oslo"}', WEATHER)
    assert not structured_output_valid('{"city": 7}', WEATHER)
    assert not structured_output_valid("", WEATHER)


def test_an_unusable_schema_judges_json_only() -> None:
    broken = {"type": "no-such-type"}
    assert structured_output_valid('{"a": 1}', broken)
    assert not structured_output_valid("{", broken)
    remote_ref = {"$ref": "https://example.invalid/schema.json"}
    assert structured_output_valid('{"a": 1}', remote_ref)


def test_judge_counts_every_call_and_json_choice() -> None:
    body: dict[str, Any] = {
        "tools": TOOLS,
        "response_format": {"type": "json_schema", "json_schema": {"name": "w", "schema": WEATHER}},
    }
    calls = [ToolCall("weather", '{"city": "a"}'), ToolCall("weather", "{")]
    verdicts = judge(body, ['{"city": "a"}', '{"city": 1}', None], calls)
    assert verdicts.tool_calls == (True, False)
    assert verdicts.structured_outputs == (True, False)


def test_plain_requests_are_not_judged_for_json() -> None:
    assert judge({"messages": []}, ["not json"], []).structured_outputs == ()
    verdicts = judge({"response_format": {"type": "json_object"}}, ["{}"], [])
    assert verdicts.structured_outputs == (True,)


def test_validators_are_compiled_once_per_schema() -> None:
    quality._validator.cache_clear()
    for _ in range(5):
        tool_call_valid(ToolCall("weather", '{"city": "x"}'), {"weather": dict(WEATHER)})
    info = quality._validator.cache_info()
    assert (info.misses, info.hits) == (1, 4)
