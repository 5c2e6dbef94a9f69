"""Generates the SpecModel CRD from the pydantic models: the single source of truth.

Pydantic emits JSON Schema 2020-12; Kubernetes wants a *structural* OpenAPI v3 schema: no
`$ref`, no `anyOf` for optionals, no `additionalProperties: false`, boolean exclusive bounds,
and defaults on object fields so the API server fills in what pydantic would.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from pydantic import BaseModel

from specfleet.api.base import (
    CANARY_SUFFIX,
    GROUP,
    KIND,
    MAX_NAME_LENGTH,
    PLURAL,
    ROLLOUT_SUFFIX,
    VERSION,
    cel,
)
from specfleet.api.spec import SpecModelSpec
from specfleet.api.status import SpecModelStatus
from specfleet.yamlio import dump

Schema = dict[str, Any]

PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Engine", "type": "string", "jsonPath": ".spec.engine.name"},
    {"name": "Quant", "type": "string", "jsonPath": ".spec.quantization.weights"},
    {"name": "Spec", "type": "string", "jsonPath": ".status.speculation"},
    {"name": "Active", "type": "boolean", "jsonPath": ".status.speculationActive"},
    {"name": "Canary", "type": "string", "jsonPath": ".status.canary.state"},
    {"name": "Accept", "type": "string", "jsonPath": ".status.acceptance"},
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Rev", "type": "integer", "jsonPath": ".status.activeRevision", "priority": 1},
    # -o wide: `kubectl get sm` keeps to 80 columns
    {"name": "Rollout", "type": "string", "jsonPath": ".status.rollout.phase", "priority": 1},
    {"name": "Step", "type": "integer", "jsonPath": ".status.rollout.step", "priority": 1},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def model_schema(model: type[BaseModel]) -> Schema:
    """The structural OpenAPI v3 schema of one pydantic model."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    definitions = raw.pop("$defs", {})
    schema: Schema = _structural(raw, definitions)
    return schema


def _structural(node: Any, definitions: dict[str, Schema]) -> Any:
    if isinstance(node, list):
        return [_structural(item, definitions) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = definitions[node["$ref"].rsplit("/", 1)[-1]]
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return _structural(merged, definitions)
    if "anyOf" in node:
        return _structural(_drop_null_branch(node), definitions)
    out: Schema = {}
    for key, value in node.items():
        if key == "title" or (key == "additionalProperties" and value is False):
            continue
        if key == "additionalProperties" and value is True:
            out["x-kubernetes-preserve-unknown-fields"] = True
            continue
        if key in ("properties", "patternProperties"):
            out[key] = {name: _structural(sub, definitions) for name, sub in value.items()}
            continue
        if key in ("exclusiveMinimum", "exclusiveMaximum"):
            out["minimum" if key == "exclusiveMinimum" else "maximum"] = value
            out[key] = True
            continue
        out[key] = _structural(value, definitions)
    if out.get("x-kubernetes-preserve-unknown-fields") and "type" not in out:
        out["type"] = "object"
    return out


def _drop_null_branch(node: Schema) -> Schema:
    branches = [b for b in node["anyOf"] if b.get("type") != "null"]
    if len(branches) != 1:
        raise ValueError(f"cannot make a structural schema of anyOf {node['anyOf']}")
    rest = {k: v for k, v in node.items() if k not in ("anyOf", "default")}
    if node.get("default") is not None:
        rest["default"] = node["default"]
    return {**branches[0], **rest}


def _object_defaults(model: type[BaseModel], schema: Schema) -> None:
    """Give object and list fields built by default factories their defaults in the schema,
    recursively, so the API server defaults exactly as pydantic does."""
    for name, field in model.model_fields.items():
        prop = schema.get("properties", {}).get(field.alias or name)
        if prop is None:
            continue
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            _object_defaults(annotation, prop)
        if field.default_factory is not None:
            value = field.default_factory()  # type: ignore[call-arg]
            prop["default"] = _wire(value)


def _wire(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(by_alias=True, exclude_none=True, mode="json")
    if isinstance(value, list):
        return [_wire(v) for v in value]
    return value


DNS_1035_LABEL = "^[a-z]([-a-z0-9]*[a-z0-9])?$"

NAME_RULES = [
    cel(
        f"self.metadata.name.matches('{DNS_1035_LABEL}')",
        "must be a DNS-1035 label: lowercase letters, digits and '-', starting with a letter "
        "and ending with a letter or digit, because the SpecModel's Service takes its name; "
        "rename it (llama-3-1-8b, not llama-3.1-8b)",
        ".metadata.name",
    ),
    cel(
        f"!self.metadata.name.endsWith('{CANARY_SUFFIX}')",
        f"must not end in '{CANARY_SUFFIX}': SpecModel x names its trial's canary "
        f"x{CANARY_SUFFIX}, so the two would fight over it; rename this SpecModel",
        ".metadata.name",
    ),
    cel(
        f"!self.metadata.name.endsWith('{ROLLOUT_SUFFIX}')",
        f"must not end in '{ROLLOUT_SUFFIX}': SpecModel x names its canary rollout's pods "
        f"x{ROLLOUT_SUFFIX}, so the two would fight over them; rename this SpecModel",
        ".metadata.name",
    ),
]
"""Rules on the name, at the root: the only place a CRD's CEL may read metadata."""


@cache
def spec_schema() -> Schema:
    """Built once: validation walks it for every SpecModel. Callers must not mutate it."""
    schema = model_schema(SpecModelSpec)
    _object_defaults(SpecModelSpec, schema)
    return schema


def openapi_schema() -> Schema:
    return {
        "type": "object",
        "description": "SpecModel: a model served by vLLM or TensorRT-LLM with speculative "
        "decoding, guarded per prompt class by specfleet.",
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {  # the one metadata field a CRD may restrict, besides generateName
                "type": "object",
                "properties": {"name": {"type": "string", "maxLength": MAX_NAME_LENGTH}},
            },
            "spec": spec_schema(),
            "status": model_schema(SpecModelStatus),
        },
        "required": ["spec"],
        "x-kubernetes-validations": NAME_RULES,
    }


def crd() -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": KIND.lower(),
                "shortNames": ["sm"],
                "categories": ["specfleet"],
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": openapi_schema()},
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                }
            ],
        },
    }


def crd_yaml() -> str:
    header = "# Generated by `specfleet crd` from specfleet.api. Do not edit.\n"
    return header + dump(crd())
