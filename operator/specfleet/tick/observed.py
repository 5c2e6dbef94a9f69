"""What the tick sees of a SpecModel's children, typed: each Deployment's rollout and why a pod
cannot be scheduled. The operator builds it from the watched objects (`observe`, the one reader
of their JSON); the replay builds it from its simulated fleet (`simulate.control`). Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from specfleet.api.gateway import Mirror
from specfleet.api.status import ReplicaStatus
from specfleet.render.workload import (
    REVISION_LABEL,
    SPECULATION_LABEL,
    canary_name,
    plain_name,
    rollout_name,
)

Body = dict[str, Any]


@dataclass(frozen=True)
class Rollout:
    """One Deployment as watched; the defaults are one not seen (not there, or not yet)."""

    replicas: ReplicaStatus = field(default_factory=ReplicaStatus)
    complete: bool = False
    """Its current generation observed, every replica updated and available, no old one left."""
    deadline_exceeded: str | None = None
    """Why its progress deadline passed (a crash loop, an unschedulable pod, ...)."""
    speculation_running: bool | None = None
    """Whether its pod template runs speculation; None: not seen."""
    revision_running: int | None = None
    """The revision its pod template runs; None: not seen (or not labelled)."""


@dataclass(frozen=True)
class Observed:
    """The children as the controller's watches see them."""

    fleet: Rollout = field(default_factory=Rollout)
    """The engine Deployment (`<name>`)."""
    unschedulable: str | None = None
    """Why one of the fleet's pods cannot be scheduled."""
    apply_error: str | None = None
    canary: Rollout = field(default_factory=Rollout)
    """A trial's canary Deployment (`<name>-canary`)."""
    rollout: Rollout = field(default_factory=Rollout)
    """A canary rollout's Deployment (`<name>-rollout`)."""
    plain: Rollout = field(default_factory=Rollout)
    """The plain pool's Deployment (`<name>-plain`)."""
    mirror: Mirror | None = None
    """A running experiment's arms, which the fleet's gateways mirror a sample to."""


def observe(
    name: str,
    children: Mapping[tuple[str, str], Body],
    pods: list[Body],
    mirror: Mirror | None = None,
) -> Observed:
    """The typed observation of a SpecModel's watched children (by (kind, name)) and pods."""
    return Observed(
        fleet=rollout(children.get(("Deployment", name))),
        unschedulable=unschedulable(pods),
        canary=rollout(children.get(("Deployment", canary_name(name)))),
        rollout=rollout(children.get(("Deployment", rollout_name(name)))),
        plain=rollout(children.get(("Deployment", plain_name(name)))),
        mirror=mirror,
    )


def rollout(deployment: Body | None) -> Rollout:
    """A watched Deployment's rollout."""
    if deployment is None:
        return Rollout()
    spec, status = deployment.get("spec", {}), deployment.get("status", {})
    desired = spec.get("replicas", 1)
    replicas = ReplicaStatus(
        desired=desired,
        updated=status.get("updatedReplicas", 0),
        ready=status.get("readyReplicas", 0),
        available=status.get("availableReplicas", 0),
    )
    current = deployment["metadata"].get("generation") == status.get("observedGeneration")
    complete = current and (
        replicas.updated == desired
        and replicas.available == desired
        and status.get("replicas", 0) == desired
    )
    deadline = next(
        (
            c.get("message", "")
            for c in status.get("conditions", [])
            if c.get("type") == "Progressing" and c.get("reason") == "ProgressDeadlineExceeded"
        ),
        None,
    )
    labels = spec.get("template", {}).get("metadata", {}).get("labels", {})
    revision = labels.get(REVISION_LABEL, "")
    return Rollout(
        replicas,
        complete,
        deadline,
        labels.get(SPECULATION_LABEL) == "on",
        int(revision) if revision.isdigit() else None,
    )


def unschedulable(pods: list[Body]) -> str | None:
    for pod in pods:
        for condition in pod.get("status", {}).get("conditions", []):
            if (
                condition.get("type") == "PodScheduled"
                and condition.get("reason") == "Unschedulable"
            ):
                name, message = pod["metadata"]["name"], condition.get("message", "")
                return f"pod {name} cannot be scheduled: {message}"
    return None
