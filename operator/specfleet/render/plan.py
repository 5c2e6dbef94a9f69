"""The serving plan: what runs. It comes from status (the guard and the kill switch write it),
never from spec, so the operator changes what runs without touching what Git declares."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

from pydantic import Field

from specfleet.api.base import ApiModel
from specfleet.api.gateway import Mirror
from specfleet.api.model import EngineConfig

DEFAULT_GATEWAY_IMAGE = "ghcr.io/specfleet/specfleet:0.1.0"
DEFAULT_CAPACITY_IMAGE = "ghcr.io/specfleet/specfleet-capacity:0.1.0"


class RolloutCanary(ApiModel):
    """A canary rollout's step: the new revision on `pods` pods beside the fleet."""

    revision: int = Field(ge=1, description="The new revision's number.")
    pods: int = Field(ge=1, description="Its pods; the fleet's shrink by as many.")
    engine_config: EngineConfig = Field(description="The new revision's engine config.")


class PlainPool(ApiModel):
    """The plain pool (`<name>-plain`): the active revision without speculation, serving the
    classes routed off it."""

    replicas: int = Field(ge=1, description="Its pods.")
    routed: list[str] = Field(
        default_factory=list,
        description="The classes the fleet's gateways send to it: none until it is Ready.",
    )
    trial: dict[str, float] = Field(
        default_factory=dict,
        description="Per routed class on the guard's trial, the share of it the gateways "
        "serve with speculation instead.",
    )


class ServingPlan(ApiModel):
    """Which revision is active, whether the fleet runs speculation, and whether a trial's canary
    runs beside it."""

    revision: int = Field(default=1, ge=1, description="Active revision number.")
    speculation: bool = Field(default=True, description="Run the speculative config, if any.")
    canary: bool = Field(
        default=False,
        description="Also run one canary pod of the active revision with speculation (a trial).",
    )
    engine_config: EngineConfig | None = Field(
        default=None,
        description="The active revision's engine config; omitted means the spec's own.",
    )
    rollout: RolloutCanary | None = Field(
        default=None, description="A canary rollout's step, beside the fleet."
    )
    mirror: Mirror | None = Field(
        default=None, description="A running experiment's arms the fleet's gateways mirror to."
    )
    plain: PlainPool | None = Field(
        default=None, description="The plain pool, beside the fleet; none at zero pods."
    )


@dataclass(frozen=True)
class RenderSettings:
    """Operator-wide settings that shape every SpecModel's children."""

    gateway_image: str = DEFAULT_GATEWAY_IMAGE
    capacity_image: str = DEFAULT_CAPACITY_IMAGE
    """specfleet with guidellm (images/capacity): an experiment's load tests."""
    extra_labels: dict[str, str] = field(default_factory=dict)


def revision_hash(config: EngineConfig) -> str:
    """Stable across runs and dict orderings: sorted keys, defaults filled in."""
    canonical = json.dumps(config.canonical(), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:10]
