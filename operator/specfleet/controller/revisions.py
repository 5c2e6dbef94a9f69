"""Revisions kept for rollbacks: each distinct engine config is a ControllerRevision owned by
its SpecModel, named by the config's hash, so its content never changes."""

from __future__ import annotations

import logging
from typing import Any

from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from specfleet.api import EngineConfig, SpecModel
from specfleet.api.status import RevisionRecord
from specfleet.controller.kube import Kube
from specfleet.controller.plan import served_well
from specfleet.render import revision_hash
from specfleet.render.labels import managed_labels, owner_reference

Body = dict[str, Any]
log = logging.getLogger(__name__)


def revision_name(specmodel: SpecModel, record: RevisionRecord) -> str:
    return f"{specmodel.metadata.name}-{record.hash}"


def controller_revision(specmodel: SpecModel, record: RevisionRecord) -> Body:
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


class RevisionConfigs:
    """Engine configs of revisions, each read from its ControllerRevision once: a revision's
    name holds its config's hash, so what was read never goes stale."""

    def __init__(self, kube: Kube, capacity: int = 4096) -> None:
        self._kube = kube
        self._capacity = capacity
        self._read: dict[tuple[str, str], EngineConfig] = {}

    def of(
        self, specmodel: SpecModel, records: list[RevisionRecord], serving: int | None = None
    ) -> dict[str, EngineConfig]:
        """The spec's own config and that of every revision a rollback may serve, and of
        `serving`, the revision the fleet serves (a canary rollout's control), by hash. One
        that cannot be read is left out and logged: the step says so if it must be served."""
        own = specmodel.engine_config()
        configs = {revision_hash(own): own}
        for record in records:
            wanted = served_well(record) or record.number == serving
            if wanted and record.hash not in configs:
                config = self._config(specmodel, record)
                if config is not None:
                    configs[record.hash] = config
        return configs

    def _config(self, specmodel: SpecModel, record: RevisionRecord) -> EngineConfig | None:
        key = (specmodel.metadata.namespace, revision_name(specmodel, record))
        if key not in self._read:
            try:
                data = self._kube.read_revision(*key)
                config = EngineConfig.model_validate(data)
            except (ApiException, ValidationError) as exc:
                log.warning("revision %s of %s unreadable: %s", record.number, key, exc)
                return None
            if len(self._read) >= self._capacity:
                self._read.pop(next(iter(self._read)))
            self._read[key] = config
        return self._read[key]
