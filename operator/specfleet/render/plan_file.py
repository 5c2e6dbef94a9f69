"""A serving plan from a file (`specfleet render --plan`), refused with messages of its own: every
problem at once, each naming the plan's field and what to write there."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, get_args

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from specfleet.api.model import SpecModel
from specfleet.api.validation import FieldError, _pydantic_error
from specfleet.render.plan import ServingPlan

EXAMPLE = "`revision: 2` and `speculation: false`"


class InvalidPlan(ValueError):
    """The plan cannot be rendered; every error names its field and its fix."""

    def __init__(self, errors: list[FieldError]) -> None:
        self.errors = errors
        super().__init__("; ".join(str(e) for e in errors))


def parse_plan(documents: list[dict[str, Any]], specmodels: list[SpecModel]) -> ServingPlan:
    """The one plan a file holds, valid for each of `specmodels`, or InvalidPlan."""
    if len(documents) != 1:
        count = f"{len(documents)} YAML documents"
        raise InvalidPlan([FieldError("(file)", f"holds {count}; a plan is one, e.g. {EXAMPLE}")])
    [document] = documents
    if "kind" in document:
        kind = document["kind"]
        message = f"a {kind} is not a plan: give it with -f; a plan says what runs, e.g. {EXAMPLE}"
        raise InvalidPlan([FieldError("kind", message)])
    try:
        plan = ServingPlan.model_validate(document)
    except ValidationError as exc:
        raise InvalidPlan([plan_error(error) for error in exc.errors()]) from None
    errors = [error for specmodel in specmodels for error in rollout_errors(plan, specmodel)]
    if errors:
        raise InvalidPlan(errors)
    return plan


def plan_error(error: Any) -> FieldError:
    """pydantic's error at a field of the plan, with what the field is or which fields exist."""
    found = _pydantic_error(error)
    *parents, name = error["loc"] or ("",)
    fields = fields_at(parents)
    if error["type"] == "extra_forbidden" and fields:
        where = ".".join(str(p) for p in parents if isinstance(p, str)) or "a plan"
        return FieldError(found.path, f"unknown field; {where} takes {', '.join(fields)}")
    field = fields.get(name)
    what = f" ({field.description.rstrip('.')})" if field and field.description else ""
    if error["type"] == "missing":
        return FieldError(found.path, f"required; add it{what}")
    return FieldError(found.path, f"{found.message}{what}")


def fields_at(loc: Sequence[int | str]) -> dict[str, FieldInfo]:
    """The fields, by their names in YAML, of the plan's object at `loc` (none when unknown)."""
    model: type[BaseModel] = ServingPlan
    for part in loc:
        if isinstance(part, int):
            continue  # an item of the list the previous part named
        field = wire_fields(model).get(part)
        models = [t for t in leaf_types(field.annotation) if _is_model(t)] if field else []
        if not models:
            return {}
        model = models[0]
    return wire_fields(model)


def wire_fields(model: type[BaseModel]) -> dict[str, FieldInfo]:
    return {field.alias or name: field for name, field in model.model_fields.items()}


def leaf_types(annotation: Any) -> list[Any]:
    """`list[A] | None` → [A, NoneType]."""
    args = get_args(annotation)
    return [leaf for arg in args for leaf in leaf_types(arg)] if args else [annotation]


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def rollout_errors(plan: ServingPlan, specmodel: SpecModel) -> list[FieldError]:
    """A rollout's step takes its pods from the fleet, which must keep one."""
    replicas = specmodel.spec.pod.replicas
    if plan.rollout is None or plan.rollout.pods < replicas:
        return []
    return [
        FieldError(
            "rollout.pods",
            f"{plan.rollout.pods} pods would leave none of {specmodel.metadata.name}'s "
            f"{replicas} replicas to the fleet; a step takes at most pod.replicas - 1, and a "
            "SpecModel with fewer than 2 replicas has no canary rollout (leave rollout out)",
        )
    ]
