"""The closed loop on the local cluster: simulated engines behind real gateways, the real
Prometheus and Alertmanager, the operator's guard acting through the serving plan."""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.argocd_lua import health as argocd_health

from e2e.cluster.harness import LocalCluster, eventually
from e2e.fleet import simulated_pods
from e2e.operator_runner import RunningOperator, in_process

ROOT = Path(__file__).resolve().parent.parent
GUARD = {
    "intervalSeconds": 5,
    "windowSeconds": 15,
    "consecutiveBreaches": 2,
    "minRequests": 10,
    "minDraftTokens": 200,
    "cooldownSeconds": 30,
    "probationSeconds": 30,
    "blindAfterSeconds": 15,
    # a trial that began in the collapse sums collapsed and recovered requests: its deadline,
    # shortened here, ends it and the next one judges the recovery alone
    "trialDeadlineSeconds": 60,
}


def specmodel(name: str, **spec: Any) -> dict[str, Any]:
    base = {
        "engine": {"name": "vllm"},
        "model": {
            "source": "meta-llama/Llama-3.1-8B-Instruct",
            "servedName": name,
            "toolCallParser": "llama3_json",
        },
        "speculative": {"method": "eagle3", "draftModel": "d", "numSpeculativeTokens": 4},
        "classes": [
            {"name": "code", "critical": True, "slo": {"minAcceptanceRate": 0.5}},
            {"name": "chat", "slo": {"minToolCallValidity": 0.9}},
        ],
        "defaultClass": "chat",
        "guard": GUARD,
        "pod": {"replicas": 2},
    }
    return {
        "apiVersion": "specfleet.dev/v1alpha1",
        "kind": "SpecModel",
        "metadata": {"name": name},
        "spec": base | spec,
    }


def scenario(
    code: list[list[float]], rps: float = 8, chat_tools: float = 0.0, **extra: Any
) -> dict[str, Any]:
    return {
        "duration_s": 3600,
        "traffic_rps": [[0, rps]],
        "classes": {
            "code": {"share": 0.5, "acceptance": code, "output_tokens": 48},
            "chat": {
                "share": 0.5,
                "acceptance": [[0, 0.65]],
                "output_tokens": 48,
                "tool_call_rate": chat_tools,
            },
        },
        **extra,
    }


@pytest.fixture(scope="module")
def operator(local_cluster: LocalCluster) -> Iterator[RunningOperator]:
    local_cluster.install_crd()
    with in_process(
        local_cluster,
        prometheus_url=local_cluster.prometheus_url,
        alertmanager_url=local_cluster.alertmanager_url,
    ) as running:
        yield running


def apply(cluster: LocalCluster, namespace: str, manifest: dict[str, Any]) -> None:
    cluster.kubectl(
        "apply",
        "--server-side",
        "--field-manager=argocd-controller",
        "-n",
        namespace,
        "-f",
        "-",
        stdin=yaml.safe_dump(manifest),
    )


def status(cluster: LocalCluster, namespace: str, name: str) -> dict[str, Any]:
    result: dict[str, Any] = cluster.kubectl_json("get", "sm", name, "-n", namespace).get(
        "status", {}
    )
    return result


def actions(cluster: LocalCluster, namespace: str, name: str) -> list[str]:
    return [d["action"] for d in status(cluster, namespace, name).get("decisions", [])]


def wait_action(
    cluster: LocalCluster, namespace: str, name: str, action: str, timeout: float
) -> None:
    """Until the SpecModel's decisions include `action`; a timeout shows the decisions so far."""
    try:
        eventually(lambda: action in actions(cluster, namespace, name), action, timeout)
    except TimeoutError as exc:
        history = [
            (d["time"][11:19], d["action"], d["message"][:120])
            for d in status(cluster, namespace, name).get("decisions", [])
        ]
        raise TimeoutError(f"{exc}; decisions so far: {history}") from None


def condition(st: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in st.get("conditions", []) if c["type"] == kind), {})


def webhook_alertnames(cluster: LocalCluster, namespace: str) -> set[str]:
    names = set()
    for notification in cluster.webhook_alerts():
        for alert in notification.get("alerts", []):
            if alert["labels"].get("namespace") == namespace:
                names.add(alert["labels"]["alertname"])
    return names


def test_collapse_engages_the_kill_switch_then_a_trial_re_enables(
    local_cluster: LocalCluster, namespace: str, operator: RunningOperator, tmp_path: Path
) -> None:
    collapse, recover = 40, 100
    plan = scenario([[0, 0.85], [collapse, 0.1], [recover, 0.85]])
    apply(local_cluster, namespace, specmodel("llama"))
    with simulated_pods(local_cluster, namespace, plan, tmp_path) as fleet:
        traffic = fleet.traffic_in_background("llama", "llama", recover + 180)
        wait_action(local_cluster, namespace, "llama", "kill_switch_engaged", collapse + 60)
        detected = fleet.scenario_time() - collapse
        st = status(local_cluster, namespace, "llama")
        engaged = next(d for d in st["decisions"] if d["action"] == "kill_switch_engaged")
        # engaged on the code class's floor (0.5): a decisive first window may still hold
        # some healthy requests from before the collapse
        assert engaged["evidence"]["classes"]["code"]["acceptanceRate"] < 0.45
        assert any(b.startswith("code: acceptance") for b in engaged["evidence"]["breaches"])
        assert st["killSwitch"]["state"] == "engaged"
        eventually(
            lambda: status(local_cluster, namespace, "llama").get("speculationActive") is False,
            "pods without speculation",
        )
        reasons = {
            e["reason"]
            for e in local_cluster.kubectl_json("get", "events", "-n", namespace)["items"]
        }
        assert "SpeculationNotPaying" in reasons
        eventually(
            lambda: "SpecfleetKillSwitchEngaged" in webhook_alertnames(local_cluster, namespace),
            "Alertmanager alert",
            60,
        )
        wait_action(local_cluster, namespace, "llama", "trial_started", recover + 60)
        # a trial runs one canary pod with speculation; the fleet stays without it
        canary = local_cluster.kubectl_json("get", "deployment", "llama-canary", "-n", namespace)
        labels = canary["spec"]["template"]["metadata"]["labels"]
        assert canary["spec"]["replicas"] == 1 and labels["specfleet.dev/speculation"] == "on"
        assert labels["app.kubernetes.io/name"] == "specfleet-engine-canary"
        assert not any(
            "speculative" in arg for arg in engine_args(local_cluster, namespace, "llama")
        )
        wait_action(
            local_cluster,
            namespace,
            "llama",
            "kill_switch_released",
            recover + 210 - fleet.scenario_time(),
        )
        history = actions(local_cluster, namespace, "llama")
        assert history.index("trial_started") < history.index("kill_switch_released")
        eventually(
            lambda: status(local_cluster, namespace, "llama").get("speculationActive") is True,
            "the fleet rolled to speculation",
        )
        eventually(
            lambda: "llama-canary" not in deployments(local_cluster, namespace), "canary removed"
        )
        reasons = {
            e["reason"]
            for e in local_cluster.kubectl_json("get", "events", "-n", namespace)["items"]
        }
        assert {"CanaryCreated", "CanaryServing", "CanaryRemoved"} <= reasons
        report = traffic.result()
    assert sum(report.failed.values()) == 0, report.errors[:5]
    print(f"detection latency on the local cluster: {detected:.1f}s")
    assert detected < 90


def broken_tool_calls(good: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """`good` with an FP8 KV cache, and the scenario in which that config breaks half the tool
    calls."""
    bad = copy.deepcopy(good)
    bad["spec"]["quantization"] = {"kvCacheDtype": "fp8"}
    plan = scenario(
        [[0, 0.85]],
        chat_tools=0.6,
        rollouts=[
            {
                "t": 0,
                "spec": {},
                "match_args": ["--kv-cache-dtype fp8"],
                "effects": {"tool_call_validity": 0.5},
            }
        ],
    )
    return bad, plan


def test_quality_regression_rolls_back_and_holds_until_retry(
    local_cluster: LocalCluster, namespace: str, operator: RunningOperator, tmp_path: Path
) -> None:
    good = specmodel("agent", rollout={"strategy": "direct"})  # probation, the whole fleet
    bad, plan = broken_tool_calls(good)
    apply(local_cluster, namespace, good)
    with simulated_pods(local_cluster, namespace, plan, tmp_path) as fleet:
        traffic = fleet.traffic_in_background("agent", "agent", 600)
        wait_action(local_cluster, namespace, "agent", "revision_promoted", 90)
        apply(local_cluster, namespace, bad)
        wait_action(local_cluster, namespace, "agent", "rolled_back", 90)
        st = status(local_cluster, namespace, "agent")
        assert condition(st, "RolledBack")["status"] == "True"
        assert st["activeRevision"] == 1 and st["desiredRevision"] == 2
        eventually(
            lambda: "--kv-cache-dtype" not in engine_args(local_cluster, namespace, "agent"),
            "old config back",
        )
        health = argocd_health(local_cluster.kubectl_json("get", "sm", "agent", "-n", namespace))
        assert health["status"] == "Degraded"
        apply(local_cluster, namespace, bad)  # Git re-applies the same spec: the hold stays
        time.sleep(10)
        st = status(local_cluster, namespace, "agent")
        assert (
            st["activeRevision"] == 1
            and actions(local_cluster, namespace, "agent").count("rolled_back") == 1
        )
        local_cluster.kubectl("annotate", "sm", "agent", "-n", namespace, "specfleet.dev/retry=1")
        eventually(
            lambda: status(local_cluster, namespace, "agent").get("activeRevision") == 2,
            "retry serves revision 2",
        )
        eventually(
            lambda: actions(local_cluster, namespace, "agent").count("rolled_back") == 2,
            "judged bad again",
            90,
        )
        traffic.result(stop=True)


def test_a_canary_rollout_aborts_a_broken_revision_and_promotes_a_good_one(
    local_cluster: LocalCluster, namespace: str, operator: RunningOperator, tmp_path: Path
) -> None:
    """Two replicas: a new revision first serves on one pod (`agent-rollout`) beside one of the
    fleet on the revision before it, judged against it on the same windows."""
    good = specmodel("agent")
    bad, plan = broken_tool_calls(good)
    better = copy.deepcopy(good)
    better["spec"]["model"] = {**good["spec"]["model"], "maxModelLen": 8192}
    apply(local_cluster, namespace, good)
    with simulated_pods(local_cluster, namespace, plan, tmp_path) as fleet:
        traffic = fleet.traffic_in_background("agent", "agent", 600)
        wait_action(local_cluster, namespace, "agent", "revision_promoted", 90)  # the guard runs
        apply(local_cluster, namespace, bad)
        eventually(lambda: "agent-rollout" in deployments(local_cluster, namespace), "canary")
        st = status(local_cluster, namespace, "agent")
        assert condition(st, "Progressing")["reason"] == "CanaryStep"
        assert st["rollout"]["revision"] == 2 and st["rollout"]["control"] == 1
        wait_action(local_cluster, namespace, "agent", "rollout_aborted", 120)
        st = status(local_cluster, namespace, "agent")
        assert condition(st, "RolledBack")["reason"] == "CanaryAborted"
        assert "toolCallValidity" in condition(st, "RolledBack")["message"]
        assert st["activeRevision"] == 1 and "rolled_back" not in actions(
            local_cluster, namespace, "agent"
        )
        eventually(
            lambda: "agent-rollout" not in deployments(local_cluster, namespace), "canary gone"
        )
        assert "--kv-cache-dtype" not in engine_args(local_cluster, namespace, "agent")
        health = argocd_health(local_cluster.kubectl_json("get", "sm", "agent", "-n", namespace))
        assert health["status"] == "Degraded"
        apply(local_cluster, namespace, better)
        wait_action(local_cluster, namespace, "agent", "rollout_promoted", 180)
        eventually(
            lambda: status(local_cluster, namespace, "agent").get("activeRevision") == 3, "3"
        )
        eventually(
            lambda: "agent-rollout" not in deployments(local_cluster, namespace), "canary gone"
        )
        report = traffic.result(stop=True)
    assert sum(report.failed.values()) == 0, report.errors[:5]


def deployments(cluster: LocalCluster, namespace: str) -> set[str]:
    items = cluster.kubectl_json("get", "deployments", "-n", namespace)["items"]
    return {d["metadata"]["name"] for d in items}


def engine_args(cluster: LocalCluster, namespace: str, name: str) -> list[str]:
    deployment = cluster.kubectl_json("get", "deployment", name, "-n", namespace)
    containers = deployment["spec"]["template"]["spec"]["containers"]
    args: list[str] = next(c for c in containers if c["name"] == "engine")["args"]
    return args


def test_low_traffic_and_noisy_healthy_acceptance_take_no_action(
    local_cluster: LocalCluster, namespace: str, operator: RunningOperator, tmp_path: Path
) -> None:
    """Noisy but healthy acceptance for a minute, then a trickle of traffic whose acceptance is
    bad: too few samples to judge. Neither is a reason to act."""
    noisy = [[t, 0.95 if (t // 10) % 2 else 0.8] for t in range(0, 60, 10)] + [[60, 0.1]]
    plan = scenario(noisy, rps=3) | {"traffic_rps": [[0, 3], [60, 0.2]]}
    apply(local_cluster, namespace, specmodel("quiet"))
    with simulated_pods(local_cluster, namespace, plan, tmp_path) as fleet:
        report = fleet.traffic("quiet", "quiet", 110)
    assert sum(report.ok.values()) > 150
    acted = [
        a for a in actions(local_cluster, namespace, "quiet") if a not in ("revision_promoted",)
    ]
    assert acted == []
    assert status(local_cluster, namespace, "quiet").get("killSwitch", {}).get("state") in (
        None,
        "released",
    )


def test_prometheus_down_is_blind_alerts_and_holds(
    local_cluster: LocalCluster, namespace: str, operator: RunningOperator, tmp_path: Path
) -> None:
    apply(local_cluster, namespace, specmodel("blind"))
    with simulated_pods(local_cluster, namespace, scenario([[0, 0.85]], rps=4), tmp_path) as fleet:
        traffic = fleet.traffic_in_background("blind", "blind", 600)
        eventually(
            lambda: status(local_cluster, namespace, "blind").get("classes"), "first evaluation", 60
        )
        local_cluster.stop_prometheus()
        try:
            eventually(
                lambda: (
                    condition(status(local_cluster, namespace, "blind"), "MetricsBlind").get(
                        "status"
                    )
                    == "True"
                ),
                "MetricsBlind",
                60,
            )
            st = status(local_cluster, namespace, "blind")
            assert st.get("killSwitch", {}).get("state", "released") == "released"
            eventually(
                lambda: "SpecfleetMetricsBlind" in webhook_alertnames(local_cluster, namespace),
                "blind alert",
                60,
            )
        finally:
            local_cluster.start_prometheus()
        eventually(
            lambda: (
                condition(status(local_cluster, namespace, "blind"), "MetricsBlind").get("status")
                == "False"
            ),
            "metrics back",
            60,
        )
        traffic.result(stop=True)
