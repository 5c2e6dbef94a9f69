"""kopf wiring, thin: watches fill indexes; any event on a SpecModel, one of its children or
pods puts the SpecModel on the work queue, and workers reconcile it in threads; a periodic
resync is the level-based safety net.

No per-object timers or daemons: they would put a kopf finalizer on every SpecModel.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from typing import Any

import kopf

from specfleet.api import GROUP, PLURAL, VERSION
from specfleet.controller.children import summary
from specfleet.controller.operator import Index, Key, Operator
from specfleet.controller.queue import WorkQueue
from specfleet.render.labels import INSTANCE, MANAGED

CHILD_RESOURCES = [
    ("apps", "v1", "deployments"),
    ("", "v1", "services"),
    ("", "v1", "configmaps"),
    ("policy", "v1", "poddisruptionbudgets"),
    ("monitoring.coreos.com", "v1", "servicemonitors"),
    ("monitoring.coreos.com", "v1", "podmonitors"),
]
CHILD_INDEXES = [f"children_{plural}" for _, _, plural in CHILD_RESOURCES]
RECONCILE_WORKERS = 8
log = logging.getLogger(__name__)


def _snapshot(body: kopf.Body) -> dict[str, Any]:
    """A SpecModel as the operator reads it: all of it but managedFields."""
    metadata = {k: v for k, v in body.get("metadata", {}).items() if k != "managedFields"}
    return copy.deepcopy({**body, "metadata": metadata})


def _owner(namespace: str | None, labels: kopf.Labels) -> Key:
    return namespace or "", labels.get(INSTANCE, "")


@kopf.index(GROUP, VERSION, PLURAL)
def specmodels(namespace: str | None, name: str, body: kopf.Body, **_: Any) -> dict[Key, Any]:
    return {(namespace or "", name): _snapshot(body)}


def _by_owner(
    namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any
) -> dict[Key, Any]:
    return {_owner(namespace, labels): summary(body)}


kopf.index("", "v1", "pods", labels=MANAGED, id="pods")(_by_owner)


def _index_children(group: str, version: str, plural: str) -> None:
    kopf.index(group, version, plural, labels=MANAGED, id=f"children_{plural}")(_by_owner)

    async def child_event(namespace: str | None, labels: kopf.Labels, memo: Any, **_: Any) -> None:
        memo["queue"].add(_owner(namespace, labels))

    kopf.on.event(group, version, plural, labels=MANAGED, id=f"{plural}_event")(child_event)


for _group, _version, _plural in CHILD_RESOURCES:
    _index_children(_group, _version, _plural)


@kopf.on.event(GROUP, VERSION, PLURAL)
async def specmodel_event(type: str, namespace: str | None, name: str, memo: Any, **_: Any) -> None:
    key = (namespace or "", name)
    if type == "DELETED":
        await asyncio.to_thread(memo["operator"].forget, key)
        return
    memo["queue"].add(key)


@kopf.on.event("", "v1", "pods", labels=MANAGED)
async def pod_event(namespace: str | None, labels: kopf.Labels, memo: Any, **_: Any) -> None:
    memo["queue"].add(_owner(namespace, labels))


def _reconcile(memo: Any, key: Key, indexes: dict[str, Any]) -> None:
    operator: Operator = memo["operator"]
    operator.reconcile(
        key,
        indexes["specmodels"],
        [indexes[name] for name in CHILD_INDEXES],
        indexes["pods"],
    )


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """In-cluster credentials, else $KUBECONFIG as it is now (not at import time)."""
    return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)


@kopf.on.startup()
async def start_loops(memo: Any, **indexes: Any) -> None:
    memo["queue"] = WorkQueue()
    memo["tasks"] = [
        asyncio.create_task(_resync_forever(memo, indexes)),
        asyncio.create_task(_guard_forever(memo, indexes)),
        *(asyncio.create_task(_work(memo, indexes)) for _ in range(RECONCILE_WORKERS)),
    ]


@kopf.on.cleanup()
async def stop_loops(memo: Any, **_: Any) -> None:
    for task in memo.get("tasks", []):
        task.cancel()


async def _work(memo: Any, indexes: dict[str, Any]) -> None:
    """One reconcile worker: takes keys off the queue; a failed apply comes back after its
    backoff."""
    queue: WorkQueue = memo["queue"]
    operator: Operator = memo["operator"]
    while True:
        key = await queue.get()
        try:
            await asyncio.to_thread(_reconcile, memo, key, indexes)
        except Exception:  # one broken SpecModel must not stop the worker
            log.exception("reconcile of %s/%s failed", *key)
        finally:
            queue.done(key)
        retry_in = operator.retry_in(key)
        if retry_in is not None:
            queue.add_after(key, retry_in)


async def _resync_forever(memo: Any, indexes: dict[str, Any]) -> None:
    """The level-based safety net: every SpecModel again, from the watches' current view."""
    while True:
        await asyncio.sleep(memo["resync_seconds"])
        specmodel_index: Index = indexes["specmodels"]
        for key in list(specmodel_index):
            memo["queue"].add(key)


async def _guard_forever(memo: Any, indexes: dict[str, Any]) -> None:
    """Guard evaluations: one telemetry batch per tick for every SpecModel that is due."""
    operator: Operator = memo["operator"]
    while operator.reader is not None:
        await asyncio.sleep(memo["guard_tick_seconds"])
        try:
            await asyncio.to_thread(
                operator.guard_tick,
                indexes["specmodels"],
                [indexes[name] for name in CHILD_INDEXES],
                indexes["pods"],
            )
        except Exception:  # a failed tick is logged; the next tick tries again
            log.exception("guard tick failed")
