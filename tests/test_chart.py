"""The Helm chart: lints, renders, least privilege, locked-down pods, values schema enforced.
(Server-side validation of the rendered objects runs against the real API server in e2e/.)"""

from __future__ import annotations

import base64
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import ROOT
from specfleet.controller.admission import HANDLER_ID

CHART = ROOT / "charts/specfleet"
OPERATOR_VERBS = {"get", "list", "watch", "create", "patch", "delete"}


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    binary = os.environ.get("HELM")
    if not binary:
        pytest.fail("HELM is not set: run the tests through `make unit` (it builds helm)")
    return subprocess.run([binary, *args], capture_output=True, text=True, check=check)


def template(*values: str) -> list[dict[str, Any]]:
    out = helm("template", "sf", str(CHART), "-n", "specfleet-system", *values).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def kinds(documents: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for document in documents:
        out.setdefault(document["kind"], []).append(document)
    return out


def test_helm_lint_is_clean() -> None:
    result = helm("lint", "--strict", str(CHART))
    assert "0 chart(s) failed" in result.stdout


def test_template_renders_a_complete_release() -> None:
    objects = kinds(template())
    assert {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Deployment", "Service"} <= set(
        objects
    )
    assert "ServiceMonitor" not in objects and "PrometheusRule" not in objects


def test_operator_pod_is_locked_down() -> None:
    [deployment] = kinds(template())["Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    [container] = pod["containers"]
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    assert container["resources"]["requests"]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["args"][0] == "run"


def test_operator_never_gets_wildcards_or_secret_listing() -> None:
    for role in kinds(template())["ClusterRole"]:
        for rule in role["rules"]:
            assert "*" not in rule["verbs"] and "*" not in rule["resources"]
            assert set(rule["verbs"]) <= OPERATOR_VERBS
            if "secrets" in rule["resources"]:
                assert rule["verbs"] == ["get"]
            if "specmodels" in rule["resources"]:
                assert rule["verbs"] == ["get", "list", "watch"]


def secret_rules(role: dict[str, Any]) -> list[dict[str, Any]]:
    return [rule for rule in role["rules"] if "secrets" in rule["resources"]]


def test_secrets_are_readable_only_by_the_names_alerts_use() -> None:
    """A SpecModel names the Secret its webhook URL is in; without resourceNames its author
    could make the operator read any Secret of the namespace."""
    roles = kinds(template())["ClusterRole"]
    assert [secret_rules(r) for r in roles] == [
        [],
        [
            {
                "apiGroups": [""],
                "resources": ["secrets"],
                "resourceNames": ["specfleet-alerts"],
                "verbs": ["get"],
            }
        ],
    ]
    named = kinds(template("--set", "alertSecrets.names={hooks,am-url}"))["ClusterRole"]
    assert [r["resourceNames"] for role in named for r in secret_rules(role)] == [
        ["hooks", "am-url"]
    ]
    none = template("--set-json", "alertSecrets.names=[]")
    assert not [r for role in kinds(none)["ClusterRole"] for r in secret_rules(role)]


def test_namespaced_roles_restrict_secrets_alike() -> None:
    roles = kinds(template("--set", "watchNamespaces={team-a,team-b}"))["Role"]
    for role in roles:
        if role["metadata"]["name"].endswith("leader-election"):
            assert not secret_rules(role)
            continue
        [rule] = secret_rules(role)
        assert (rule["verbs"], rule["resourceNames"]) == (["get"], ["specfleet-alerts"])


def test_operator_reads_specexperiments_and_writes_only_their_status() -> None:
    [_, operator] = kinds(template())["ClusterRole"]
    verbs = {r: rule["verbs"] for rule in operator["rules"] for r in rule["resources"]}
    assert verbs["specexperiments"] == ["get", "list", "watch"]
    assert verbs["specexperiments/status"] == ["get", "patch"]


def test_operator_may_manage_the_monitors_it_renders() -> None:
    [_, operator] = kinds(template())["ClusterRole"]
    [rule] = [r for r in operator["rules"] if r["apiGroups"] == ["monitoring.coreos.com"]]
    assert set(rule["resources"]) == {"servicemonitors", "podmonitors"}
    assert set(rule["verbs"]) == OPERATOR_VERBS


def test_namespaced_mode_uses_roles() -> None:
    objects = kinds(template("--set", "watchNamespaces={team-a,team-b}"))
    roles = [r for r in objects["Role"] if not r["metadata"]["name"].endswith("leader-election")]
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    [discovery] = objects["ClusterRole"]
    resources = {r for rule in discovery["rules"] for r in rule["resources"]}
    assert resources == {"customresourcedefinitions", "namespaces"}
    args = objects["Deployment"][0]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--namespace=team-a" in args and "--namespace=team-b" in args


def test_monitoring_objects_follow_the_cluster_apis() -> None:
    objects = kinds(template("--api-versions", "monitoring.coreos.com/v1"))
    assert "ServiceMonitor" in objects and "PrometheusRule" in objects
    forced_off = kinds(
        template(
            "--api-versions",
            "monitoring.coreos.com/v1",
            "--set",
            "serviceMonitor.enabled=false",
            "--set",
            "prometheusRule.enabled=false",
        )
    )
    assert "ServiceMonitor" not in forced_off and "PrometheusRule" not in forced_off


def test_values_schema_rejects_bad_values() -> None:
    result = helm("template", "sf", str(CHART), "--set", "logFormat=xml", check=False)
    assert result.returncode != 0
    assert "logFormat" in result.stderr
    result = helm(
        "template", "sf", str(CHART), "--set", "alertSecrets.names={Bad_Name}", check=False
    )
    assert result.returncode != 0
    assert "alertSecrets" in result.stderr


def test_chart_ships_the_generated_crd() -> None:
    crd = yaml.safe_load((CHART / "crds/specmodel.yaml").read_text())
    assert crd["metadata"]["name"] == "specmodels.specfleet.dev"


def test_operator_may_run_the_load_tests_of_an_experiment() -> None:
    [_, operator] = kinds(template())["ClusterRole"]
    [rule] = [r for r in operator["rules"] if r["apiGroups"] == ["batch"]]
    assert rule["resources"] == ["jobs"] and set(rule["verbs"]) == OPERATOR_VERBS
    [deployment] = kinds(template("--set", "capacityImage.tag=v7"))["Deployment"]
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    assert "--capacity-image=ghcr.io/specfleet/specfleet-capacity:v7" in container["args"]


def test_the_admission_webhook_reaches_the_operator_with_a_certificate_it_serves(
    tmp_path: Path,
) -> None:
    objects = kinds(template())
    [config] = objects["ValidatingWebhookConfiguration"]
    [webhook] = config["webhooks"]
    assert webhook["rules"][0]["resources"] == ["specmodels"]
    assert webhook["failurePolicy"] == "Ignore" and webhook["sideEffects"] == "None"
    client = webhook["clientConfig"]
    assert client["service"]["path"] == f"/{HANDLER_ID}"
    [secret] = [s for s in objects["Secret"] if s["metadata"]["name"] == client["service"]["name"]]
    assert secret["data"]["ca.crt"] == client["caBundle"]
    (tmp_path / "ca.pem").write_bytes(base64.b64decode(client["caBundle"]))
    (tmp_path / "tls.pem").write_bytes(base64.b64decode(secret["data"]["tls.crt"]))
    openssl = ["openssl", "verify", "-CAfile", str(tmp_path / "ca.pem"), str(tmp_path / "tls.pem")]
    assert subprocess.run(openssl, capture_output=True, text=True).returncode == 0
    names = subprocess.run(
        ["openssl", "x509", "-noout", "-ext", "subjectAltName", "-in", str(tmp_path / "tls.pem")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert f"DNS:{client['service']['name']}.specfleet-system.svc" in names
    [service] = [
        s for s in objects["Service"] if s["metadata"]["name"] == client["service"]["name"]
    ]
    [deployment] = objects["Deployment"]
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    port = next(
        p for p in container["ports"] if p["name"] == service["spec"]["ports"][0]["targetPort"]
    )
    assert f"--webhook-port={port['containerPort']}" in container["args"]
    mounted = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert "--webhook-cert=" + mounted["webhook-cert"] + "/tls.crt" in container["args"]


def test_the_admission_webhook_can_be_turned_off_and_scoped_to_the_watched_namespaces() -> None:
    objects = kinds(template("--set", "admissionWebhook.enabled=false"))
    assert "ValidatingWebhookConfiguration" not in objects
    [deployment] = objects["Deployment"]
    assert not any(
        "webhook" in a for a in deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    )
    scoped = kinds(template("--set", "watchNamespaces={a,b}"))
    [webhook] = scoped["ValidatingWebhookConfiguration"][0]["webhooks"]
    [expression] = webhook["namespaceSelector"]["matchExpressions"]
    assert expression["values"] == ["a", "b"]


def operator_pod(*values: str) -> dict[str, Any]:
    [deployment] = kinds(template(*values))["Deployment"]
    return dict(deployment)


def test_two_replicas_elect_a_leader_on_a_lease_and_upgrade_one_pod_at_a_time() -> None:
    deployment = operator_pod()
    spec = deployment["spec"]
    assert spec["replicas"] == 2
    assert spec["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
    }
    pod = spec["template"]["spec"]
    [container] = pod["containers"]
    args = container["args"]
    assert "--leader-elect" in args
    assert "--lease-name=sf-specfleet-leader" in args
    assert "--lease-namespace=specfleet-system" in args
    timings = [a for a in args if a.startswith(("--lease-seconds", "--renew", "--retry"))]
    assert timings == ["--lease-seconds=15", "--renew-deadline-seconds=10", "--retry-seconds=2"]
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in container["env"]}
    assert env == {"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace"}
    [term] = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    selector = spec["selector"]["matchLabels"]
    assert term["podAffinityTerm"]["labelSelector"]["matchLabels"] == selector


def test_a_disruption_budget_keeps_one_operator_pod() -> None:
    [pdb] = kinds(template())["PodDisruptionBudget"]
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["metadata"]["namespace"] == "specfleet-system"
    assert pdb["spec"]["selector"] == operator_pod()["spec"]["selector"]
    single = kinds(template("--set", "replicaCount=1"))
    assert "PodDisruptionBudget" not in single  # one pod and minAvailable 1: no drain could pass


def test_the_lease_is_the_only_thing_leader_election_may_touch_in_its_namespace() -> None:
    objects = kinds(template())
    [role] = [r for r in objects["Role"] if r["metadata"]["name"] == "sf-specfleet-leader-election"]
    assert role["metadata"]["namespace"] == "specfleet-system"
    assert role["rules"] == [
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "verbs": ["get", "create", "update"],
        }
    ]
    [binding] = objects["RoleBinding"]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "sf-specfleet", "namespace": "specfleet-system"}
    ]
    for cluster_role in objects["ClusterRole"]:
        assert not [r for r in cluster_role["rules"] if "leases" in r["resources"]]


def test_without_leader_election_one_replica_runs_and_two_are_refused() -> None:
    alone = operator_pod("--set", "leaderElection.enabled=false", "--set", "replicaCount=1")
    assert alone["spec"]["replicas"] == 1
    assert "--leader-elect" not in alone["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "Role" not in kinds(
        template("--set", "leaderElection.enabled=false", "--set", "replicaCount=1")
    )
    two = helm("template", "sf", str(CHART), "--set", "leaderElection.enabled=false", check=False)
    assert two.returncode != 0 and "replicaCount > 1 needs leaderElection.enabled" in two.stderr


def test_given_affinity_replaces_the_default_spread() -> None:
    term = {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["ops"]}]}
    required = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}
    affinity = json.dumps({"nodeAffinity": required})
    pod = operator_pod("--set-json", f"affinity={affinity}")["spec"]["template"]["spec"]
    assert set(pod["affinity"]) == {"nodeAffinity"}


def test_events_are_read_only_by_name_to_find_a_decision_s_event() -> None:
    [_, operator] = kinds(template())["ClusterRole"]
    [rule] = [r for r in operator["rules"] if "events" in r["resources"]]
    assert rule["verbs"] == ["get", "create", "patch"]  # no list, no watch
