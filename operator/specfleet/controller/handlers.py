"""kopf wiring, thin: watches fill indexes; any event on a SpecModel, one of its children or
pods puts the SpecModel on the work queue, and workers reconcile it in threads; a periodic
resync is the level-based safety net. SpecExperiments alike, on a queue of their own: an event
on one, on one of its arms' objects or on the SpecModel it names.

No per-object timers or daemons: they would put a kopf finalizer on every SpecModel.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import Callable
from typing import Any

import kopf

from specfleet.api import GROUP, PLURAL, VERSION
from specfleet.api.experiment import EXPERIMENT_PLURAL
from specfleet.controller.leader import Leadership, NotLeading
from specfleet.controller.metrics import LEADER
from specfleet.controller.operator import Index, Key, Operator, experiments_of
from specfleet.controller.queue import WorkQueue
from specfleet.experiment.capacity_job import CAPACITY_APP
from specfleet.render.labels import INSTANCE, MANAGED
from specfleet.render.workload import EXPERIMENT_LABEL
from specfleet.tick.children import summary

CHILD_RESOURCES = [
    ("apps", "v1", "deployments"),
    ("", "v1", "services"),
    ("", "v1", "configmaps"),
    ("policy", "v1", "poddisruptionbudgets"),
    ("monitoring.coreos.com", "v1", "servicemonitors"),
    ("monitoring.coreos.com", "v1", "podmonitors"),
]
CHILD_INDEXES = [f"children_{plural}" for _, _, plural in CHILD_RESOURCES]
LabelFilter = dict[str, Any]
"""Label values or kopf.PRESENT / kopf.ABSENT."""
FLEET: LabelFilter = {**MANAGED, EXPERIMENT_LABEL: kopf.ABSENT}
"""A SpecModel's own objects and pods: not an experiment's arms."""
ARMS: LabelFilter = {**MANAGED, EXPERIMENT_LABEL: kopf.PRESENT}
ARM_RESOURCES = [
    *(r for r in CHILD_RESOURCES if r[2] != "poddisruptionbudgets"),
    ("batch", "v1", "jobs"),
]
"""An arm renders a Deployment, ConfigMaps, a Service and, as its SpecModel does, monitors; the
capacity phase a load test's Job per arm and their prompts' ConfigMap."""
ARM_INDEXES = [f"arms_{plural}" for _, _, plural in ARM_RESOURCES]
CAPACITY_PODS: LabelFilter = {**ARMS, "app.kubernetes.io/name": CAPACITY_APP}
"""The load tests' pods, whose termination messages hold their results."""
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


def _watch_owned(
    resource: tuple[str, str, str],
    labels: LabelFilter,
    index_id: str,
    owner: Callable[[str | None, kopf.Labels], Key],
    queue: str,
) -> None:
    """Index `resource` by its owner's key, and queue the owner when one changes."""

    def by_owner(
        namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any
    ) -> dict[Key, Any]:
        return {owner(namespace, labels): summary(body)}

    async def owned_event(namespace: str | None, labels: kopf.Labels, memo: Any, **_: Any) -> None:
        memo[queue].add(owner(namespace, labels))

    kopf.index(*resource, labels=labels, id=index_id)(by_owner)
    kopf.on.event(*resource, labels=labels, id=f"{index_id}_event")(owned_event)


_watch_owned(("", "v1", "pods"), FLEET, "pods", _owner, "queue")
for _resource in CHILD_RESOURCES:
    _watch_owned(_resource, FLEET, f"children_{_resource[2]}", _owner, "queue")


@kopf.index(GROUP, VERSION, EXPERIMENT_PLURAL)
def specexperiments(namespace: str | None, name: str, body: kopf.Body, **_: Any) -> dict[Key, Any]:
    return {(namespace or "", name): _snapshot(body)}


def _experiment(namespace: str | None, labels: kopf.Labels) -> Key:
    return namespace or "", labels.get(EXPERIMENT_LABEL, "")


for _resource in ARM_RESOURCES:
    _watch_owned(_resource, ARMS, f"arms_{_resource[2]}", _experiment, "experiments")
_watch_owned(("", "v1", "pods"), CAPACITY_PODS, "capacity_pods", _experiment, "experiments")


@kopf.on.event(GROUP, VERSION, EXPERIMENT_PLURAL)
async def specexperiment_event(
    namespace: str | None, name: str, body: kopf.Body, memo: Any, **_: Any
) -> None:
    memo["experiments"].add((namespace or "", name))
    specmodel = body.get("spec", {}).get("specModelRef", {}).get("name")
    if specmodel:  # its fleet's gateways start or stop mirroring to the arms
        memo["queue"].add((namespace or "", specmodel))


@kopf.on.event(GROUP, VERSION, PLURAL)
async def specmodel_event(
    type: str,
    namespace: str | None,
    name: str,
    memo: Any,
    specexperiments: Index | None = None,
    **_: Any,
) -> None:
    key = (namespace or "", name)
    for experiment in experiments_of(key, specexperiments or {}):
        memo["experiments"].add(experiment)
    if type == "DELETED":
        await asyncio.to_thread(memo["operator"].forget, key)
        return
    memo["queue"].add(key)


def _reconcile_experiment(memo: Any, key: Key, indexes: dict[str, Any]) -> None:
    operator: Operator = memo["operator"]
    operator.reconcile_experiment(
        key,
        indexes["specexperiments"],
        indexes["specmodels"],
        [indexes[name] for name in ARM_INDEXES],
        indexes["capacity_pods"],
        indexes["pods"],
    )


def _reconcile(memo: Any, key: Key, indexes: dict[str, Any]) -> None:
    operator: Operator = memo["operator"]
    operator.reconcile(
        key,
        indexes["specmodels"],
        [indexes[name] for name in CHILD_INDEXES],
        indexes["pods"],
        experiments=indexes["specexperiments"],
    )


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """In-cluster credentials, else $KUBECONFIG as it is now (not at import time)."""
    return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)


def _leading(memo: Any) -> bool:
    """This replica may act: it holds the Lease and its term has begun (the caches of an
    earlier term forgotten: `_leadership_changed`), or it runs without leader election."""
    leadership: Leadership | None = memo.get("leadership")
    return leadership is None or (memo.get("term", False) and leadership.leading())


def _leadership_changed(memo: Any, indexes: dict[str, Any], leading: bool) -> None:
    """On the event loop. Starting to lead: forget what an earlier term wrote and take every
    object again, from the watches' view (the status another leader wrote included)."""
    LEADER.set(1 if leading else 0)
    memo["term"] = leading
    if not leading:
        return
    memo["operator"].new_term()
    for queue, index in (("queue", "specmodels"), ("experiments", "specexperiments")):
        for key in list(indexes[index]):
            memo[queue].add(key)


@kopf.on.probe(id="leader")
def leader_probe(memo: Any, **_: Any) -> str:
    """In the health endpoint's answer (readiness and liveness): `leader` or `follower`; a
    follower is ready, its watches warm, to take over."""
    if memo.get("leadership") is None:
        return "standalone"
    return "leader" if _leading(memo) else "follower"


@kopf.on.startup()
async def start_loops(memo: Any, **indexes: Any) -> None:
    memo["queue"] = WorkQueue()
    memo["experiments"] = WorkQueue()
    leadership: Leadership | None = memo.get("leadership")
    LEADER.set(1 if leadership is None else 0)
    if leadership is not None:
        loop = asyncio.get_running_loop()

        def changed(leading: bool) -> None:  # from the election's thread
            loop.call_soon_threadsafe(_leadership_changed, memo, indexes, leading)

        leadership.on_change = changed
        leadership.start()
    memo["tasks"] = [
        asyncio.create_task(_resync_forever(memo, indexes)),
        asyncio.create_task(_work_experiments(memo, indexes)),
        asyncio.create_task(_guard_forever(memo, indexes)),
        *(asyncio.create_task(_work(memo, indexes)) for _ in range(RECONCILE_WORKERS)),
    ]


@kopf.on.cleanup()
async def stop_loops(memo: Any, **_: Any) -> None:
    for task in memo.get("tasks", []):
        task.cancel()
    leadership: Leadership | None = memo.get("leadership")
    if leadership is not None:  # stops acting, then hands the Lease over
        await asyncio.to_thread(leadership.stop)


async def _work(memo: Any, indexes: dict[str, Any]) -> None:
    """One reconcile worker: takes keys off the queue; a failed apply comes back after its
    backoff."""
    queue: WorkQueue = memo["queue"]
    operator: Operator = memo["operator"]
    while True:
        key = await queue.get()
        if not _leading(memo):  # a follower; the leader takes every key when it starts
            queue.done(key)
            continue
        try:
            await asyncio.to_thread(_reconcile, memo, key, indexes)
        except NotLeading:  # the Lease lost mid-reconcile: the next leader takes it whole
            log.warning("reconcile of %s/%s stopped: no longer leading", *key)
        except Exception:  # one broken SpecModel must not stop the worker
            log.exception("reconcile of %s/%s failed", *key)
        finally:
            queue.done(key)
        retry_in = operator.retry_in(key)
        if retry_in is not None:
            queue.add_after(key, retry_in)


async def _work_experiments(memo: Any, indexes: dict[str, Any]) -> None:
    """The one SpecExperiment worker: experiments are few and their reconciles short."""
    queue: WorkQueue = memo["experiments"]
    while True:
        key = await queue.get()
        if not _leading(memo):
            queue.done(key)
            continue
        try:
            await asyncio.to_thread(_reconcile_experiment, memo, key, indexes)
        except NotLeading:
            log.warning("reconcile of SpecExperiment %s/%s stopped: no longer leading", *key)
        except Exception:  # one broken SpecExperiment must not stop the worker
            log.exception("reconcile of SpecExperiment %s/%s failed", *key)
        finally:
            queue.done(key)


async def _resync_forever(memo: Any, indexes: dict[str, Any]) -> None:
    """The level-based safety net: every SpecModel and SpecExperiment again, from the watches'
    current view."""
    while True:
        await asyncio.sleep(memo["resync_seconds"])
        for queue, index in (("queue", "specmodels"), ("experiments", "specexperiments")):
            for key in list(indexes[index]):
                memo[queue].add(key)


async def _guard_forever(memo: Any, indexes: dict[str, Any]) -> None:
    """Guard evaluations: one telemetry batch per tick for every SpecModel that is due; and
    the reconciles of the experiments whose arms are due a measurement."""
    operator: Operator = memo["operator"]
    while operator.reader is not None:
        await asyncio.sleep(memo["guard_tick_seconds"])
        if not _leading(memo):
            continue
        try:
            await asyncio.to_thread(
                operator.guard_tick,
                indexes["specmodels"],
                [indexes[name] for name in CHILD_INDEXES],
                indexes["pods"],
                indexes["specexperiments"],
            )
        except NotLeading:
            log.warning("guard tick stopped: no longer leading")
            continue
        except Exception:  # a failed tick is logged; the next tick tries again
            log.exception("guard tick failed")
        for key in operator.experiments_due(list(indexes["specexperiments"]), operator.monotonic()):
            memo["experiments"].add(key)
