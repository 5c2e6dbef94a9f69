"""Two operators, one leader, on the real API server: two `specfleet run` processes as the chart
runs them (its ServiceAccount and RBAC, --leader-elect, a Lease in the release's namespace), with
the lease's timings shortened (4 s lease, 3 s renew deadline, 1 s retry) to keep the test short.

- Only the leader writes; the follower says so (health endpoint, `specfleet_leader`).
- The guard's one decision (MetricsBlind: no gateway runs) is told by one Event, named by its
  idempotency key; that Event deleted (as if the leader had died between writing the decision
  and telling of it), the next leader tells it again, once.
- The leader paused (SIGSTOP) while a kill switch is asked for: the follower takes the Lease and
  engages it; the old leader, resumed, writes nothing (its renew deadline has passed).
- The new leader killed (SIGKILL) right after the kill switch is released: the other takes
  over; failover time (kill to its first reconcile) is measured.
- An upgrade's way: a new replica up, the leader stopped (SIGTERM) hands the Lease over on its
  way out, and the new one leads within a retry rather than a lease.
Each action is told by exactly one Event.
"""

from __future__ import annotations

import json
import os
import signal
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from e2e.cluster.harness import Cluster, LocalCluster, eventually
from e2e.operator_runner import OperatorProcess, as_process, service_account_kubeconfig
from e2e.readiness import pods_marked_ready
from e2e.test_operator import ACCOUNT, SPECMODEL, apply, engine_args, status, wait_phase
from specfleet.api.status import Decision
from specfleet.controller.idempotency import event_name, key_of

LEASE = "e2e-leader"
GUARDED = {
    **SPECMODEL,
    # A guard that evaluates once (blind at once: no gateway runs) and then not for an hour, so
    # the leader writes nothing more unless asked and every write can be told apart.
    "spec": {
        **SPECMODEL["spec"],
        "guard": {"intervalSeconds": 3600, "windowSeconds": 3600, "blindAfterSeconds": 0},
    },
}
TIMINGS = ["--lease-seconds=4", "--renew-deadline-seconds=3", "--retry-seconds=1"]
WRITES = "specfleet_api_writes_total"
RECONCILES = "specfleet_reconcile_total"


def holder(cluster: Cluster, namespace: str) -> str | None:
    found = cluster.run_kubectl("get", "lease", LEASE, "-n", namespace, "-o", "json")
    if found.returncode != 0:
        return None
    name: str | None = json.loads(found.stdout)["spec"].get("holderIdentity")
    return name


def reasons(cluster: Cluster, namespace: str) -> list[str]:
    events = cluster.kubectl_json("get", "events", "-n", namespace)["items"]
    return [e["reason"] for e in events]


def kill_switch(cluster: Cluster, namespace: str, value: str) -> None:
    annotation = f"specfleet.dev/kill-switch={value}"
    cluster.kubectl("annotate", "--overwrite", "sm", "llama", "-n", namespace, annotation)


def role(operator: OperatorProcess) -> str:
    answer: dict[str, Any] = json.loads(operator.health())
    return str(answer["leader"])


def blind_decision(cluster: Cluster, namespace: str) -> Decision | None:
    found = status(cluster, namespace).get("decisions", [])
    return next((Decision.model_validate(d) for d in found if d["reason"] == "MetricsBlind"), None)


def replica_command(
    cluster: LocalCluster, namespace: str, release: str, tmp_path: Path
) -> tuple[Path, list[str]]:
    """A replica's kubeconfig (the chart's ServiceAccount) and `specfleet run` arguments: leader
    election on the short test lease, the guard on the local Prometheus every second."""
    kubeconfig = service_account_kubeconfig(cluster, release, ACCOUNT, tmp_path / "sa.kubeconfig")
    args = [f"--namespace={namespace}", "--leader-elect", f"--lease-name={LEASE}"]
    args += [f"--lease-namespace={release}", *TIMINGS]
    args += [f"--prometheus-url={cluster.prometheus_url}", "--guard-tick-seconds=1"]
    return kubeconfig, args


def start_replicas(
    stack: ExitStack,
    cluster: Cluster,
    release: str,
    kubeconfig: Path,
    args: list[str],
    tmp_path: Path,
) -> tuple[dict[str, OperatorProcess], str]:
    """Two replicas, operator-a and operator-b, stopped with `stack`; once one leads, the
    replicas by pod name and the leader's."""
    operators = {
        name: stack.enter_context(
            as_process(kubeconfig, tmp_path / f"{name}.log", *args, env={"POD_NAME": name})
        )
        for name in ("operator-a", "operator-b")
    }
    eventually(lambda: holder(cluster, release) in operators, "a leader")
    first = holder(cluster, release)
    assert first is not None
    return operators, first


def test_two_operators_one_leader_paused_and_killed_leaders_hand_over_cleanly(
    local_cluster: LocalCluster, namespace: str, release: str, tmp_path: Path
) -> None:
    cluster = local_cluster
    kubeconfig, args = replica_command(cluster, namespace, release, tmp_path)
    with ExitStack() as stack:
        stack.enter_context(pods_marked_ready(cluster))
        operators, first = start_replicas(stack, cluster, release, kubeconfig, args, tmp_path)
        leader = operators[first]
        [follower_name] = [name for name in operators if name != first]
        follower = operators[follower_name]
        eventually(lambda: leader.total("specfleet_leader") == 1, "the leader's gauge")
        # kopf's health endpoint caches its probes' answers for 10 s
        both = lambda: (role(leader), role(follower)) == ("leader", "follower")  # noqa: E731
        eventually(both, "the health endpoints saying who leads", 15)
        assert follower.total("specfleet_leader") == 0

        apply(cluster, namespace, GUARDED)
        wait_phase(cluster, namespace, "Ready")
        # The guard's first evaluation finds no series (no gateway runs): one decision.
        eventually(lambda: blind_decision(cluster, namespace), "the MetricsBlind decision")
        blind = blind_decision(cluster, namespace)
        assert blind is not None
        uid = cluster.kubectl_json("get", "sm", "llama", "-n", namespace)["metadata"]["uid"]
        blind_event = event_name("llama", key_of(uid, blind))
        exists = lambda: cluster.run_kubectl("get", "event", blind_event, "-n", namespace)  # noqa: E731
        eventually(lambda: exists().returncode == 0, "the decision's Event, named by its key")
        assert follower.total(WRITES) == 0 and follower.total(RECONCILES) == 0
        time.sleep(1)  # the reconcile in flight ends (its Events follow the status seen)
        written = leader.total(WRITES)
        assert written > 0
        # As if the leader had died between writing the decision and telling of it.
        cluster.kubectl("delete", "event", blind_event, "-n", namespace)

        # The leader paused (SIGSTOP: a stalled process, a long GC, a partition) while a kill
        # switch is asked for: the follower takes the Lease once it expires and engages it.
        os.kill(leader.pid, signal.SIGSTOP)
        try:
            paused = time.monotonic()
            kill_switch(cluster, namespace, "engage")
            eventually(lambda: holder(cluster, release) == follower_name, "the follower leads")
            took_over = time.monotonic() - paused
            eventually(
                lambda: "--speculative-config" not in engine_args(cluster, namespace),
                "speculation off by the new leader",
            )
            # The new leader told the decision its predecessor left untold.
            eventually(lambda: exists().returncode == 0, "the untold decision's Event")
        finally:
            os.kill(leader.pid, signal.SIGCONT)
        # Resumed, the old leader has the kill switch's watch events queued and its lease long
        # past its renew deadline: it writes nothing, and says it follows.
        eventually(lambda: role(leader) == "follower", "the old leader follows", 15)
        time.sleep(3)
        assert leader.total(WRITES) == written
        assert leader.total("specfleet_leader") == 0
        eventually(lambda: status(cluster, namespace).get("killSwitch", {}).get("state"), "engaged")
        assert status(cluster, namespace)["killSwitch"]["state"] == "engaged"

        # The new leader killed right after the kill switch is released: the other takes over.
        reconciled = leader.total(RECONCILES)
        kill_switch(cluster, namespace, "release")
        os.kill(follower.pid, signal.SIGKILL)
        killed = time.monotonic()
        eventually(lambda: leader.total(RECONCILES) > reconciled, "the first reconcile", 30)
        failover = time.monotonic() - killed
        eventually(lambda: holder(cluster, release) == first, "the Lease back with the first")
        eventually(
            lambda: "--speculative-config" in engine_args(cluster, namespace),
            "speculation on again",
        )
        wait_phase(cluster, namespace, "Ready")

        # An upgrade's way: a new replica comes up, the leader is stopped (SIGTERM). It hands
        # the Lease over on its way out: the new one leads within a retry, not a lease.
        newcomer = stack.enter_context(
            as_process(
                kubeconfig, tmp_path / "operator-c.log", *args, env={"POD_NAME": "operator-c"}
            )
        )
        eventually(lambda: newcomer.total("specfleet_leader") == 0, "operator-c follows")
        time.sleep(1.5)  # it has seen the leader's renewals: without a handover it waits a lease
        os.kill(leader.pid, signal.SIGTERM)
        stopped = time.monotonic()
        eventually(lambda: holder(cluster, release) == "operator-c", "operator-c leads", 30)
        handover = time.monotonic() - stopped
        time.sleep(1)

    told = reasons(cluster, namespace)
    assert told.count("SpeculationDisabled") == 1, told
    assert told.count("SpeculationEnabled") == 1, told
    decisions = [Decision.model_validate(d) for d in status(cluster, namespace)["decisions"]]
    assert [d.reason for d in decisions] == ["MetricsBlind"]  # decided once, by one leader
    for decision in decisions:  # each told by the one Event its idempotency key names
        named = event_name("llama", key_of(uid, decision))
        assert cluster.run_kubectl("get", "event", named, "-n", namespace).returncode == 0
        assert told.count(decision.reason) == 1, (decision.reason, told)
    # Lease 4 s, retry 1 s: the follower acquires at most a lease plus a retry after it last saw
    # a renewal; a little more for its first reconcile on this shared machine.
    print(
        f"\nfailover: paused leader -> Lease taken {took_over:.1f} s; killed -> first reconcile "
        f"{failover:.1f} s; stopped (SIGTERM) -> Lease with the newcomer {handover:.1f} s "
        "(lease 4 s, renew deadline 3 s, retry 1 s)"
    )
    assert took_over < 4 + 1 + 3
    assert failover < 4 + 1 + 3
    assert handover < 4  # handed over: it did not wait for the lease to run out
