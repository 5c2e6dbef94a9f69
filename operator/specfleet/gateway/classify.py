"""Which prompt class a request belongs to. Pure: request in, configured class name out.

The result is always one of the configured names, so the `class` label cannot be inflated by
client input: an unknown class header is ignored, not echoed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from specfleet.api.gateway import GatewayConfig
from specfleet.api.spec import ClassMatch

JSON_FORMATS = frozenset({"json_object", "json_schema"})


@dataclass(frozen=True)
class RequestView:
    """What classification may look at. `headers` is case-insensitive (aiohttp's) or has
    lowercase keys; `body` is the parsed JSON object, or None (absent, not a JSON object)."""

    path: str
    headers: Mapping[str, str]
    body: dict[str, Any] | None


@dataclass(frozen=True)
class _Rule:
    name: str
    headers: tuple[tuple[str, str], ...] | None
    path_prefixes: tuple[str, ...] | None
    models: frozenset[str] | None
    has_tools: bool | None
    json_response: bool | None

    def holds(self, request: RequestView) -> bool:
        if self.headers is not None and any(
            request.headers.get(key) != value for key, value in self.headers
        ):
            return False
        if self.path_prefixes is not None and not request.path.startswith(self.path_prefixes):
            return False
        body = request.body or {}
        if self.models is not None and _model(body) not in self.models:
            return False
        if self.has_tools is not None and has_tools(body) != self.has_tools:
            return False
        return self.json_response is None or wants_json(body) == self.json_response


def _rule(name: str, match: ClassMatch) -> _Rule:
    return _Rule(
        name=name,
        headers=tuple((k.lower(), v) for k, v in match.headers.items()) if match.headers else None,
        path_prefixes=tuple(match.path_prefixes) if match.path_prefixes is not None else None,
        models=frozenset(match.models) if match.models is not None else None,
        has_tools=match.has_tools,
        json_response=match.json_response,
    )


class Classifier:
    """Compiled once per configuration; `classify` is cheap and never raises on client input."""

    def __init__(self, config: GatewayConfig) -> None:
        self.names = tuple(c.name for c in config.classes)
        self.default = config.default_class
        self.header = config.class_header.lower()
        self._known = frozenset(self.names)
        self._rules = tuple(_rule(c.name, c.match) for c in config.classes if c.match)

    def classify(self, request: RequestView) -> str:
        named = request.headers.get(self.header)
        if named is not None and named in self._known:
            return named
        for rule in self._rules:
            if rule.holds(request):
                return rule.name
        return self.default


def _model(body: Mapping[str, Any]) -> str | None:
    model = body.get("model")
    return model if isinstance(model, str) else None


def has_tools(body: Mapping[str, Any]) -> bool:
    tools = body.get("tools")
    return isinstance(tools, list) and len(tools) > 0


def response_format_type(body: Mapping[str, Any]) -> str | None:
    response_format = body.get("response_format")
    if isinstance(response_format, dict):
        kind = response_format.get("type")
        return kind if isinstance(kind, str) else None
    return None


def wants_json(body: Mapping[str, Any]) -> bool:
    return response_format_type(body) in JSON_FORMATS
