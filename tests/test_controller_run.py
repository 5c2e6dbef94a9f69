"""The operator's kopf settings hold only while its handlers stay what they are."""

from __future__ import annotations

import subprocess
import sys

import kopf

import specfleet.controller.handlers  # noqa: F401  (registers the handlers)
from specfleet.controller.run import YOUNG_COLLECTION_THRESHOLD, NoEssence, settings


def test_kopf_builds_no_essences_because_no_handler_compares_them() -> None:
    registry = kopf.get_default_registry()
    # An on.create / on.update / on.field handler, a daemon or a timer would need kopf's
    # diff-base: NoEssence would make it see every change as the first one.
    assert not list(registry._changing.get_all_handlers())
    assert not list(registry._spawning.get_all_handlers())
    assert isinstance(settings().persistence.diffbase_storage, NoEssence)
    assert NoEssence().build(body=kopf.Body({"spec": {"a": 1}})) == {}


def test_the_operator_process_freezes_its_startup_heap_and_collects_young_objects_less_often() -> (
    None
):
    # In a child process: freezing and re-tuning the test runner's own collector would leak
    # into every other test.
    script = (
        "import gc; from specfleet.controller.run import tune_collector; "
        "assert gc.get_freeze_count() == 0; tune_collector(); "
        "print(gc.get_freeze_count(), *gc.get_threshold())"
    )
    frozen, young, middle, old = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    ).stdout.split()
    assert int(frozen) > 10_000  # kopf, the kubernetes client, pydantic's schemas
    assert (int(young), int(middle), int(old)) == (YOUNG_COLLECTION_THRESHOLD, 10, 10)
