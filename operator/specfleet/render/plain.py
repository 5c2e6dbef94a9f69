"""The plain pool's children (`<name>-plain`): the active revision's engines without any
speculative config, a Service in front of their engine port for the fleet's gateways, a budget
and the engines' PodMonitor. No gateway runs there: the fleet's gateway that classified a
request measures it, labelled with the pool that served it."""

from __future__ import annotations

from specfleet.render.workload import (
    PLAIN_SERVICE_PORT,
    Manifest,
    Workload,
    deployment,
    engine_configmap,
    pod_disruption_budget,
    pod_monitor,
)


def plain_pool(workload: Workload) -> list[Manifest]:
    objects = [engine_configmap(workload)] if workload.launch.config_files else []
    objects += [deployment(workload), service(workload)]
    spec = workload.specmodel.spec
    if (spec.plain_pool.max_replicas or spec.pod.replicas) >= 2:
        objects.append(pod_disruption_budget(workload))
    if spec.monitoring.service_monitor:
        objects.append(pod_monitor(workload))
    return objects


def service(workload: Workload) -> Manifest:
    port = {"name": "http", "port": PLAIN_SERVICE_PORT, "targetPort": "engine", "protocol": "TCP"}
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": workload.metadata(workload.deployment_name),
        "spec": {"selector": workload.selector(), "ports": [port]},
    }
