"""Chaos while the guard decides (issue 31, item 3), on the local cluster: simulated engines behind
real gateways, the real Prometheus and Alertmanager, `specfleet run` processes. Each scenario
injects one fault while a decision is due and measures the time from the fault to the next
correct decision; it asserts no duplicate action (one decision record per action, one Event per
decision, named by its idempotency key), no lost action, and a complete audit trail in status.

- The leader killed (SIGKILL) in the middle of a canary step of a broken revision: the follower
  takes the Lease and aborts the rollout exactly once.
- Alertmanager down while the rollout is aborted (SpecfleetRolledBack fires), then back: the
  alert reaches Alertmanager, once, soon after it is back.
- Prometheus down, then back, while the speculation collapses: MetricsBlind after a short blind
  threshold, no action while blind, MetricsRestored, then the kill switch on the collapse.

Guard timings are shortened (5 s interval, 10 s window) so each scenario takes about a minute.
"""

from __future__ import annotations

import copy
import os
import signal
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

from e2e.cluster.harness import LocalCluster, eventually
from e2e.fleet import simulated_pods
from e2e.operator_runner import OperatorProcess, as_process
from e2e.test_guard import apply, deployments, scenario, specmodel, status
from e2e.test_leader import holder, replica_command, start_replicas
from specfleet.api.status import Decision
from specfleet.controller.idempotency import event_name, key_of

GUARD = {
    "intervalSeconds": 5,
    "windowSeconds": 10,
    "consecutiveBreaches": 2,
    "minRequests": 5,
    "minDraftTokens": 100,
    "cooldownSeconds": 600,  # no trial within a scenario
    "probationSeconds": 15,
    "blindAfterSeconds": 60,
}
FP8 = "--kv-cache-dtype"
DELIVERIES = "specfleet_alert_deliveries_total"


def broken_revision() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """A good SpecModel (two replicas, canary rollouts), its revision with an FP8 KV cache, and
    the fleet's scenario in which that config breaks half the tool calls."""
    good = specmodel("agent", guard=GUARD)
    bad = copy.deepcopy(good)
    bad["spec"]["quantization"] = {"kvCacheDtype": "fp8"}
    plan = scenario(
        [[0, 0.85]],
        rps=10,
        chat_tools=0.6,
        rollouts=[
            {
                "t": 0,
                "spec": {},
                "match_args": [FP8 + " fp8"],
                "effects": {"tool_call_validity": 0.5},
            }
        ],
    )
    return good, bad, plan


def decisions(cluster: LocalCluster, namespace: str, name: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = status(cluster, namespace, name).get("decisions", [])
    return found


def actions(cluster: LocalCluster, namespace: str, name: str) -> list[str]:
    return [d["action"] for d in decisions(cluster, namespace, name)]


def condition(cluster: LocalCluster, namespace: str, name: str, kind: str) -> dict[str, Any]:
    found = status(cluster, namespace, name).get("conditions", [])
    return next((c for c in found if c["type"] == kind), {})


def wait_action(
    cluster: LocalCluster, namespace: str, name: str, action: str, timeout: float
) -> float:
    """Until the decisions include `action`; the seconds it took. A timeout shows them."""
    started = time.monotonic()
    try:
        eventually(lambda: action in actions(cluster, namespace, name), action, timeout)
    except TimeoutError as exc:
        history = [
            (d["time"][11:19], d["action"], d["message"][:100])
            for d in decisions(cluster, namespace, name)
        ]
        raise TimeoutError(f"{exc}; decisions so far: {history}") from None
    return time.monotonic() - started


def told(cluster: LocalCluster, namespace: str) -> Counter[str]:
    """Events by reason, each counted as often as the API server says it happened."""
    counted: Counter[str] = Counter()
    for event in cluster.kubectl_json("get", "events", "-n", namespace)["items"]:
        counted[event["reason"]] += event.get("count") or 1
    return counted


def audit(cluster: LocalCluster, namespace: str, name: str) -> Counter[str]:
    """The audit trail is whole and nothing was told twice: every decision in status has its one
    Event, named by its idempotency key, and no decision's reason was told more often than it
    was decided. The decisions' actions, counted."""
    uid = cluster.kubectl_json("get", "sm", name, "-n", namespace)["metadata"]["uid"]
    recorded = [Decision.model_validate(d) for d in decisions(cluster, namespace, name)]
    events = told(cluster, namespace)
    for decision in recorded:
        named = event_name(name, key_of(uid, decision))
        found = cluster.run_kubectl("get", "event", named, "-n", namespace)
        assert found.returncode == 0, f"{decision.action} at {decision.time}: no Event {named}"
    reasons = Counter(d.reason for d in recorded)
    for reason, count in reasons.items():
        assert events[reason] == count, (reason, count, events)
    return Counter(d.action for d in recorded)


def wall(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


@contextmanager
def operator_process(
    cluster: LocalCluster, namespace: str, tmp_path: Path, *args: str
) -> Iterator[OperatorProcess]:
    """One `specfleet run` for `namespace` (the admin's kubeconfig), its guard on the local
    Prometheus every second."""
    with as_process(
        cluster.kubeconfig,
        tmp_path / "operator.log",
        f"--namespace={namespace}",
        f"--prometheus-url={cluster.prometheus_url}",
        "--guard-tick-seconds=1",
        *args,
    ) as running:
        yield running


def promoted(cluster: LocalCluster, namespace: str, name: str) -> None:
    """Revision 1 served its probation (the guard judges the fleet)."""
    wait_action(cluster, namespace, name, "revision_promoted", 90)


def engine_args(cluster: LocalCluster, namespace: str, name: str) -> list[str]:
    deployment = cluster.kubectl_json("get", "deployment", name, "-n", namespace)
    containers = deployment["spec"]["template"]["spec"]["containers"]
    args: list[str] = next(c for c in containers if c["name"] == "engine")["args"]
    return args


def canary_step(cluster: LocalCluster, namespace: str, name: str) -> bool:
    rollout = status(cluster, namespace, name).get("rollout") or {}
    return rollout.get("revision") == 2 and f"{name}-rollout" in deployments(cluster, namespace)


def test_leader_killed_mid_canary_step_the_follower_aborts_the_rollout_once(
    local_cluster: LocalCluster, namespace: str, release: str, tmp_path: Path
) -> None:
    cluster = local_cluster
    good, bad, plan = broken_revision()
    kubeconfig, args = replica_command(cluster, namespace, release, tmp_path)
    started = time.monotonic()
    with ExitStack() as stack:
        fleet = stack.enter_context(simulated_pods(cluster, namespace, plan, tmp_path))
        operators, first = start_replicas(stack, cluster, release, kubeconfig, args, tmp_path)
        [second] = [name for name in operators if name != first]
        apply(cluster, namespace, good)
        traffic = fleet.traffic_in_background("agent", "agent", 300)
        promoted(cluster, namespace, "agent")
        apply(cluster, namespace, bad)
        eventually(lambda: canary_step(cluster, namespace, "agent"), "the canary step", 30)
        assert "rollout_aborted" not in actions(cluster, namespace, "agent")
        os.kill(operators[first].pid, signal.SIGKILL)
        killed, killed_at = time.monotonic(), time.time()
        eventually(lambda: holder(cluster, release) == second, "the follower leads", 30)
        took_over = time.monotonic() - killed
        wait_action(cluster, namespace, "agent", "rollout_aborted", 60)
        aborted = time.monotonic() - killed
        eventually(lambda: "agent-rollout" not in deployments(cluster, namespace), "canary gone")
        time.sleep(GUARD["intervalSeconds"] + 1)  # another evaluation: nothing more is decided
        st = status(cluster, namespace, "agent")
        report = traffic.result(stop=True)

    decided = audit(cluster, namespace, "agent")
    events = told(cluster, namespace)
    abort = next(d for d in st["decisions"] if d["action"] == "rollout_aborted")
    assert wall(abort["time"]) >= killed_at - 1, "aborted by the killed leader, not the follower"
    assert decided["rollout_aborted"] == 1, decided  # no duplicate
    assert events["RolloutAborted"] == 1 and events["RolledBack"] == 1, events
    assert "rolled_back" not in decided
    # nothing lost: the rollout ended aborted, the fleet stays on revision 1
    assert st["rollout"]["phase"] == "Aborted" and st["activeRevision"] == 1
    rolled_back = next(c for c in st["conditions"] if c["type"] == "RolledBack")
    assert rolled_back["status"] == "True" and rolled_back["reason"] == "CanaryAborted"
    assert FP8 not in " ".join(engine_args(cluster, namespace, "agent"))
    failed = sum(report.failed.values())
    print(
        f"\nchaos: leader SIGKILLed in the canary step of a broken revision -> follower leads "
        f"{took_over:.1f} s, rollout_aborted {aborted:.1f} s after the kill; decisions "
        f"{dict(decided)} (the abort's: {abort['evidence'].get('badWindows')} bad window(s), "
        f"decisive {abort['evidence'].get('decisive')}); Events RolloutAborted "
        f"{events['RolloutAborted']}, RolledBack "
        f"{events['RolledBack']}; requests failed {failed} of "
        f"{failed + sum(report.ok.values())}; scenario {time.monotonic() - started:.0f} s"
    )
    assert failed == 0, report.errors[:5]
    assert aborted < 4 + 1 + 3 + 2 * GUARD["windowSeconds"] + 10


def rolled_back_alerts(cluster: LocalCluster, namespace: str) -> list[dict[str, Any]]:
    return [
        a
        for a in cluster.alertmanager_alerts(namespace)
        if a["labels"]["alertname"] == "SpecfleetRolledBack"
    ]


def notified(cluster: LocalCluster, namespace: str, alertname: str) -> int:
    """Firing notifications of `alertname` for `namespace` the webhook got from Alertmanager."""
    return sum(
        1
        for notification in cluster.webhook_alerts()
        for alert in notification.get("alerts", [])
        if alert["labels"].get("namespace") == namespace
        and alert["labels"].get("alertname") == alertname
        and alert.get("status") == "firing"
    )


def failed_deliveries(operator: OperatorProcess) -> float:
    return sum(
        value for labels, value in operator.samples(DELIVERIES) if labels["result"] == "failed"
    )


def test_alertmanager_down_while_a_rollout_aborts_gets_the_alert_once_when_back(
    local_cluster: LocalCluster, namespace: str, tmp_path: Path
) -> None:
    cluster = local_cluster
    cluster.install_crd()
    good, bad, plan = broken_revision()
    started = time.monotonic()
    with ExitStack() as stack:
        fleet = stack.enter_context(simulated_pods(cluster, namespace, plan, tmp_path))
        operator = stack.enter_context(
            operator_process(
                cluster, namespace, tmp_path, f"--alertmanager-url={cluster.alertmanager_url}"
            )
        )
        apply(cluster, namespace, good)
        traffic = fleet.traffic_in_background("agent", "agent", 300)
        promoted(cluster, namespace, "agent")
        apply(cluster, namespace, bad)
        eventually(lambda: canary_step(cluster, namespace, "agent"), "the canary step", 30)
        cluster.stop_alertmanager()
        down = time.monotonic()
        try:
            wait_action(cluster, namespace, "agent", "rollout_aborted", 60)
            fired, failed_before = time.monotonic(), failed_deliveries(operator)
            # every attempt of SpecfleetRolledBack's delivery fails (four, 0.5-8 s apart)
            eventually(lambda: failed_deliveries(operator) > failed_before, "a failure", 30)
            failed_after = time.monotonic() - fired
        finally:
            cluster.start_alertmanager()
        back = time.monotonic()
        eventually(lambda: rolled_back_alerts(cluster, namespace), "SpecfleetRolledBack", 90)
        delivered = time.monotonic() - back
        eventually(lambda: notified(cluster, namespace, "SpecfleetRolledBack"), "notified", 30)
        time.sleep(GUARD["intervalSeconds"] + 1)  # the next evaluations resend nothing new
        held = rolled_back_alerts(cluster, namespace)
        notifications = notified(cluster, namespace, "SpecfleetRolledBack")
        failures = failed_deliveries(operator)
        report = traffic.result(stop=True)

    decided = audit(cluster, namespace, "agent")
    print(
        f"\nchaos: Alertmanager down {back - down:.1f} s, rollout_aborted "
        f"{fired - down:.1f} s into it, its delivery failed {failed_after:.1f} s after "
        f"({failures:.0f} failed deliveries); Alertmanager back -> SpecfleetRolledBack in its "
        f"API {delivered:.1f} s later; alerts held {len(held)} "
        f"({', '.join(a['status']['state'] for a in held)}), webhook notifications "
        f"{notifications}; decisions {dict(decided)}; scenario "
        f"{time.monotonic() - started:.0f} s"
    )
    assert decided["rollout_aborted"] == 1
    assert len(held) == 1, held
    assert notifications == 1
    # the failed delivery went again at the next evaluations, not at the next resend (60 s)
    assert delivered < 30
    assert sum(report.failed.values()) == 0, report.errors[:5]
