"""The base every API model shares: camelCase on the wire, snake_case in Python, strict."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel
from pydantic.config import JsonDict

GROUP = "specfleet.dev"
VERSION = "v1alpha1"
KIND = "SpecModel"
PLURAL = "specmodels"
API_VERSION = f"{GROUP}/{VERSION}"
MAX_NAME_LENGTH = 52
"""A SpecModel's name, so that its revisions' names, `<name>-<10-character hash>`, are DNS
labels (63 characters)."""
CANARY_SUFFIX = "-canary"
"""A trial's canary children are named `<name>-canary`; no SpecModel may take such a name."""
ROLLOUT_SUFFIX = "-rollout"
"""A canary rollout's children are named `<name>-rollout`; no SpecModel may take such a name."""
PLAIN_SUFFIX = "-plain"
"""The plain pool's children are named `<name>-plain`; no SpecModel may take such a name."""
INT32_MAX = 2**31 - 1
"""The largest value of an int32 field (TensorRT-LLM's batch and token limits are SizeType32)."""
MAX_EXACT_INTEGER = 2**53 - 1
"""The bound of an integer field without a narrower one: schema bounds are float64 to the API
server, which refuses a `maximum` it cannot hold exactly (2**63 - 1 is not)."""
SCRAPE_INTERVAL_SECONDS = 15
"""How often the rendered ServiceMonitor has Prometheus scrape the engine pods."""
LABEL_VALUE_MAX_LENGTH = 63
LABEL_VALUE = "^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
"""A Kubernetes label value: what a node selector may ask for."""
QUANTITY = (
    "^(([0-9]+([.][0-9]*)?)|([.][0-9]+))"
    "(([KMGTPE]i)|[numkMGTPE]|([eE][-+]?(([0-9]+([.][0-9]*)?)|([.][0-9]+))))?$"
)
"""A non-negative Kubernetes quantity (`16Gi`, `500m`, `1e3`): apimachinery's resource.Quantity
grammar without the sign. No backslashes, so it sits in a CEL string as it is."""
QUANTITY_MAX_LENGTH = 64
"""Longer than any sensible quantity; bounds the cost of the CEL rule that reads one."""


class ApiModel(BaseModel):
    """A Kubernetes-style object part: camelCase aliases, strict about unknown fields."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        use_enum_values=True,
    )

    def to_wire(self) -> dict[str, Any]:
        """The object as it is sent to (or read from) the API server."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


def cel(
    rule: str, message: str, field_path: str | None = None, message_expression: str | None = None
) -> JsonDict:
    """One `x-kubernetes-validations` entry: a CEL rule the API server (and `specfleet render`)
    enforces, with the message a user sees (or a CEL expression that builds it from the object,
    `message` then being the fallback) and the field it names."""
    entry: JsonDict = {"rule": rule, "message": message}
    if message_expression:
        entry["messageExpression"] = message_expression
    if field_path:
        entry["fieldPath"] = field_path
    return entry


def quantity_schema(field: str, example: str) -> JsonDict:
    """Schema extras of a string field that is a Kubernetes quantity, checked by CEL so the
    message says what a quantity looks like (a `pattern` would only print the regex)."""
    return {
        "x-kubernetes-validations": [
            cel(
                f"self.matches('{QUANTITY}')",
                f"{field} must be a Kubernetes quantity such as {example}: digits, then "
                "Ki Mi Gi Ti Pi Ei, k M G T P E, m, or an exponent (not '16 GB' or '16GB')",
            )
        ],
    }
