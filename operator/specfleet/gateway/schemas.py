"""JSON schemas from requests, made safe to check against outputs. A schema is a client's input,
so the gateway checks an output against it only when a sane validator can: no reference
outside the schema, bounded size and depth, regular expressions a linear-time engine (RE2)
compiles, not trivially unsatisfiable. Every check (the schema against the metaschema, an
output against the schema) runs on a budget of keyword evaluations and CPU time, and all
checks share one CPU allowance. A schema that fails any of these is screened out with a
reason, and its checks go uncounted.

Nothing here does I/O: the validators resolve `$ref` in an empty registry (no retrieval).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache, lru_cache
from typing import Any, Final, Literal

import re2
from jsonschema import ValidationError
from jsonschema.protocols import Validator
from jsonschema.validators import Draft7Validator, Draft202012Validator, extend, validator_for
from referencing import Registry

from specfleet.gateway.satisfiable import admits, unsatisfiable

Reason = Literal[
    "remote_ref", "too_large", "too_deep", "pattern", "invalid", "unsatisfiable", "budget"
]
REASONS: Final[tuple[Reason, ...]] = (
    "remote_ref", "too_large", "too_deep", "pattern", "invalid", "unsatisfiable", "budget",
)  # fmt: skip

MAX_SCHEMA_BYTES = 64 * 1024
MAX_SCHEMA_DEPTH = 32
MAX_PATTERN_CHARS = 1024
VALIDATION_BUDGET = 100_000
"""Keyword evaluations one check may cost, however the schema and the output multiply: local
`$ref`s can fan out exponentially. A reference costs REF_COST (it is that much slower)."""
REF_COST = 10
CHECK_SECONDS = 0.02
"""And a check stops after this much CPU time, whatever it has spent: the event loop waits
meanwhile. (CPU time, so that neighbours on the node do not turn checks into "budget".)
Checking a schema against the metaschema is one check too."""
CHECK_SHARE = 0.2
"""Of one CPU, the most all checks together may take over time; past it, checks are not made
(reason "budget") until the allowance refills: many clients at once cannot stall the loop
for longer than CHECK_BURST either."""
CHECK_BURST = 0.05
CACHE_BYTES = 1024 * 1024
"""Of schema JSON; a compiled schema holds several times its JSON's size in objects."""
CACHE_ENTRIES = 512

_REF_KEYWORDS = ("$ref", "$dynamicRef", "$recursiveRef")
_EMPTY_REGISTRY: Registry[Any] = Registry()


class OutOfBudget(Exception):
    """A check spent its budget, or the allowance of all checks is spent."""


class _Budget:
    """What the running validation may still spend, and the CPU allowance of all checks (a
    token bucket in CPU seconds, refilled at CHECK_SHARE of wall time). One for the process:
    validations run one at a time on the event loop."""

    left = 0
    until = 0.0
    allowance = CHECK_BURST
    started = 0.0
    refilled = 0.0

    def start(self) -> None:
        now = time.monotonic()
        self.allowance = min(CHECK_BURST, self.allowance + (now - self.refilled) * CHECK_SHARE)
        self.refilled = now
        if self.allowance <= 0.0:
            raise OutOfBudget
        self.left = VALIDATION_BUDGET
        self.started = time.process_time()
        self.until = self.started + min(CHECK_SECONDS, self.allowance)

    def stop(self) -> None:
        self.allowance -= time.process_time() - self.started

    def spend(self, cost: int = 1) -> None:
        self.left -= cost
        if self.left < 0 or time.process_time() > self.until:
            raise OutOfBudget


_BUDGET = _Budget()


@dataclass(frozen=True)
class Checker:
    """A screened, compiled schema."""

    validator: Validator

    def check(self, instance: Any) -> bool | Reason:
        """Whether the instance matches, or "budget" when that costs too much to find out."""
        return _metered_check(self.validator, instance, "budget")


def _metered_check(validator: Validator, instance: Any, too_costly: Reason) -> bool | Reason:
    try:
        _BUDGET.start()
    except OutOfBudget:
        return "budget"  # not this check's cost: the allowance of all checks is spent
    try:
        return validator.is_valid(instance)
    except (OutOfBudget, RecursionError):
        return too_costly
    except Exception:  # e.g. a `$ref` into a nested `$id` the empty registry cannot resolve
        return "invalid"
    finally:
        _BUDGET.stop()


Screened = Checker | Reason


def screen(schema: Any, want_object: bool) -> Screened:
    """A checker for the schema, or why outputs are not judged against it. `want_object`: the
    output must also be a JSON object (tool-call arguments), so a schema refusing every object
    is unsatisfiable."""
    if not isinstance(schema, dict):
        return "invalid"
    found = _walk(schema)
    if isinstance(found, str):
        return found
    if found.remote_ref:
        return "remote_ref"
    if found.nested_schema_uri:
        return "invalid"
    if any(not _safe_pattern(p) for p in found.patterns) or found.pattern_properties:
        return "pattern"
    try:
        if unsatisfiable(schema) or (want_object and not admits(schema, "object")):
            return "unsatisfiable"
    except RecursionError:  # a chain of local `$ref`s longer than the stack
        return "too_deep"
    if "$schema" in schema and not isinstance(schema["$schema"], str):
        return "invalid"
    sane = _metered_check(_SCHEMA_CHECK, schema, "too_large")
    if sane is not True:
        return sane or "invalid"
    cls = _metered(validator_for(schema, default=Draft202012Validator))
    # Without `$schema`: a validator meeting one switches to that draft's unmetered class.
    bare = {key: value for key, value in schema.items() if key != "$schema"}
    return Checker(cls(bare, registry=_EMPTY_REGISTRY))


@dataclass
class _Found:
    remote_ref: bool = False
    nested_schema_uri: bool = False
    pattern_properties: bool = False
    patterns: tuple[str, ...] = ()


def _walk(schema: dict[str, Any]) -> _Found | Reason:
    """What screening needs from the schema's tree, without recursion; stops at the bounds."""
    found = _Found()
    patterns: list[str] = []
    stack: list[tuple[Any, int]] = [(schema, 1)]
    nodes = 0
    while stack:
        node, depth = stack.pop()
        nodes += 1
        if depth > MAX_SCHEMA_DEPTH:
            return "too_deep"
        if nodes > MAX_SCHEMA_BYTES // 4:
            return "too_large"
        if isinstance(node, dict):
            for key in _REF_KEYWORDS:
                ref = node.get(key)
                if isinstance(ref, str) and not ref.startswith("#"):
                    found.remote_ref = True
            if isinstance(node.get("pattern"), str):
                patterns.append(node["pattern"])
            if "patternProperties" in node:
                found.pattern_properties = True
            if node is not schema and isinstance(node.get("$schema"), str):
                found.nested_schema_uri = True
            stack.extend((value, depth + 1) for value in node.values())
        elif isinstance(node, list):
            stack.extend((value, depth + 1) for value in node)
    found.patterns = tuple(patterns)
    return found


def _safe_pattern(pattern: str) -> bool:
    return len(pattern) <= MAX_PATTERN_CHARS and _re2(pattern) is not None


@lru_cache(maxsize=256)
def _re2(pattern: str) -> Any:
    """The pattern compiled by RE2 (linear time in the input, no backtracking), or None when
    RE2 cannot take it (backreferences, lookaround)."""
    try:
        return re2.compile(pattern)
    except re2.error:
        return None


# -- metered validators --


def _pattern(
    validator: Validator, pattern: str, instance: Any, schema: Any
) -> Iterator[ValidationError]:
    if isinstance(instance, str):
        _BUDGET.spend(1 + len(instance) // 256)
        compiled = _re2(pattern)
        if compiled is not None and compiled.search(instance) is None:
            yield ValidationError("does not match the pattern")


def _unique_items(check: Callable[..., Any]) -> Callable[..., Any]:
    def unique_items(validator: Validator, value: Any, instance: Any, schema: Any) -> Any:
        if isinstance(instance, list):
            _BUDGET.spend(1 + len(instance) ** 2 // 64)  # pairwise comparison when unhashable
        return check(validator, value, instance, schema)

    return unique_items


def _spending(check: Callable[..., Any], cost: int) -> Callable[..., Any]:
    def keyword(validator: Validator, value: Any, instance: Any, schema: Any) -> Any:
        _BUDGET.spend(cost)
        return check(validator, value, instance, schema)

    return keyword


@cache  # one per JSON Schema draft
def _metered(cls: type[Validator]) -> type[Validator]:
    keywords = {
        name: _spending(check, REF_COST if name in _REF_KEYWORDS else 1)
        for name, check in cls.VALIDATORS.items()
    }
    keywords["pattern"] = _pattern
    if "uniqueItems" in cls.VALIDATORS:
        keywords["uniqueItems"] = _unique_items(cls.VALIDATORS["uniqueItems"])
    metered: type[Validator] = extend(cls, keywords)  # type: ignore[no-untyped-call]
    return metered


_SCHEMA_CHECK: Final = _metered(Draft7Validator)(
    # Draft 7's metaschema is one resource (2020-12's are many, through dynamic references,
    # tens of times slower): a sanity check of any draft's structure, on the budget. Without
    # its `$schema`, which would switch to the unmetered class on its `$ref: "#"`.
    {key: value for key, value in Draft7Validator.META_SCHEMA.items() if key != "$schema"},
    registry=_EMPTY_REGISTRY,
)


# -- the cache --


class SchemaCache:
    """Screened schemas by a digest of their JSON, least recently used first out. Bounded in
    entries and in the JSON bytes it holds, so clients cannot make the gateway keep more."""

    def __init__(self, max_bytes: int = CACHE_BYTES, max_entries: int = CACHE_ENTRIES) -> None:
        self.max_bytes = max_bytes
        self.max_entries = max_entries
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self._entries: OrderedDict[tuple[bytes, bool], tuple[Screened, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, schema: Any, want_object: bool) -> Screened:
        try:
            text = json.dumps(schema, separators=(",", ":")).encode()
        except (TypeError, ValueError, RecursionError):
            return "invalid"
        if len(text) > MAX_SCHEMA_BYTES:
            return "too_large"
        key = (hashlib.blake2b(text, digest_size=16).digest(), want_object)
        entry = self._entries.get(key)
        if entry is not None:
            self.hits += 1
            self._entries.move_to_end(key)
            return entry[0]
        self.misses += 1
        screened = screen(schema, want_object)
        if screened == "budget":  # the checks' allowance was spent: screen it again next time
            return screened
        # A screened-out schema keeps only its key; a checker keeps the schema itself.
        cost = len(text) if isinstance(screened, Checker) else len(key[0])
        self._entries[key] = (screened, cost)
        self.bytes += cost
        while self.bytes > self.max_bytes or len(self._entries) > self.max_entries:
            _, (_, freed) = self._entries.popitem(last=False)
            self.bytes -= freed
        return screened
