"""Trivially unsatisfiable JSON schemas: the ones a client can write in a line to make every
output fail a check. Pure; recursion depth is bounded by the caller (`schemas.screen`)."""

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
    property. Not complete (no check can be); depth is bounded by `screen`."""
    if schema is False:
        return True
    if not isinstance(schema, dict):
        return False
    if "not" in schema and (schema["not"] is True or schema["not"] == {}):
        return True
    if not _admitted_types(schema):
        return True
    if "enum" in schema and not _values(schema):
        return True
    for low, high in _BOUNDS:
        lo, hi = schema.get(low), schema.get(high)
        if _number(lo) and _number(hi) and lo > hi:
            return True
    if any(unsatisfiable(part) for part in _list(schema.get("allOf"))):
        return True
    for key in ("anyOf", "oneOf"):
        branches = _list(schema.get(key))
        if branches and all(unsatisfiable(part) for part in branches):
            return True
    return _required_unsatisfiable(schema)


def admits(schema: Any, json_type: str) -> bool:
    """Whether the schema's own `type`, `const` and `enum` let through some value of the type."""
    if not isinstance(schema, dict):
        return schema is not False
    if json_type not in _admitted_types(schema):
        return False
    if "enum" in schema or "const" in schema:
        return any(json_type in _types_of(v) for v in _values(schema))
    return True


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


def _required_unsatisfiable(schema: dict[str, Any]) -> bool:
    required = [name for name in _list(schema.get("required")) if isinstance(name, str)]
    properties = schema.get("properties")
    properties = properties if isinstance(properties, dict) else {}
    closed = schema.get("additionalProperties") is False and "patternProperties" not in schema
    return any(
        unsatisfiable(properties[name]) if name in properties else closed for name in required
    )


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
