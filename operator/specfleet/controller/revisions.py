"""The engine configs of the revisions kept for rollbacks, read back from their ControllerRevisions
(`render.revision`)."""

from __future__ import annotations

import logging
from typing import Any

from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from specfleet.api import EngineConfig, SpecModel
from specfleet.api.status import RevisionRecord
from specfleet.controller.kube import UNANSWERED, Kube
from specfleet.render import revision_hash
from specfleet.render.revision import revision_name
from specfleet.tick.plan import served_well

Body = dict[str, Any]
log = logging.getLogger(__name__)


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
            except (ApiException, ValidationError, *UNANSWERED) as exc:
                log.warning("revision %s of %s unreadable: %s", record.number, key, exc)
                return None
            if len(self._read) >= self._capacity:
                self._read.pop(next(iter(self._read)))
            self._read[key] = config
        return self._read[key]
