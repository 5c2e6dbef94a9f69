"""Parses and validates a SpecModel the way the API server will.

The CEL rules live once, in the models (and so in the CRD); here the same rules run with
cel-python over the CRD schema, so `specfleet render` and the operator reject exactly what
admission would, with the same messages, naming the field.
"""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache, lru_cache
from typing import Any

import celpy
from celpy.adapter import json_to_cel
from pydantic import ValidationError

from specfleet.api.crd import RESOURCES, Schema, experiment_spec_schema, spec_schema
from specfleet.api.escape_hatches import escape_hatch_errors
from specfleet.api.experiment import SpecExperiment
from specfleet.api.model import CLASSES_OFF_ANNOTATION, SpecModel
from specfleet.api.trtllm import DECODING_TYPE, runs_a_drafter

INT64 = range(-(2**63), 2**63)


@dataclass(frozen=True)
class FieldError:
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class InvalidSpecModel(ValueError):
    """The SpecModel cannot be served; every error names its field."""

    def __init__(self, errors: list[FieldError]) -> None:
        self.errors = errors
        super().__init__("; ".join(str(e) for e in errors))


def parse_specmodel(document: dict[str, Any]) -> SpecModel:
    """A validated SpecModel, or InvalidSpecModel listing every problem at once: the fields'
    own errors and the rules across fields that the fields without errors break."""
    try:
        specmodel = SpecModel.model_validate(document)
    except ValidationError as exc:
        field_errors = [_pydantic_error(e) for e in exc.errors()]
        raise InvalidSpecModel(field_errors + _rules_beside(document, exc)) from None
    errors = _rule_errors(specmodel)
    if errors:
        raise InvalidSpecModel(errors)
    return specmodel


def _rule_errors(specmodel: SpecModel) -> list[FieldError]:
    errors = list(_spec_cel_errors(json.dumps(specmodel.spec.to_wire(), sort_keys=True)))
    errors += _name_cel_errors(specmodel.metadata.name, "specmodel")
    errors += one_model_schedule_errors(specmodel)
    errors += [FieldError(*error) for error in escape_hatch_errors(specmodel.spec)]
    return errors + annotation_errors(specmodel)


def annotation_errors(specmodel: SpecModel) -> list[FieldError]:
    """The classes-off annotation names classes of the spec (the spec's own list is checked
    by its CEL rule)."""
    unknown = specmodel.unknown_classes_off()
    if not unknown or not specmodel.classes_off()[1]:
        return []
    known = ", ".join(c.name for c in specmodel.spec.classes)
    return [
        FieldError(
            f"metadata.annotations[{CLASSES_OFF_ANNOTATION}]",
            f"names no class {', '.join(unknown)}: the classes are {known}; remove it from the "
            "annotation or add a class of that name to spec.classes",
        )
    ]


def _rules_beside(document: dict[str, Any], exc: ValidationError) -> list[FieldError]:
    """The rules the document breaks once the fields in error are left out (with their
    defaults), so that one round of fixes is enough; none when leaving them out is not valid
    either (a required field in error)."""
    remainder = copy.deepcopy(document)
    for error in reversed(exc.errors()):  # the later items of a list first
        _drop(remainder, error["loc"])
    try:
        return _rule_errors(SpecModel.model_validate(remainder))
    except ValidationError:
        return []


def _drop(document: Any, loc: tuple[Any, ...]) -> None:
    """Removes the value at `loc` from `document`, if it is there."""
    *parents, last = loc or (None,)
    for part in parents:
        try:
            document = document[part]
        except (KeyError, IndexError, TypeError):
            return
    if isinstance(document, dict):
        document.pop(last, None)
    elif isinstance(document, list) and isinstance(last, int) and last < len(document):
        document.pop(last)


class InvalidSpecExperiment(InvalidSpecModel):
    """The SpecExperiment cannot run; every error names its field."""


def parse_specexperiment(document: dict[str, Any]) -> SpecExperiment:
    """A validated SpecExperiment, or InvalidSpecExperiment listing every problem."""
    try:
        experiment = SpecExperiment.model_validate(document)
    except ValidationError as exc:
        raise InvalidSpecExperiment([_pydantic_error(e) for e in exc.errors()]) from None
    errors = list(cel_errors(experiment_spec_schema(), experiment.spec.to_wire(), "spec"))
    errors += _name_cel_errors(experiment.metadata.name, "specexperiment")
    if errors:
        raise InvalidSpecExperiment(errors)
    return experiment


TWO_MODEL_OPTION = {
    "eagle3": "eagle3_one_model: false",
    "mtp": "mtp_eagle_one_model: false, without use_mtp_vanilla",
}
"""The engineOptions that make TensorRT-LLM run a method as two models (a separate drafter)."""


def one_model_schedule_errors(specmodel: SpecModel) -> list[FieldError]:
    """TensorRT-LLM's one-model EAGLE-3 and MTP (its defaults) ignore a depth schedule. The CRD
    cannot say this one: CEL cannot read keys of the free-form engineOptions."""
    spec = specmodel.spec
    speculative = spec.speculative
    if spec.engine.name != "tensorrt-llm" or speculative is None:
        return []
    if not speculative.depth_schedule or speculative.method not in TWO_MODEL_OPTION:
        return []
    options = {
        "decoding_type": DECODING_TYPE[speculative.method],
        **(speculative.engine_options or {}),
    }
    if runs_a_drafter(options):
        return []
    method = speculative.method
    return [
        FieldError(
            "spec.speculative.depthSchedule",
            f"on tensorrt-llm, {method} acts on a depth schedule only as two models (set "
            f"speculative.engineOptions.{TWO_MODEL_OPTION[method]}); one-model {method} ignores "
            "it in 1.2.1: use speculative.maxConcurrency",
        )
    ]


def _pydantic_error(error: Any) -> FieldError:
    path = ""
    for part in error["loc"]:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    message = error["msg"]
    if error["type"] == "extra_forbidden":
        message = "unknown field; remove it or check its spelling (fields are camelCase)"
    return FieldError(path or "(root)", message)


# cel-python takes milliseconds per spec and the operator re-parses every SpecModel on every
# event and resync, while specs change rarely: remember the verdict per distinct spec (and
# name).
@lru_cache(maxsize=4096)
def _spec_cel_errors(spec_json: str) -> tuple[FieldError, ...]:
    spec = json.loads(spec_json)
    return tuple(_integers_past_int64(spec, "spec")) or tuple(
        cel_errors(spec_schema(), spec, "spec")
    )


def _integers_past_int64(value: Any, path: str) -> Iterator[FieldError]:
    """CEL's integers are int64 (cel-python raises on larger ones, even in free-form fields its
    rules never read), and so are the API server's: name the field instead."""
    if isinstance(value, int) and not isinstance(value, bool) and value not in INT64:
        yield FieldError(path, "an integer beyond int64, which Kubernetes cannot store as one")
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _integers_past_int64(item, f"{path}.{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _integers_past_int64(item, f"{path}[{index}]")


@lru_cache(maxsize=4096)
def _name_cel_errors(name: str, resource: str) -> tuple[FieldError, ...]:
    """The CRD's root rules on the name (its fieldPath `.metadata.name`, from the root) and its
    length."""
    named = {"metadata": {"name": name}}
    rules = {"x-kubernetes-validations": RESOURCES[resource].name_rules}
    longest = RESOURCES[resource].max_name_length
    if len(name) > longest:
        return (FieldError("metadata.name", f"at most {longest} characters; shorten it"),)
    return tuple(FieldError(e.path.lstrip("."), e.message) for e in cel_errors(rules, named, ""))


def cel_errors(schema: Schema, value: Any, path: str) -> Iterator[FieldError]:
    """Evaluates every x-kubernetes-validations rule in `schema` against `value`."""
    rules = schema.get("x-kubernetes-validations", [])
    activation = {"self": json_to_cel(value)} if rules else {}  # once: it copies the subtree
    for rule in rules:
        if not _holds(rule["rule"], activation):
            yield FieldError(path + rule.get("fieldPath", ""), _message(rule, activation))
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        for name, sub in properties.items():
            if name in value:
                yield from cel_errors(sub, value[name], f"{path}.{name}")
        if isinstance(schema.get("additionalProperties"), dict):
            for name in value.keys() - properties.keys():
                yield from cel_errors(
                    schema["additionalProperties"], value[name], f"{path}[{name}]"
                )
    elif isinstance(value, list) and "items" in schema:
        for index, item in enumerate(value):
            yield from cel_errors(schema["items"], item, f"{path}[{index}]")


def _holds(rule: str, activation: dict[str, Any]) -> bool:
    result = _program(rule).evaluate(activation)
    return result is True or (isinstance(result, celpy.celtypes.BoolType) and bool(result))


def _message(rule: dict[str, Any], activation: dict[str, Any]) -> str:
    if "messageExpression" not in rule:
        return str(rule["message"])
    return str(_program(rule["messageExpression"]).evaluate(activation))


_COMPILING = threading.Lock()


def _program(rule: str) -> Any:
    # One compile per rule: the operator's worker threads would each compile every rule at once
    # on the first SpecModels (seconds of CPU) before the cache held any.
    with _COMPILING:
        return _compiled(rule)


@cache
def _compiled(rule: str) -> Any:
    environment = celpy.Environment()
    return environment.program(environment.compile(rule))
