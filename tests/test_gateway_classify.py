"""Gateway classification: request -> one of the configured class names."""

from __future__ import annotations

import random
import string
from typing import Any

import pytest
from multidict import CIMultiDict

from specfleet.api.gateway import GatewayConfig
from specfleet.gateway.classify import Classifier, RequestView

CHAT = "/v1/chat/completions"
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


def config(classes: list[dict[str, Any]], default: str = "chat") -> GatewayConfig:
    return GatewayConfig.model_validate(
        {
            "specmodel": "m",
            "engine": "vllm",
            "servedName": "llama",
            "classes": classes,
            "defaultClass": default,
        }
    )


CLASSES = [
    {"name": "agent", "match": {"hasTools": True, "headers": {"X-Team": "agents"}}},
    {"name": "json", "match": {"jsonResponse": True}},
    {"name": "code", "match": {"models": ["coder"], "pathPrefixes": ["/v1/completions"]}},
    {"name": "tools", "match": {"hasTools": True}},
    {"name": "chat"},
]


def classify(headers: dict[str, str] | None = None, path: str = CHAT, **body: Any) -> str:
    view = RequestView(path, CIMultiDict(headers or {}), body if body else None)
    return Classifier(config(CLASSES)).classify(view)


def test_a_header_naming_a_class_wins_over_every_rule() -> None:
    assert classify({"x-specfleet-class": "code"}, tools=[TOOL]) == "code"
    assert classify({"X-SpecFleet-Class": "chat"}, response_format={"type": "json_object"}) == (
        "chat"
    )


def test_an_unknown_class_header_is_ignored_and_the_rules_decide() -> None:
    assert classify({"x-specfleet-class": "nope"}, tools=[TOOL]) == "tools"
    assert classify({"x-specfleet-class": "CODE"}) == "chat"  # names are exact


def test_rules_apply_in_order_and_every_condition_must_hold() -> None:
    both = {"x-team": "agents"}
    assert classify(both, tools=[TOOL], response_format={"type": "json_object"}) == "agent"
    assert classify({"x-team": "other"}, tools=[TOOL]) == "tools"
    assert classify({"x-team": "agents"}) == "chat"  # header alone is not enough
    assert classify(tools=[TOOL], response_format={"type": "json_schema"}) == "json"


def test_model_and_path_prefix_both_required() -> None:
    assert classify(path="/v1/completions", model="coder") == "code"
    assert classify(path=CHAT, model="coder") == "chat"
    assert classify(path="/v1/completions", model="llama") == "chat"


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"tools": []}, "chat"),
        ({"tools": "not-a-list"}, "chat"),
        ({"response_format": {"type": "text"}}, "chat"),
        ({"response_format": "json_object"}, "chat"),
        ({"model": ["coder"]}, "chat"),
    ],
)
def test_malformed_or_empty_fields_do_not_match(body: dict[str, Any], expected: str) -> None:
    assert classify(path="/v1/completions", **body) == expected


def test_negative_conditions_match_their_absence() -> None:
    classes = [
        {"name": "plain", "match": {"hasTools": False, "jsonResponse": False}},
        {"name": "x"},
    ]
    classifier = Classifier(config(classes, default="x"))
    assert classifier.classify(RequestView(CHAT, {}, {"messages": []})) == "plain"
    assert classifier.classify(RequestView(CHAT, {}, None)) == "plain"  # no body, no tools
    assert classifier.classify(RequestView(CHAT, {}, {"tools": [TOOL]})) == "x"


def test_no_body_fails_conditions_that_need_one() -> None:
    assert classify(path="/v1/completions") == "chat"


def test_labels_stay_bounded_whatever_clients_send() -> None:
    rng = random.Random(7)
    names = {c["name"] for c in CLASSES}
    seen = set()
    for _ in range(500):
        junk = "".join(rng.choices(string.printable, k=rng.randint(0, 12)))
        body = {"model": junk, "tools": [TOOL] if rng.random() < 0.5 else junk}
        headers = {"x-specfleet-class": junk, "x-team": rng.choice(["agents", junk])}
        seen.add(classify(headers, path=rng.choice([CHAT, "/" + junk]), **body))
    assert seen <= names
    assert len(seen) >= 2
