"""What ties an object to its SpecModel: the labels the operator's watches select on and the
owner reference the garbage collector follows. Every object the operator creates carries both."""

from __future__ import annotations

from typing import Any

from specfleet.api.experiment import SpecExperiment
from specfleet.api.model import SpecModel

MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "specfleet"
INSTANCE = "app.kubernetes.io/instance"
"""The SpecModel's name, on everything it owns."""
MANAGED = {MANAGED_BY: MANAGER}
"""Every object the operator manages, whichever SpecModel owns it."""


def managed_labels(name: str) -> dict[str, str]:
    """The labels of the objects SpecModel `name` owns."""
    return {INSTANCE: name, **MANAGED}


def owner_reference(owner: SpecModel | SpecExperiment) -> dict[str, Any]:
    """The SpecModel (or SpecExperiment) as its children's controller: deleting it deletes
    them."""
    return {
        "apiVersion": owner.api_version,
        "kind": owner.kind,
        "name": owner.metadata.name,
        "uid": owner.metadata.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }
