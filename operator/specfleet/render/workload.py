"""The Kubernetes objects of one SpecModel: Deployment (engine + gateway sidecar), Service,
ConfigMaps, PodDisruptionBudget, an optional ServiceMonitor (the gateways) and PodMonitor (the
engines), during a trial the canary's Deployment and ConfigMaps, and during a canary rollout the
new revision's (`<name>-rollout`), and while classes are routed off speculation the plain pool
(`<name>-plain`, `render.plain`). Pure: data in, data out.

The Service exposes the gateway only: inference that bypassed it would never be measured, so
the engine's port is scraped from the pods, never served.

The canaries' pods carry `app.kubernetes.io/name: specfleet-engine-canary` (a trial's) or
`specfleet-engine-rollout` (a rollout's), so the fleet's
Deployment selector (immutable, unchanged since the first release) and its PodDisruptionBudget
never match them, and no ReplicaSet of the fleet can adopt them. The Service selects every pod
that serves the SpecModel by `app.kubernetes.io/instance` and `app.kubernetes.io/managed-by`,
labels the fleet's pods already carry: switching an existing Service to it drops no endpoint
and rolls no pod."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from enum import Enum
from typing import Any

import yaml

from specfleet import series
from specfleet.api.base import (
    CANARY_SUFFIX,
    PLAIN_SUFFIX,
    ROLLOUT_SUFFIX,
    SCRAPE_INTERVAL_SECONDS,
)
from specfleet.api.gateway import GatewayConfig, PlainRoute
from specfleet.api.model import EngineConfig, SpecModel
from specfleet.api.spec import PodSpec
from specfleet.render.engine import ENGINE_CONFIG_PATH, ENGINE_PORT, MODEL_CACHE_PATH, EngineLaunch
from specfleet.render.labels import (
    INSTANCE,
    MANAGED,
    MANAGED_BY,
    managed_labels,
    owner_reference,
)
from specfleet.render.plan import RenderSettings, ServingPlan

Manifest = dict[str, Any]

GATEWAY_PORT = 8080
GATEWAY_METRICS_PORT = 9090
PLAIN_SERVICE_PORT = 80
GATEWAY_CONFIG_PATH = "/etc/specfleet/gateway"
STARTUP_BUDGET_SECONDS = 1800
PRE_STOP_SECONDS = 10
"""How long a stopping pod keeps serving before SIGTERM, while endpoints drop it."""
DRAIN_MARGIN_SECONDS = 5
REVISION_LABEL = "specfleet.dev/revision"
SPECULATION_LABEL = "specfleet.dev/speculation"
POOL_LABEL = "specfleet.dev/pool"
"""On the plain pool's pods (`plain`); the fleet's carry none, so adding it rolled no pod."""
ENGINE_METRICS_PATH_ANNOTATION = "specfleet.dev/engine-metrics-path"
ENGINE_CONFIG_HASH_ANNOTATION = "specfleet.dev/engine-config-hash"
REVISION_HASH_ANNOTATION = "specfleet.dev/revision-hash"
ENGINE_APP = "specfleet-engine"
CANARY_APP = "specfleet-engine-canary"
ROLLOUT_APP = "specfleet-engine-rollout"
ARM_APP = "specfleet-engine-arm"
PLAIN_APP = "specfleet-engine-plain"
EXPERIMENT_LABEL = "specfleet.dev/experiment"
ARM_LABEL = "specfleet.dev/arm"


class Role(Enum):
    """Which pods a Deployment runs: (its name's suffix, its pods' app name)."""

    FLEET = ("", ENGINE_APP)
    TRIAL = (CANARY_SUFFIX, CANARY_APP)
    """A trial's canary: one pod, with speculation."""
    ROLLOUT = (ROLLOUT_SUFFIX, ROLLOUT_APP)
    """A rollout's canary: the new revision on the step's pods."""
    ARM = ("", ARM_APP)
    """An experiment's arm: its own SpecModel-shaped workload, named `<experiment>-<arm>`."""
    PLAIN = (PLAIN_SUFFIX, PLAIN_APP)
    """The plain pool: engines only, without speculation; the fleet's gateways, which route
    classes to it, measure what it serves."""


@dataclass(frozen=True)
class ArmOf:
    """Whose arm a workload is: its pods carry the experiment's and the arm's names instead of
    `app.kubernetes.io/instance`, so no SpecModel's selectors match them."""

    experiment: str
    arm: str
    owner: dict[str, Any]
    """The SpecExperiment's owner reference."""


@dataclass(frozen=True)
class Workload:
    """Everything the workload renderer needs, resolved."""

    specmodel: SpecModel
    plan: ServingPlan
    config: EngineConfig
    """The active revision's engine config."""
    revision_hash: str
    launch: EngineLaunch
    settings: RenderSettings
    role: Role = Role.FLEET
    arm: ArmOf | None = None

    @property
    def name(self) -> str:
        return self.specmodel.metadata.name

    @property
    def namespace(self) -> str:
        return self.specmodel.metadata.namespace

    @property
    def deployment_name(self) -> str:
        """Names the Deployment and the ConfigMaps its pods mount."""
        return f"{self.name}{self.role.value[0]}"

    @property
    def replicas(self) -> int:
        """The pod count stays pod.replicas during a rollout: the fleet gives the canary its."""
        rollout = self.plan.rollout
        if self.role == Role.TRIAL:
            return 1
        if self.role == Role.PLAIN and self.plan.plain is not None:
            return self.plan.plain.replicas
        if self.role == Role.ROLLOUT and rollout is not None:
            return rollout.pods
        replicas = self.specmodel.spec.pod.replicas
        return replicas - rollout.pods if rollout is not None else replicas

    def selector(self) -> dict[str, str]:
        """The Deployment's own pods: the fleet's, the canaries' and the arms' never overlap."""
        app = {"app.kubernetes.io/name": self.role.value[1]}
        if self.arm is not None:
            return {**app, EXPERIMENT_LABEL: self.arm.experiment, ARM_LABEL: self.arm.arm}
        return {**app, INSTANCE: self.name}

    def serving_selector(self) -> dict[str, str]:
        """Every pod that serves the SpecModel's clients: the fleet's and the canaries'; an
        arm's own; the plain pool's own (its clients are the fleet's gateways)."""
        if self.arm is not None or self.role == Role.PLAIN:
            return self.selector()
        return managed_labels(self.name)

    def labels(self) -> dict[str, str]:
        return {
            **self.settings.extra_labels,
            **self.selector(),
            **MANAGED,
        }

    def pod_labels(self) -> dict[str, str]:
        speculation = self.plan.speculation and self.config.speculative is not None
        labels = {
            **self.labels(),
            REVISION_LABEL: str(self.plan.revision),
            SPECULATION_LABEL: series.speculation_value(speculation),
        }
        if self.role == Role.PLAIN:
            # Without managed-by the SpecModel's Service and engine PodMonitor, which select
            # on it, leave its pods alone: they have no gateway to measure clients there.
            del labels[MANAGED_BY]
            labels[POOL_LABEL] = series.PLAIN_POOL
        return labels

    def metadata(self, name: str) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": name, "namespace": self.namespace, "labels": self.labels()}
        if self.arm is not None:
            meta["ownerReferences"] = [self.arm.owner]
        elif self.specmodel.metadata.uid:
            meta["ownerReferences"] = [owner_reference(self.specmodel)]
        return meta


def canary_name(specmodel: str) -> str:
    return f"{specmodel}{CANARY_SUFFIX}"


def rollout_name(specmodel: str) -> str:
    return f"{specmodel}{ROLLOUT_SUFFIX}"


def plain_name(specmodel: str) -> str:
    return f"{specmodel}{PLAIN_SUFFIX}"


def manifests(workload: Workload) -> list[Manifest]:
    objects = [*deployment_and_configs(workload), service(workload)]
    if workload.specmodel.spec.pod.replicas >= 2:
        objects.append(pod_disruption_budget(workload))
    return objects + monitors(workload)


def monitors(workload: Workload) -> list[Manifest]:
    """The ServiceMonitor and PodMonitor of the workload's pods, when the spec asks for them."""
    if not workload.specmodel.spec.monitoring.service_monitor:
        return []
    return [service_monitor(workload), pod_monitor(workload)]


def deployment_and_configs(workload: Workload) -> list[Manifest]:
    """The Deployment and the ConfigMaps its pods mount: all a canary needs of its own."""
    objects = [gateway_configmap(workload)]
    if workload.launch.config_files:
        objects.append(engine_configmap(workload))
    return [*objects, deployment(workload)]


def gateway_config(workload: Workload) -> GatewayConfig:
    running = workload.config.speculative if workload.plan.speculation else None
    drafting = workload.launch.drafting
    config = GatewayConfig.from_specmodel(workload.specmodel, running, drafting)
    if workload.role in (Role.FLEET, Role.ROLLOUT):
        config = config.model_copy(update={"plain_pool": plain_route(workload)})
    if workload.role == Role.FLEET:  # the fleet's clients are the sample, not a canary's
        config = config.model_copy(update={"mirror": workload.plan.mirror})
    return config


def plain_route(workload: Workload) -> PlainRoute | None:
    """Where the gateways send the classes routed off speculation: the plain pool's Service."""
    plain = workload.plan.plain
    if plain is None or not plain.routed:
        return None
    url = f"http://{plain_name(workload.name)}.{workload.namespace}.svc:{PLAIN_SERVICE_PORT}"
    return PlainRoute(url=url, classes=plain.routed, trial=plain.trial)


def gateway_configmap(workload: Workload) -> Manifest:
    wire = gateway_config(workload).to_wire()
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": workload.metadata(f"{workload.deployment_name}-gateway"),
        "data": {"gateway.yaml": yaml.safe_dump(wire, sort_keys=True)},
    }


def engine_configmap(workload: Workload) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": workload.metadata(f"{workload.deployment_name}-engine"),
        "data": dict(workload.launch.config_files),
    }


def deployment(workload: Workload) -> Manifest:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": workload.metadata(workload.deployment_name),
        "spec": {
            "replicas": workload.replicas,
            "revisionHistoryLimit": 3,
            "progressDeadlineSeconds": STARTUP_BUDGET_SECONDS + 600,
            "selector": {"matchLabels": workload.selector()},
            # maxUnavailable 0: a kill-switch flip or rollback never drops serving capacity.
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
            },
            "template": {
                "metadata": {
                    "labels": workload.pod_labels(),
                    "annotations": pod_annotations(workload),
                },
                "spec": pod_spec(workload),
            },
        },
    }


def pod_annotations(workload: Workload) -> dict[str, str]:
    annotations = dict(workload.specmodel.spec.pod.annotations or {})
    annotations[REVISION_HASH_ANNOTATION] = workload.revision_hash
    annotations[ENGINE_METRICS_PATH_ANNOTATION] = workload.launch.metrics_path
    if workload.launch.config_files:
        files = yaml.safe_dump(workload.launch.config_files, sort_keys=True)
        annotations[ENGINE_CONFIG_HASH_ANNOTATION] = hashlib.sha256(files.encode()).hexdigest()[:16]
    return annotations


def pod_spec(workload: Workload) -> dict[str, Any]:
    pod = workload.specmodel.spec.pod
    spec: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
        "terminationGracePeriodSeconds": pod.termination_grace_period_seconds,
        "containers": [engine_container(workload), *gateway_containers(workload)],
        "volumes": volumes(workload),
        "tolerations": [
            {"key": pod.gpu.resource_name, "operator": "Exists", "effect": "NoSchedule"},
            *(pod.tolerations or []),
        ],
    }
    node_selector = node_selector_of(pod)
    if node_selector:
        spec["nodeSelector"] = node_selector
    if pod.affinity:
        spec["affinity"] = pod.affinity
    if pod.priority_class_name:
        spec["priorityClassName"] = pod.priority_class_name
    return spec


def node_selector_of(pod: PodSpec) -> dict[str, str]:
    selector = dict(pod.node_selector or {})
    if pod.gpu.product:
        selector["nvidia.com/gpu.product"] = pod.gpu.product
    return selector


def engine_container(workload: Workload) -> dict[str, Any]:
    launch = workload.launch
    container: dict[str, Any] = {"name": "engine", "image": launch.image}
    if launch.command:
        container["command"] = launch.command
    drain = [launch.drain_flag, str(drain_seconds(workload))] if launch.drain_flag else []
    container |= {
        "args": launch.args + drain,
        "env": engine_env(workload),
        "ports": [{"name": "engine", "containerPort": ENGINE_PORT, "protocol": "TCP"}],
        "resources": engine_resources(workload),
        "volumeMounts": engine_mounts(workload),
        "startupProbe": http_probe(
            launch.startup_path, period=10, failures=STARTUP_BUDGET_SECONDS // 10
        ),
        "readinessProbe": http_probe("/health", period=5, failures=3, timeout=5),
        "livenessProbe": http_probe("/health", period=15, failures=4, timeout=5),
        # Give endpoints time to drop the pod before the engine stops taking requests.
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(PRE_STOP_SECONDS)]}}},
        # The engine images run as root and write caches under $HOME and /tmp: no
        # runAsNonRoot and no read-only root filesystem, but root without capabilities.
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    return container


def http_probe(path: str, period: int, failures: int, timeout: int = 3) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": "engine"},
        "periodSeconds": period,
        "failureThreshold": failures,
        "timeoutSeconds": timeout,
    }


def engine_env(workload: Workload) -> list[dict[str, Any]]:
    model = workload.config.model
    env: list[dict[str, Any]] = []
    if model.cache:
        env.append({"name": "HF_HOME", "value": f"{MODEL_CACHE_PATH}/hf"})
    if model.hf_token_secret:
        ref = {"name": model.hf_token_secret.name, "key": model.hf_token_secret.key}
        env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": ref}})
    return env + list(workload.launch.env) + list(workload.config.engine.extra_env)


def engine_resources(workload: Workload) -> dict[str, Any]:
    pod = workload.specmodel.spec.pod
    gpus = str(pod.gpu.count or workload.config.model.tensor_parallel_size)
    extra = pod.resources or {}
    return {
        "requests": {**extra.get("requests", {}), pod.gpu.resource_name: gpus},
        "limits": {**extra.get("limits", {}), pod.gpu.resource_name: gpus},
    }


def engine_mounts(workload: Workload) -> list[dict[str, Any]]:
    mounts: list[dict[str, Any]] = [{"name": "dshm", "mountPath": "/dev/shm"}]
    if workload.config.model.cache:
        mounts.append({"name": "model-cache", "mountPath": MODEL_CACHE_PATH})
    if workload.launch.config_files:
        mounts.append({"name": "engine-config", "mountPath": ENGINE_CONFIG_PATH, "readOnly": True})
    return mounts


def volumes(workload: Workload) -> list[dict[str, Any]]:
    pod = workload.specmodel.spec.pod
    result: list[dict[str, Any]] = [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": pod.shm_size_limit}}
    ]
    if workload.role != Role.PLAIN:
        gateway = {"name": f"{workload.deployment_name}-gateway"}
        result.append({"name": "gateway-config", "configMap": gateway})
    cache = workload.config.model.cache
    if cache and cache.persistent_volume_claim:
        claim = {"claimName": cache.persistent_volume_claim}
        result.append({"name": "model-cache", "persistentVolumeClaim": claim})
    elif cache:
        result.append(
            {"name": "model-cache", "emptyDir": {"sizeLimit": cache.empty_dir_size_limit}}
        )
    if workload.launch.config_files:
        engine_cm = {"name": f"{workload.deployment_name}-engine"}
        result.append({"name": "engine-config", "configMap": engine_cm})
    return result


def drain_seconds(workload: Workload) -> int:
    """How long the gateway lets streams finish after SIGTERM: what the pod's grace leaves after
    the preStop, less a margin to close its connections before the kubelet kills it."""
    grace = workload.specmodel.spec.pod.termination_grace_period_seconds
    return max(0, grace - PRE_STOP_SECONDS - DRAIN_MARGIN_SECONDS)


def gateway_containers(workload: Workload) -> list[dict[str, Any]]:
    return [] if workload.role == Role.PLAIN else [gateway_container(workload)]


def gateway_container(workload: Workload) -> dict[str, Any]:
    return {
        "name": "gateway",
        "image": workload.settings.gateway_image,
        "args": [
            "gateway",
            "--upstream",
            f"http://127.0.0.1:{ENGINE_PORT}",
            "--listen",
            f"0.0.0.0:{GATEWAY_PORT}",
            "--metrics-listen",
            f"0.0.0.0:{GATEWAY_METRICS_PORT}",
            "--config",
            f"{GATEWAY_CONFIG_PATH}/gateway.yaml",
            "--shutdown-grace",
            str(drain_seconds(workload)),
        ],
        "ports": [
            {"name": "http", "containerPort": GATEWAY_PORT, "protocol": "TCP"},
            {"name": "metrics", "containerPort": GATEWAY_METRICS_PORT, "protocol": "TCP"},
        ],
        "readinessProbe": {
            "httpGet": {"path": "/healthz", "port": "metrics"},
            "periodSeconds": 5,
        },
        "livenessProbe": {
            "httpGet": {"path": "/healthz", "port": "metrics"},
            "periodSeconds": 15,
            "failureThreshold": 4,
        },
        # Keep proxying while endpoints drop the pod; in-flight streams then drain on SIGTERM.
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(PRE_STOP_SECONDS)]}}},
        "resources": {
            "requests": {"cpu": "250m", "memory": "128Mi"},
            "limits": {"memory": "512Mi"},
        },
        "securityContext": non_root_read_only(),
        "volumeMounts": [
            {"name": "gateway-config", "mountPath": GATEWAY_CONFIG_PATH, "readOnly": True}
        ],
    }


def non_root_read_only() -> dict[str, Any]:
    """The security context of a specfleet container (the gateway's, a load test's)."""
    return {
        "runAsNonRoot": True,
        "runAsUser": 65532,
        "readOnlyRootFilesystem": True,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }


def service(workload: Workload) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": workload.metadata(workload.name),
        "spec": {
            "selector": workload.serving_selector(),
            "ports": [
                {"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"},
                {"name": "metrics", "port": GATEWAY_METRICS_PORT, "targetPort": "metrics"},
            ],
        },
    }


def pod_disruption_budget(workload: Workload) -> Manifest:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": workload.metadata(workload.deployment_name),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": workload.selector()}},
    }


def pod_relabelings() -> list[dict[str, Any]]:
    """The pod labels telemetry reads as series labels."""
    return [
        {"sourceLabels": [_discovered(label)], "targetLabel": target}
        for label, target in (
            (INSTANCE, series.SPECMODEL),
            (REVISION_LABEL, series.REVISION),
            (SPECULATION_LABEL, series.SPECULATION),
            (EXPERIMENT_LABEL, series.EXPERIMENT),
            (ARM_LABEL, series.ARM),
            (POOL_LABEL, series.POOL),
        )
    ]


def _discovered(label: str) -> str:
    """A pod label as Prometheus's Kubernetes discovery names it."""
    return "__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", label)


SCRAPE_INTERVAL = f"{SCRAPE_INTERVAL_SECONDS}s"
"""The interval admission's window rule assumes when a ServiceMonitor is rendered."""


def service_monitor(workload: Workload) -> Manifest:
    """The gateways' per-class series, through the Service's `metrics` port."""
    endpoint = {"port": "metrics", "interval": SCRAPE_INTERVAL, "relabelings": pod_relabelings()}
    spec = {"selector": {"matchLabels": workload.selector()}, "endpoints": [endpoint]}
    return prometheus_operator_object(workload, "ServiceMonitor", spec)


def pod_monitor(workload: Workload) -> Manifest:
    """The engines' own series, from the container port `engine` of every serving pod."""
    endpoint = {
        "port": "engine",
        "path": workload.launch.metrics_path,
        "interval": SCRAPE_INTERVAL,
        "relabelings": pod_relabelings(),
    }
    spec = {
        "selector": {"matchLabels": workload.serving_selector()},
        "podMetricsEndpoints": [endpoint],
    }
    return prometheus_operator_object(workload, "PodMonitor", spec)


def prometheus_operator_object(workload: Workload, kind: str, spec: Manifest) -> Manifest:
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": kind,
        "metadata": workload.metadata(workload.deployment_name),
        "spec": spec,
    }
