"""The operator's kopf settings hold only while its handlers stay what they are."""

from __future__ import annotations

import kopf

import specfleet.controller.handlers  # noqa: F401  (registers the handlers)
from specfleet.controller.run import NoEssence, settings


def test_kopf_builds_no_essences_because_no_handler_compares_them() -> None:
    registry = kopf.get_default_registry()
    # An on.create / on.update / on.field handler, a daemon or a timer would need kopf's
    # diff-base: NoEssence would make it see every change as the first one.
    assert not list(registry._changing.get_all_handlers())
    assert not list(registry._spawning.get_all_handlers())
    assert isinstance(settings().persistence.diffbase_storage, NoEssence)
    assert NoEssence().build(body=kopf.Body({"spec": {"a": 1}})) == {}
