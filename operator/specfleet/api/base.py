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


def cel(rule: str, message: str, field_path: str | None = None) -> JsonDict:
    """One `x-kubernetes-validations` entry: a CEL rule the API server (and `specfleet render`)
    enforces, with the message a user sees and the field it names."""
    entry: JsonDict = {"rule": rule, "message": message}
    if field_path:
        entry["fieldPath"] = field_path
    return entry
