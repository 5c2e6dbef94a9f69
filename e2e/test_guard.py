"""The closed loop on the local cluster: simulated engines behind real gateways, the real
Prometheus and Alertmanager, the operator's guard acting through the serving plan."""

from __future__ import annotations

import copy
import json
import time
import urllib.request
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from tests.argocd_lua import health as argocd_health

from e2e.cluster.harness import LocalCluster, eventually
from e2e.fleet import engine_pods, simulated_pods
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
    # a trial its canary's evidence cannot decide (the collapse's, at a trickle) ends at its
    # deadline, shortened to the minimum; the next one judges what follows alone
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


def trickle(plan: dict[str, Any], rps: float, **shares: float) -> dict[str, Any]:
    """`plan` for one traffic generator: `rps` request/s from now on, the classes' shares as
    given (the others' as in `plan`)."""
    classes = {
        name: {**klass, "share": shares.get(name, klass["share"])}
        for name, klass in plan["classes"].items()
    }
    return plan | {"traffic_rps": [[0, rps]], "classes": classes}


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
        raise TimeoutError(f"{exc}; {story(cluster, namespace, name)}") from None


def story(cluster: LocalCluster, namespace: str, name: str) -> str:
    """The decisions so far and the pending judgements (kill switch, rollout) as status has
    them: what a timeout shows."""
    st = status(cluster, namespace, name)
    history = [(d["time"][11:19], d["action"], d["message"][:160]) for d in st.get("decisions", [])]
    pending = {key: st[key] for key in ("killSwitch", "rollout") if st.get(key)}
    return f"decisions so far: {history}; status: {json.dumps(pending)}"


def decision(cluster: LocalCluster, namespace: str, name: str, action: str) -> dict[str, Any]:
    """The last decision of `action`."""
    decisions: list[dict[str, Any]] = status(cluster, namespace, name)["decisions"]
    return [d for d in decisions if d["action"] == action][-1]


def condition(st: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in st.get("conditions", []) if c["type"] == kind), {})


def webhook_alerts(
    cluster: LocalCluster, namespace: str, specmodel: str | None = None
) -> list[dict[str, Any]]:
    """The alerts Alertmanager delivered to the webhook for the namespace (one SpecModel's)."""
    return [
        alert
        for notification in cluster.webhook_alerts()
        for alert in notification.get("alerts", [])
        if alert["labels"].get("namespace") == namespace
        and specmodel in (None, alert["labels"].get("specmodel"))
    ]


def webhook_alertnames(
    cluster: LocalCluster, namespace: str, specmodel: str | None = None
) -> set[str]:
    return {a["labels"]["alertname"] for a in webhook_alerts(cluster, namespace, specmodel)}


def events(cluster: LocalCluster, namespace: str, name: str | None = None) -> list[dict[str, Any]]:
    """The namespace's Events (about one object)."""
    items: list[dict[str, Any]] = cluster.kubectl_json("get", "events", "-n", namespace)["items"]
    return [e for e in items if name in (None, e["involvedObject"]["name"])]


def reasons(cluster: LocalCluster, namespace: str) -> set[str]:
    return {e["reason"] for e in events(cluster, namespace)}


def test_collapse_engages_the_kill_switch_then_a_trial_re_enables(
    local_cluster: LocalCluster, namespace: str, operator: RunningOperator, tmp_path: Path
) -> None:
    """The critical class's acceptance collapses: the kill switch engages. The traffic then
    drops to a trickle (0.45 request/s): the first trial's canary (1 pod of 3) sees too few
    requests to judge, and the trial ends at its deadline (trialDeadlineSeconds 60), failed
    inconclusive, its backoff not doubled. Full traffic again after the recovery: the next trial
    re-enables speculation."""
    collapse, recover = 40, 100
    # A release needs the canary's `code` acceptance shown over its floor (0.5), its lower
    # bound at errorRate: 0.95 a draft token (0.88 of the drafted) shows it on about 14 `code`
    # requests, the 0.85 before the collapse (0.68) on about 80, a minute and more on the canary
    plan = scenario([[0, 0.85], [collapse, 0.1], [recover, 0.95]])
    guard = GUARD | {"cooldownSeconds": 15}
    apply(local_cluster, namespace, specmodel("llama", guard=guard))
    with simulated_pods(local_cluster, namespace, plan, tmp_path) as fleet:
        traffic = fleet.traffic_in_background("llama", "llama", 600)
        wait_action(local_cluster, namespace, "llama", "kill_switch_engaged", collapse + 60)
        detected = fleet.scenario_time() - collapse
        reports = [traffic.result(stop=True)]
        traffic = fleet.traffic_in_background("llama", "llama", 600, trickle(plan, 0.45))
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
        assert "SpeculationNotPaying" in reasons(local_cluster, namespace)
        eventually(
            lambda: "SpecfleetKillSwitchEngaged" in webhook_alertnames(local_cluster, namespace),
            "Alertmanager alert",
            60,
        )
        wait_action(local_cluster, namespace, "llama", "trial_started", 60)
        # a trial runs one canary pod with speculation; the fleet stays without it
        canary = local_cluster.kubectl_json("get", "deployment", "llama-canary", "-n", namespace)
        labels = canary["spec"]["template"]["metadata"]["labels"]
        assert canary["spec"]["replicas"] == 1 and labels["specfleet.dev/speculation"] == "on"
        assert labels["app.kubernetes.io/name"] == "specfleet-engine-canary"
        assert not any(
            "speculative" in arg for arg in engine_args(local_cluster, namespace, "llama")
        )
        # the trickle's trial: undecided at its deadline, failed inconclusive
        wait_action(local_cluster, namespace, "llama", "trial_failed", 100)
        reports.append(traffic.result(stop=True))
        traffic = fleet.traffic_in_background("llama", "llama", 600)
        ended = decision(local_cluster, namespace, "llama", "trial_failed")
        assert ended["reason"] == "TrialDeadline", ended
        assert ended["evidence"]["deadline"] is True
        assert ended["evidence"]["cooldownSeconds"] == 15  # not doubled
        assert "undecided" in ended["message"]
        st = status(local_cluster, namespace, "llama")
        assert st["killSwitch"].get("failedTrials", 0) == 0
        eventually(
            lambda: "llama-canary" not in deployments(local_cluster, namespace),
            "the ended trial's canary removed",
            15,
        )
        eventually(
            lambda: any(e["message"] == ended["message"] for e in events(local_cluster, namespace)),
            "the TrialDeadline Event",
            15,
        )
        eventually(
            lambda: "SpecfleetTrialDeadline" in webhook_alertnames(local_cluster, namespace),
            "the TrialDeadline alert",
            60,
        )
        wait_action(local_cluster, namespace, "llama", "kill_switch_released", 120)
        history = [
            a
            for a in actions(local_cluster, namespace, "llama")
            if a.startswith(("trial_", "kill_switch_"))
        ]
        assert history == [
            "kill_switch_engaged",
            "trial_started",
            "trial_failed",
            "trial_started",
            "kill_switch_released",
        ]
        eventually(
            lambda: status(local_cluster, namespace, "llama").get("speculationActive") is True,
            "the fleet rolled to speculation",
        )
        eventually(
            lambda: "llama-canary" not in deployments(local_cluster, namespace), "canary removed"
        )
        assert {"CanaryCreated", "CanaryServing", "CanaryRemoved", "TrialDeadline"} <= reasons(
            local_cluster, namespace
        )
        reports.append(traffic.result(stop=True))
    for report in reports:
        assert sum(report.failed.values()) == 0, report.errors[:5]
    times = [
        (d["action"], datetime.fromisoformat(d["time"]))
        for d in status(local_cluster, namespace, "llama")["decisions"]
    ]
    started = [t for action, t in times if action == "trial_started"]
    deadline = next(t for action, t in times if action == "trial_failed")
    released = next(t for action, t in times if action == "kill_switch_released")
    print(
        f"detection latency on the local cluster: {detected:.1f}s; the trickle's trial ended "
        f"{(deadline - started[0]).total_seconds():.0f}s after it began, the next released "
        f"{(released - started[-1]).total_seconds():.0f}s after it began"
    )
    assert detected < 90


FP8_BREAKS_TOOL_CALLS = {
    "t": 0,
    "spec": {},
    "match_args": ["--kv-cache-dtype fp8"],
    "effects": {"tool_call_validity": 0.5},
}
"""A scenario's rollout: engines with an FP8 KV cache break half the tool calls."""


def with_fp8(good: dict[str, Any]) -> dict[str, Any]:
    bad = copy.deepcopy(good)
    bad["spec"]["quantization"] = {"kvCacheDtype": "fp8"}
    return bad


def broken_tool_calls(good: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """`good` with an FP8 KV cache, and the scenario in which that config breaks half the tool
    calls."""
    plan = scenario([[0, 0.85]], chat_tools=0.6, rollouts=[FP8_BREAKS_TOOL_CALLS])
    return with_fp8(good), plan


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
        aborted = decision(local_cluster, namespace, "agent", "rollout_aborted")
        assert aborted["reason"] == "RolloutAborted"
        assert ("chat", "toolCallValidity") in {
            (b["class"], b["signal"]) for b in aborted["evidence"]["breaches"]
        }
        eventually(
            lambda: any(
                e["reason"] == "RolloutAborted" and "chat: toolCallValidity" in e["message"]
                for e in events(local_cluster, namespace, "agent")
            ),
            "the RolloutAborted Event",
            15,
        )
        eventually(
            lambda: any(
                names_breach(alert, "chat", "toolCallValidity")
                for alert in webhook_alerts(local_cluster, namespace, "agent")
                if alert["labels"]["alertname"] == "SpecfleetRolledBack"
            ),
            "the SpecfleetRolledBack alert with the breach",
            60,
        )
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


def names_breach(alert: dict[str, Any], klass: str, signal: str) -> bool:
    """The alert's summary names the class's signal, and its evidence has that breach."""
    evidence = json.loads(alert["annotations"].get("evidence", "{}"))
    breaches = {(b["class"], b["signal"]) for b in evidence.get("breaches", [])}
    return f"{klass}: {signal}" in alert["annotations"]["summary"] and (klass, signal) in breaches


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
    bad: too few samples to judge. Neither is a reason to act.

    Beside it on the same fleet, a quiet agent (0.45 request/s, all of it chat that calls a
    tool) rolls out a revision that breaks half its tool calls. Its canary serves one request
    in two (1 of the 2 replicas), about 15 before the step's deadline (60 s): the evidence
    aborts the step if those show the breach (validity 0.5 under the 0.9 floor shows on ten
    tool calls at best), else the deadline does. Nothing could pass the step that soon (a
    share is shown within its floor on some 25 requests, and `code`, critical, gets none).
    Either way the Event and the alerts name the class, by its breach or by what was still
    unknown of it."""
    noisy = [[t, 0.95 if (t // 10) % 2 else 0.8] for t in range(0, 60, 10)] + [[60, 0.1]]
    plan = scenario(noisy, rps=3) | {"traffic_rps": [[0, 3], [60, 0.2]]}
    # the pods: the agent's chat requests, which offer a tool, all call it
    pods = scenario(noisy, chat_tools=1.0, rollouts=[FP8_BREAKS_TOOL_CALLS])
    good = specmodel("agent", rollout={"stepDeadlineSeconds": 60})
    apply(local_cluster, namespace, specmodel("quiet"))
    apply(local_cluster, namespace, good)
    with simulated_pods(local_cluster, namespace, pods, tmp_path) as fleet:
        quiet = fleet.traffic_in_background("quiet", "quiet", 110, plan)
        agent = fleet.traffic_in_background(
            "agent", "agent", 600, trickle(pods, 0.45, code=0.0, chat=1.0)
        )
        eventually(
            lambda: ready_replicas(local_cluster, namespace, "agent") == 2, "the agent serves"
        )
        apply(local_cluster, namespace, with_fp8(good))
        eventually(lambda: "agent-rollout" in deployments(local_cluster, namespace), "canary")
        wait_action(local_cluster, namespace, "agent", "rollout_aborted", 120)
        aborted = decision(local_cluster, namespace, "agent", "rollout_aborted")
        print(f"the quiet canary step: {aborted['reason']}: {aborted['message']}")
        if aborted["reason"] == "StepDeadline":
            assert aborted["evidence"]["deadline"] is True
            assert any(p.startswith("chat: ") for p in aborted["evidence"]["pending"]), aborted
            alerts = {"SpecfleetStepDeadline", "SpecfleetRolledBack"}
        else:
            assert aborted["reason"] == "RolloutAborted", aborted
            assert ("chat", "toolCallValidity") in {
                (b["class"], b["signal"]) for b in aborted["evidence"]["breaches"]
            }
            alerts = {"SpecfleetRolledBack"}
        assert "chat: " in aborted["message"]
        st = status(local_cluster, namespace, "agent")
        assert condition(st, "RolledBack")["reason"] == "CanaryAborted"
        assert st["activeRevision"] == 1 and st["desiredRevision"] == 2
        eventually(
            lambda: any(
                e["reason"] == aborted["reason"] and e["message"] == aborted["message"]
                for e in events(local_cluster, namespace, "agent")
            ),
            f"the {aborted['reason']} Event",
            15,
        )
        eventually(
            lambda: "agent-rollout" not in deployments(local_cluster, namespace), "canary gone"
        )
        assert "--kv-cache-dtype" not in engine_args(local_cluster, namespace, "agent")
        eventually(
            lambda: alerts <= webhook_alertnames(local_cluster, namespace, "agent"),
            f"alerts {sorted(alerts)}",
            60,
        )
        for alert in webhook_alerts(local_cluster, namespace, "agent"):
            if alert["labels"]["alertname"] in alerts:
                assert "chat: " in alert["annotations"]["summary"], alert
        trickled = agent.result(stop=True)
        report = quiet.result()
    assert sum(trickled.failed.values()) == 0, trickled.errors[:5]
    assert sum(report.ok.values()) > 150
    acted = [
        a for a in actions(local_cluster, namespace, "quiet") if a not in ("revision_promoted",)
    ]
    assert acted == []
    assert status(local_cluster, namespace, "quiet").get("killSwitch", {}).get("state") in (
        None,
        "released",
    )


def ready_replicas(cluster: LocalCluster, namespace: str, name: str) -> int:
    """The Deployment's ready replicas (0 before it exists)."""
    items = cluster.kubectl_json("get", "deployments", "-n", namespace)["items"]
    found = [d for d in items if d["metadata"]["name"] == name]
    return int(found[0].get("status", {}).get("readyReplicas", 0)) if found else 0


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
        back = time.time()
        eventually(
            lambda: (
                condition(status(local_cluster, namespace, "blind"), "MetricsBlind").get("status")
                == "False"
            ),
            "metrics back",
            60,
        )
        # the judgement resumes: a window judged on what was scraped after the outage
        eventually(
            lambda: last_data(local_cluster, namespace, "blind") > back,
            "data judged after the outage",
            60,
        )
        decided = [d["action"] for d in status(local_cluster, namespace, "blind")["decisions"]]
        assert decided.count("metrics_blind") == decided.count("metrics_restored") == 1, decided
        traffic.result(stop=True)


def last_data(cluster: LocalCluster, namespace: str, name: str) -> float:
    """When the guard last saw data (Unix time; 0 before it has)."""
    seen = (status(cluster, namespace, name).get("guard") or {}).get("lastData")
    return datetime.fromisoformat(seen).timestamp() if seen else 0.0


def routed_to_plain(cluster: LocalCluster, namespace: str, name: str, klass: str) -> float:
    """Requests of `klass` the fleet's gateways sent to the plain pool, read off the gateways
    themselves (what Prometheus would scrape)."""
    pods = cluster.kubectl_json(
        "get", "pods", "-n", namespace, "-l", f"app.kubernetes.io/instance={name}"
    )["items"]
    total = 0.0
    for pod in pods:
        ip = pod.get("status", {}).get("podIP")
        if not ip or "gateway" not in {c["name"] for c in pod["spec"]["containers"]}:
            continue
        try:
            with urllib.request.urlopen(f"http://{ip}:9090/metrics", timeout=2) as response:
                text = response.read().decode()
        except OSError:
            continue
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                labels = sample.labels
                if sample.name == "specfleet_requests_total" and labels.get("pool") == "plain":
                    total += sample.value if labels.get("class") == klass else 0.0
    return total


def test_a_collapsed_class_is_routed_to_the_plain_pool_alone_and_a_trial_brings_it_back(
    local_cluster: LocalCluster, namespace: str, operator: RunningOperator, tmp_path: Path
) -> None:
    """routeClasses: code's acceptance collapses and code alone moves to the plain pool (no
    engine restarts, the fleet's kill switch stays released, chat keeps speculating); once its
    acceptance is back, a trial sends half of code to the fleet again and brings it back."""
    collapse, recover = 30, 60  # routed at about 45 s; the first trial, 30 s later, sees it back
    plan = scenario([[0, 0.85], [collapse, 0.1], [recover, 0.95]])
    guard = GUARD | {"routeClasses": True, "cooldownSeconds": 30, "trialDeadlineSeconds": 120}
    name = "routed"
    apply(local_cluster, namespace, specmodel(name, guard=guard, plainPool={"maxReplicas": 1}))
    with simulated_pods(local_cluster, namespace, plan, tmp_path) as fleet:
        eventually(lambda: ready_replicas(local_cluster, namespace, name) == 2, "fleet Ready", 60)
        fleet_pods = engine_pods(local_cluster, namespace, name)
        traffic = fleet.traffic_in_background(name, name, 600)
        wait_action(local_cluster, namespace, name, "class_speculation_off", collapse + 60)
        off = decision(local_cluster, namespace, name, "class_speculation_off")
        decided = time.monotonic()
        assert off["reason"] == "ClassNotPaying" and off["evidence"]["class"] == "code"
        eventually(
            lambda: routed_to_plain(local_cluster, namespace, name, "code") > 0,
            "code served by the plain pool",
            60,
        )
        moved = time.monotonic() - decided
        st = status(local_cluster, namespace, name)
        states = {c["name"]: c["state"] for c in st["classSpeculation"]}
        assert states == {"code": "plain", "chat": "speculating"}, st["classSpeculation"]
        assert st["classesSpeculating"] == "1/2"
        assert st["killSwitch"]["state"] == "released" and st["speculationActive"] is True
        assert "kill_switch_engaged" not in actions(local_cluster, namespace, name)
        plain = local_cluster.kubectl_json("get", "deployment", f"{name}-plain", "-n", namespace)
        plain_args = " ".join(
            next(c for c in plain["spec"]["template"]["spec"]["containers"])["args"]
        )
        assert "speculative" not in plain_args
        assert (
            engine_pods(local_cluster, namespace, name) == fleet_pods
        )  # a class flip restarts none
        eventually(
            lambda: "SpecfleetClassNotPaying" in webhook_alertnames(local_cluster, namespace, name),
            "the ClassNotPaying alert",
            60,
        )
        assert "ClassNotPaying" in reasons(local_cluster, namespace)
        wait_action(local_cluster, namespace, name, "class_trial_started", 60)
        wait_action(local_cluster, namespace, name, "class_speculation_on", 150)
        back = decision(local_cluster, namespace, name, "class_speculation_on")
        assert back["reason"] == "ClassPays" and back["evidence"]["class"] == "code"
        eventually(
            lambda: status(local_cluster, namespace, name)["classesSpeculating"] == "2/2",
            "code speculating again",
            30,
        )
        assert engine_pods(local_cluster, namespace, name) == fleet_pods
        report = traffic.result(stop=True)
    assert sum(report.failed.values()) == 0, report.errors[:5]
    print(f"decision to the first code request on the plain pool: {moved:.1f}s")
