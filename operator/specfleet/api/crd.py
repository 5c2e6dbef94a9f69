"""Generates the CRDs (SpecModel, SpecExperiment) from the pydantic models: the single source of
truth.

Pydantic emits JSON Schema 2020-12; Kubernetes wants a *structural* OpenAPI v3 schema: no
`$ref`, no `anyOf` for optionals, no `additionalProperties: false`, boolean exclusive bounds,
and defaults on object fields so the API server fills in what pydantic would.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

from pydantic import BaseModel

from specfleet.api.base import (
    CANARY_SUFFIX,
    GROUP,
    KIND,
    MAX_NAME_LENGTH,
    PLAIN_SUFFIX,
    PLURAL,
    ROLLOUT_SUFFIX,
    VERSION,
    cel,
)
from specfleet.api.experiment import (
    EXPERIMENT_KIND,
    EXPERIMENT_PLURAL,
    MAX_EXPERIMENT_NAME_LENGTH,
    SpecExperimentSpec,
    SpecExperimentStatus,
)
from specfleet.api.spec import SpecModelSpec
from specfleet.api.status import SpecModelStatus
from specfleet.yamlio import dump

Schema = dict[str, Any]

PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Engine", "type": "string", "jsonPath": ".spec.engine.name"},
    {"name": "Quant", "type": "string", "jsonPath": ".spec.quantization.weights"},
    {"name": "Spec", "type": "string", "jsonPath": ".status.speculation"},
    {"name": "Active", "type": "boolean", "jsonPath": ".status.speculationActive", "priority": 1},
    {"name": "Canary", "type": "string", "jsonPath": ".status.canary.state"},
    {"name": "Accept", "type": "string", "jsonPath": ".status.acceptance"},
    {"name": "Speculating", "type": "string", "jsonPath": ".status.classesSpeculating"},
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Rev", "type": "integer", "jsonPath": ".status.activeRevision", "priority": 1},
    # -o wide: `kubectl get sm` keeps to 80 columns
    {"name": "Rollout", "type": "string", "jsonPath": ".status.rollout.phase", "priority": 1},
    {"name": "Step", "type": "integer", "jsonPath": ".status.rollout.step", "priority": 1},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


EXPERIMENT_PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "SpecModel", "type": "string", "jsonPath": ".spec.specModelRef.name"},
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Leading arm", "type": "string", "jsonPath": ".status.leadingArm"},
    {"name": "Progress", "type": "integer", "jsonPath": ".status.progress.percent"},
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
    cel(
        f"!self.metadata.name.endsWith('{PLAIN_SUFFIX}')",
        f"must not end in '{PLAIN_SUFFIX}': SpecModel x names its plain pool x{PLAIN_SUFFIX}, "
        "so the two would fight over it; rename this SpecModel",
        ".metadata.name",
    ),
]
"""Rules on the name, at the root: the only place a CRD's CEL may read metadata."""

EXPERIMENT_NAME_RULES = [
    cel(
        f"self.metadata.name.matches('{DNS_1035_LABEL}')",
        "must be a DNS-1035 label: lowercase letters, digits and '-', starting with a letter "
        "and ending with a letter or digit, because each arm's Service is named "
        "<experiment>-<arm>; rename it",
        ".metadata.name",
    ),
]


@dataclass(frozen=True)
class Resource:
    """What tells one generated CRD from the other."""

    kind: str
    plural: str
    short_name: str
    description: str
    status: type[BaseModel]
    printer_columns: list[dict[str, Any]]
    name_rules: list[Any]
    max_name_length: int


SPECMODEL = Resource(
    kind=KIND,
    plural=PLURAL,
    short_name="sm",
    description="SpecModel: a model served by vLLM or TensorRT-LLM with speculative "
    "decoding, guarded per prompt class by specfleet.",
    status=SpecModelStatus,
    printer_columns=PRINTER_COLUMNS,
    name_rules=NAME_RULES,
    max_name_length=MAX_NAME_LENGTH,
)
SPECEXPERIMENT = Resource(
    kind=EXPERIMENT_KIND,
    plural=EXPERIMENT_PLURAL,
    short_name="sx",
    description="SpecExperiment: a SpecModel's four arms (baseline, quantized, speculative, "
    "both) on a sample of its live traffic, judged by cost per accepted answer. Never writes "
    "the SpecModel.",
    status=SpecExperimentStatus,
    printer_columns=EXPERIMENT_PRINTER_COLUMNS,
    name_rules=EXPERIMENT_NAME_RULES,
    max_name_length=MAX_EXPERIMENT_NAME_LENGTH,
)
RESOURCES = {"specmodel": SPECMODEL, "specexperiment": SPECEXPERIMENT}


@cache
def spec_schema() -> Schema:
    """Built once: validation walks it for every SpecModel. Callers must not mutate it."""
    schema = model_schema(SpecModelSpec)
    _object_defaults(SpecModelSpec, schema)
    return schema


def openapi_schema() -> Schema:
    return _root_schema(SPECMODEL, spec_schema())


def _root_schema(resource: Resource, spec: Schema) -> Schema:
    return {
        "type": "object",
        "description": resource.description,
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {  # the one metadata field a CRD may restrict, besides generateName
                "type": "object",
                "properties": {"name": {"type": "string", "maxLength": resource.max_name_length}},
            },
            "spec": spec,
            "status": model_schema(resource.status),
        },
        "required": ["spec"],
        "x-kubernetes-validations": resource.name_rules,
    }


def experiment_spec_schema() -> Schema:
    schema = model_schema(SpecExperimentSpec)
    _object_defaults(SpecExperimentSpec, schema)
    return schema


def crd(resource: Resource | None = None) -> dict[str, Any]:
    resource = resource or SPECMODEL
    spec = spec_schema() if resource is SPECMODEL else experiment_spec_schema()
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{resource.plural}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "names": {
                "kind": resource.kind,
                "listKind": f"{resource.kind}List",
                "plural": resource.plural,
                "singular": resource.kind.lower(),
                "shortNames": [resource.short_name],
                "categories": ["specfleet"],
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": _root_schema(resource, spec)},
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": resource.printer_columns,
                }
            ],
        },
    }


def crd_yaml(resource: Resource | None = None) -> str:
    header = "# Generated by `specfleet crd` from specfleet.api. Do not edit.\n"
    return header + dump(crd(resource))
