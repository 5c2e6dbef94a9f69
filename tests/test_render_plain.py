"""The plain pool beside the fleet (`render.plain`): the active revision without speculation,
engines only, reached by the fleet's gateways through its own Service."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from conftest import specmodel_doc
from specfleet.api import SpecModel, parse_specmodel
from specfleet.render import PlainPool, ServingPlan, render
from specfleet.render.plan import RolloutCanary

EAGLE3 = {"method": "eagle3", "draftModel": "org/head", "numSpeculativeTokens": 4}
ROUTED = ServingPlan(plain=PlainPool(replicas=2, routed=["code"]))


def specmodel(engine: str = "vllm", **spec: Any) -> SpecModel:
    doc = specmodel_doc(
        engine={"name": engine},
        speculative=EAGLE3,
        classes=[{"name": "code"}, {"name": "chat"}],
        defaultClass="chat",
        pod={"replicas": 4},
        monitoring={"serviceMonitor": True},
        **spec,
    )
    return parse_specmodel(doc)


def named(manifests: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    [found] = [m for m in manifests if m["kind"] == kind and m["metadata"]["name"] == name]
    return found


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def pod_labels(deployment: dict[str, Any]) -> dict[str, str]:
    labels: dict[str, str] = deployment["spec"]["template"]["metadata"]["labels"]
    return labels


def gateway_config(manifests: list[dict[str, Any]], name: str) -> dict[str, Any]:
    data = named(manifests, "ConfigMap", f"{name}-gateway")["data"]["gateway.yaml"]
    config: dict[str, Any] = yaml.safe_load(data)
    return config


def test_nothing_of_a_plain_pool_without_one_in_the_plan() -> None:
    names = {m["metadata"]["name"] for m in render(specmodel(), ServingPlan())}
    assert not any(n.startswith("m-plain") for n in names)
    assert "plainPool" not in gateway_config(render(specmodel(), ServingPlan()), "m")


@pytest.mark.parametrize("engine", ["vllm", "tensorrt-llm"])
def test_the_plain_pool_runs_the_active_revision_without_any_speculative_config(
    engine: str,
) -> None:
    manifests = render(specmodel(engine), ROUTED)
    fleet, plain = named(manifests, "Deployment", "m"), named(manifests, "Deployment", "m-plain")
    assert plain["spec"]["replicas"] == 2 and fleet["spec"]["replicas"] == 4
    [engine_container] = plain["spec"]["template"]["spec"]["containers"]  # no gateway
    of_plain = [m for m in manifests if m["metadata"]["name"].startswith("m-plain")]
    rendered = yaml.safe_dump([engine_container, *of_plain])
    assert "org/head" not in rendered and "speculative" not in rendered.lower()
    fleet_annotations = fleet["spec"]["template"]["metadata"]["annotations"]
    plain_annotations = plain["spec"]["template"]["metadata"]["annotations"]
    assert (
        plain_annotations["specfleet.dev/revision-hash"]
        == (fleet_annotations["specfleet.dev/revision-hash"])
    )
    assert pod_labels(plain)["specfleet.dev/speculation"] == "off"
    assert pod_labels(plain)["specfleet.dev/pool"] == "plain"
    assert "specfleet.dev/pool" not in pod_labels(fleet)  # the fleet's pods roll for nothing


def test_the_plain_pool_serves_the_fleets_gateways_never_the_specmodels_clients() -> None:
    manifests = render(specmodel(), ROUTED)
    fleet, plain = named(manifests, "Deployment", "m"), named(manifests, "Deployment", "m-plain")
    service = named(manifests, "Service", "m")
    plain_service = named(manifests, "Service", "m-plain")
    assert selects(service["spec"]["selector"], pod_labels(fleet))
    assert not selects(service["spec"]["selector"], pod_labels(plain))
    assert selects(plain_service["spec"]["selector"], pod_labels(plain))
    assert not selects(plain_service["spec"]["selector"], pod_labels(fleet))
    [port] = plain_service["spec"]["ports"]
    assert (port["port"], port["targetPort"]) == (80, "engine")


def test_the_plain_pool_has_its_budget_and_its_engines_monitor_beside_the_fleets() -> None:
    manifests = render(specmodel(), ROUTED)
    plain = named(manifests, "Deployment", "m-plain")
    budget = named(manifests, "PodDisruptionBudget", "m-plain")
    assert selects(budget["spec"]["selector"]["matchLabels"], pod_labels(plain))
    monitor = named(manifests, "PodMonitor", "m-plain")
    fleet_monitor = named(manifests, "PodMonitor", "m")
    assert selects(monitor["spec"]["selector"]["matchLabels"], pod_labels(plain))
    assert not selects(fleet_monitor["spec"]["selector"]["matchLabels"], pod_labels(plain))
    [endpoint] = monitor["spec"]["podMetricsEndpoints"]
    assert {"targetLabel": "pool", "sourceLabels": [
        "__meta_kubernetes_pod_label_specfleet_dev_pool"
    ]} in endpoint["relabelings"]  # fmt: skip
    assert [m["metadata"]["name"] for m in manifests if m["kind"] == "ServiceMonitor"] == ["m"]


def test_one_plain_pod_at_most_has_no_budget() -> None:
    manifests = render(specmodel(plainPool={"maxReplicas": 1}), ROUTED)
    budgets = [m["metadata"]["name"] for m in manifests if m["kind"] == "PodDisruptionBudget"]
    assert budgets == ["m"]


def test_the_fleets_and_a_rollouts_gateways_route_the_routed_classes_to_the_plain_service() -> None:
    config = specmodel().engine_config().model_copy(update={"speculative": None})
    step = RolloutCanary(revision=2, pods=1, engine_config=config)
    manifests = render(specmodel(), ROUTED.model_copy(update={"rollout": step}))
    route = {"url": "http://m-plain.ns.svc:80", "classes": ["code"]}
    assert gateway_config(manifests, "m")["plainPool"] == route
    assert gateway_config(manifests, "m-rollout")["plainPool"] == route


def test_a_warm_pool_routes_nothing_until_told() -> None:
    manifests = render(specmodel(), ServingPlan(plain=PlainPool(replicas=1)))
    assert named(manifests, "Deployment", "m-plain")["spec"]["replicas"] == 1
    assert "plainPool" not in gateway_config(manifests, "m")
