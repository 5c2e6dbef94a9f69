"""Trivially unsatisfiable JSON schemas: the ones a client can write in a line to make every
output fail a check. Pure; recursion depth is bounded by the caller (`schemas.screen`): each
subschema is read once, so local `$ref`s cost no more than the schema's size."""

from __future__ import annotations

from typing import Any, TypeGuard

_BOUNDS = (
    ("minimum", "maximum"), ("minLength", "maxLength"),
    ("minItems", "maxItems"), ("minProperties", "maxProperties"),
)  # fmt: skip
_ALL_TYPES = frozenset({"null", "boolean", "object", "array", "number", "string", "integer"})


def unsatisfiable(schema: Any) -> bool:
    """Whether no instance can match, for the cases a client can write in a line: `false`,
    `{"not": {}}`, an empty `enum` or `type` list, `const`/`enum` against `type`, a minimum over
    its maximum, an impossible `allOf`, `anyOf` or `oneOf` branch set, an impossible required
    property, any of these behind a local `$ref`. Not complete (no check can be)."""
    return _Reading(schema).unsatisfiable(schema)


def admits(schema: Any, json_type: str) -> bool:
    """Whether some value of the JSON type may match, as far as `type`, `const`, `enum`, `not`,
    `allOf`, `anyOf`, `oneOf` and local `$ref`s tell."""
    return json_type in _Reading(schema).types(schema)


class _Reading:
    """One schema's subschemas, each read once (local `$ref`s can share, and loop)."""

    def __init__(self, root: Any) -> None:
        self.root = root
        self._types: dict[int, frozenset[str]] = {}
        self._unsatisfiable: dict[int, bool] = {}

    def types(self, node: Any) -> frozenset[str]:
        """The JSON types an instance matching the node can have (at most)."""
        if not isinstance(node, dict):
            return frozenset() if node is False else _ALL_TYPES
        known = self._types.get(id(node))
        if known is not None:
            return known
        self._types[id(node)] = _ALL_TYPES  # a loop back here assumes anything
        types = _admitted_types(node)
        if "enum" in node or "const" in node:
            types = types & frozenset().union(*(_types_of(v) for v in _values(node)))
        if "not" in node and (node["not"] is True or node["not"] == {}):
            types = frozenset()
        for part in [*_list(node.get("allOf")), *self._target(node)]:
            types = types & self.types(part)
        for key in ("anyOf", "oneOf"):
            if branches := _list(node.get(key)):
                types = types & frozenset().union(*(self.types(b) for b in branches))
        self._types[id(node)] = types
        return types

    def unsatisfiable(self, node: Any) -> bool:
        if not isinstance(node, dict):
            return node is False
        known = self._unsatisfiable.get(id(node))
        if known is not None:
            return known
        self._unsatisfiable[id(node)] = False  # a loop back here assumes satisfiable
        found = not self.types(node) or self._unsatisfiable_here(node)
        self._unsatisfiable[id(node)] = found
        return found

    def _unsatisfiable_here(self, node: dict[str, Any]) -> bool:
        for low, high in _BOUNDS:
            lo, hi = node.get(low), node.get(high)
            if _number(lo) and _number(hi) and lo > hi:
                return True
        if any(self.unsatisfiable(p) for p in [*_list(node.get("allOf")), *self._target(node)]):
            return True
        for key in ("anyOf", "oneOf"):
            branches = _list(node.get(key))
            if branches and all(self.unsatisfiable(part) for part in branches):
                return True
        required = [name for name in _list(node.get("required")) if isinstance(name, str)]
        properties = node.get("properties")
        properties = properties if isinstance(properties, dict) else {}
        closed = node.get("additionalProperties") is False and "patternProperties" not in node
        return any(
            self.unsatisfiable(properties[name]) if name in properties else closed
            for name in required
        )

    def _target(self, node: dict[str, Any]) -> list[Any]:
        """The subschema a local `$ref` (`#` or `#/json/pointer`) names; none otherwise."""
        ref = node.get("$ref")
        if not isinstance(ref, str) or not ref.startswith("#"):
            return []
        target = self.root
        for token in filter(None, ref[1:].split("/")):
            token = token.replace("~1", "/").replace("~0", "~")
            if isinstance(target, dict) and token in target:
                target = target[token]
            elif isinstance(target, list) and token.isdigit() and int(token) < len(target):
                target = target[int(token)]
            else:
                return []
        return [target]


def _admitted_types(schema: dict[str, Any]) -> frozenset[str]:
    declared = schema.get("type")
    if isinstance(declared, str):
        types = frozenset({declared, "integer"} if declared == "number" else {declared})
    elif isinstance(declared, list):
        names = {t for t in declared if isinstance(t, str)}
        types = frozenset(names | ({"integer"} if "number" in names else set()))
    else:
        types = _ALL_TYPES
    if "const" in schema:
        types = types & _types_of(schema["const"])
    return types


def _values(schema: dict[str, Any]) -> list[Any]:
    """The values `const` and `enum` allow that `type` allows too (all values if neither)."""
    types = _admitted_types(schema)
    candidates = [schema["const"]] if "const" in schema else []
    if "enum" in schema:
        enum = _list(schema["enum"])
        candidates = [v for v in enum if v in candidates] if "const" in schema else enum
    return [v for v in candidates if _types_of(v) & types]


def _types_of(value: Any) -> frozenset[str]:
    if value is None:
        return frozenset({"null"})
    if isinstance(value, bool):
        return frozenset({"boolean"})
    if isinstance(value, int):
        return frozenset({"integer", "number"})
    if isinstance(value, float):
        return frozenset({"number", "integer"} if value.is_integer() else {"number"})
    if isinstance(value, str):
        return frozenset({"string"})
    if isinstance(value, list):
        return frozenset({"array"})
    return frozenset({"object"})


def _number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []
