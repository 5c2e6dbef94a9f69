"""The ControllerRevision that keeps a revision's engine config for rollbacks: named by the
config's hash and owned by its SpecModel, so its content never changes."""

from __future__ import annotations

from specfleet.api import SpecModel
from specfleet.api.status import RevisionRecord
from specfleet.render.labels import managed_labels, owner_reference
from specfleet.render.workload import Manifest


def revision_name(specmodel: SpecModel, record: RevisionRecord) -> str:
    return f"{specmodel.metadata.name}-{record.hash}"


def controller_revision(specmodel: SpecModel, record: RevisionRecord) -> Manifest:
    """The full engine config of a revision, owned by the SpecModel."""
    meta = specmodel.metadata
    return {
        "apiVersion": "apps/v1",
        "kind": "ControllerRevision",
        "metadata": {
            "name": revision_name(specmodel, record),
            "namespace": meta.namespace,
            "labels": managed_labels(meta.name),
            "ownerReferences": [owner_reference(specmodel)],
        },
        "revision": record.number,
        "data": specmodel.engine_config().canonical(),
    }
