"""No cut streams (issue 29): streams of a minute or more run across a class flip (the gateways'
routing reloaded), a fleet-wide flip (every engine restarted) and a rollout step (a canary pod,
promoted, then the fleet rolled), on simulated engines behind real gateways. Each pod that goes
drains for its grace: the stand-in kubelet gives it terminationGracePeriodSeconds, as a kubelet
does, and the rendered gateway and engine drain for what is left after the preStop.

Each pod stays (with its IP) until its processes have stopped, as on a node, so the new pods
start at once on other IPs. The flips are asked for by hand (the annotations), so nothing waits
on the guard's evidence."""

from __future__ import annotations

import copy
import time
from pathlib import Path

from e2e.cluster.harness import LocalCluster, eventually
from e2e.fleet import simulated_pods
from e2e.operator_runner import RunningOperator
from e2e.test_guard import (  # noqa: F401
    GUARD,
    apply,
    deployments,
    operator,
    ready_replicas,
    scenario,
    specmodel,
    status,
)
from e2e.traffic import LongStream
from specfleet_testbed.kubelet import FINALIZER

NAME = "streams"
MINUTE = 60.0


def test_streams_of_a_minute_cross_a_class_flip_a_fleet_wide_flip_and_a_rollout_step(
    local_cluster: LocalCluster,
    namespace: str,
    operator: RunningOperator,  # noqa: F811
    tmp_path: Path,
) -> None:
    model = {**specmodel(NAME)["spec"]["model"], "maxModelLen": 16384}
    guard = GUARD | {"routeClasses": True}
    first = specmodel(NAME, model=model, guard=guard, plainPool={"maxReplicas": 1})
    apply(local_cluster, namespace, first)
    with simulated_pods(local_cluster, namespace, scenario([[0, 0.85]], rps=2), tmp_path) as fleet:
        eventually(lambda: ready_replicas(local_cluster, namespace, NAME) == 2, "fleet Ready", 60)
        speculating = names(local_cluster, namespace)
        begun, long = fleet.long_streams_in_background(NAME, NAME)
        stages = {"streams": time.time()}
        eventually(lambda: len(begun) >= 3, "three long streams begun", 30)

        annotate(local_cluster, namespace, "specfleet.dev/classes-off=code")
        flipped = stages["class flip"] = time.time()
        eventually(lambda: class_state(local_cluster, namespace, "code") == "plain", "code routed")
        assert names(local_cluster, namespace) == speculating  # a class flip restarts nothing

        annotate(local_cluster, namespace, "specfleet.dev/kill-switch=engage")
        stages["fleet-wide flip"] = time.time()
        eventually(
            lambda: (
                not names(local_cluster, namespace) & speculating
                and ready_replicas(local_cluster, namespace, NAME) == 2
            ),
            "the fleet restarted without speculation",
            120,
        )
        plain = names(local_cluster, namespace)

        second = copy.deepcopy(first)
        second["spec"]["model"]["maxModelLen"] = 12288
        apply(local_cluster, namespace, second)
        eventually(lambda: f"{NAME}-rollout" in deployments(local_cluster, namespace), "canary")
        eventually(lambda: canary_ready(local_cluster, namespace), "the canary step serving", 60)
        canary = names(local_cluster, namespace) - plain
        annotate(local_cluster, namespace, "specfleet.dev/rollout=promote")
        long.halt()  # those in flight cross the promotion
        stages["rollout step"] = time.time()
        eventually(
            lambda: (
                status(local_cluster, namespace, NAME).get("activeRevision") == 2
                and f"{NAME}-rollout" not in deployments(local_cluster, namespace)
                and not names(local_cluster, namespace) & (plain | canary)
            ),
            "revision 2 promoted and rolled out",
            180,
        )
        streams = long.result(timeout=4 * MINUTE)
    pods = local_cluster.kubectl_json("get", "pods", "-n", namespace)["items"]
    held = [p["metadata"]["name"] for p in pods if FINALIZER in p["metadata"].get("finalizers", [])]
    assert not held, f"the stand-in kubelet stopped but left {held} undeletable"

    cut = [s for s in streams if not s.whole()]
    assert not cut, cut[:3]
    assert crossing(streams, lambda s: flipped), "none in flight across the class flip"
    on_gone = lambda pods: lambda s: s.pod_gone if s.pod in pods else None  # noqa: E731
    assert crossing(streams, on_gone(speculating)), "none across the fleet-wide restart"
    assert crossing(streams, on_gone(plain | canary)), "none across the rollout step"
    longest = max(s.ended - s.started for s in streams)
    began = {stage: round(at - stages["streams"]) for stage, at in stages.items()}
    print(f"{len(streams)} long streams, none cut, the longest {longest:.0f}s; s: {began}")


def crossing(streams: list[LongStream], moment: object) -> list[LongStream]:
    """The streams of a minute or more in flight at `moment(stream)` (Unix time, or None)."""
    pick = moment if callable(moment) else (lambda _: moment)
    return [s for s in streams if s.crossed(pick(s)) and s.ended - s.started >= MINUTE]


def annotate(cluster: LocalCluster, namespace: str, annotation: str) -> None:
    cluster.kubectl("annotate", "--overwrite", "sm", NAME, "-n", namespace, annotation)


def names(cluster: LocalCluster, namespace: str) -> set[str]:
    """The serving pods' names: the fleet's and a canary's (not the plain pool's)."""
    selector = f"app.kubernetes.io/instance={NAME},specfleet.dev/pool!=plain"
    items = cluster.kubectl_json("get", "pods", "-n", namespace, "-l", selector)["items"]
    return {p["metadata"]["name"] for p in items if "deletionTimestamp" not in p["metadata"]}


def class_state(cluster: LocalCluster, namespace: str, klass: str) -> str | None:
    found = status(cluster, namespace, NAME).get("classSpeculation") or []
    return next((c["state"] for c in found if c["name"] == klass), None)


def canary_ready(cluster: LocalCluster, namespace: str) -> bool:
    rollout = cluster.kubectl_json("get", "deployment", f"{NAME}-rollout", "-n", namespace)
    return (rollout.get("status", {}).get("readyReplicas") or 0) >= 1
