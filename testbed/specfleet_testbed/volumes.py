"""ConfigMap volumes for the stand-in kubelet, kept in sync as a kubelet keeps them (the gateway
reloads its config when its file changes), with the cluster DNS and kube-proxy the local cluster
lacks folded in: a Service URL in a ConfigMap (`http://NAME.NAMESPACE.svc:PORT`) is written as
the address of one of that Service's Ready pods at the port the Service targets. An experiment's
mirror reaches its arms this way; a Service with no Ready pod is left as it is (unreachable)."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client

log = logging.getLogger(__name__)
SERVICE_URL = re.compile(
    r"http://(?P<name>[a-z0-9-]+)\.(?P<namespace>[a-z0-9-]+)\.svc(?:\.cluster\.local)?:(?P<port>\d+)"
)


@dataclass(frozen=True)
class ConfigMapVolume:
    config_map: str
    local: Path


class Volumes:
    def __init__(self, core: client.CoreV1Api) -> None:
        self._core = core

    def write(self, namespace: str, volume: ConfigMapVolume) -> bool:
        """Writes the ConfigMap's keys that differ from the local files; True if any did."""
        config_map = self._core.read_namespaced_config_map(volume.config_map, namespace)
        volume.local.mkdir(parents=True, exist_ok=True)
        changed = False
        for key, value in (config_map.data or {}).items():
            text = self.resolve(value)
            path = volume.local / key
            if not path.exists() or path.read_text() != text:
                partial = path.with_name(f".{key}.partial")
                partial.write_text(text)
                partial.replace(path)  # atomic: the gateway never reads half a config
                changed = True
        return changed

    def resolve(self, text: str) -> str:
        """`text` with each Service URL in it as the address of one of its Ready pods."""
        return SERVICE_URL.sub(self._resolve, text)

    def _resolve(self, match: re.Match[str]) -> str:
        name, namespace, port = match["name"], match["namespace"], int(match["port"])
        serialize = self._core.api_client.sanitize_for_serialization
        try:
            service = serialize(self._core.read_namespaced_service(name, namespace))
        except client.ApiException:
            return match[0]
        selector = ",".join(f"{k}={v}" for k, v in service["spec"].get("selector", {}).items())
        pods = self._core.list_namespaced_pod(namespace, label_selector=selector).items
        for pod in map(serialize, pods):
            target = _target_port(service, port, pod)
            if _ready(pod) and target is not None:
                return f"http://{pod['status']['podIP']}:{target}"
        return match[0]


def _target_port(service: dict[str, Any], port: int, pod: dict[str, Any]) -> int | None:
    found = next((p for p in service["spec"]["ports"] if p["port"] == port), None)
    if found is None:
        return None
    target = found.get("targetPort", port)
    if isinstance(target, int) or str(target).isdigit():
        return int(target)
    ports = [p for c in pod["spec"]["containers"] for p in c.get("ports", [])]
    return next((p["containerPort"] for p in ports if p.get("name") == target), None)


def _ready(pod: dict[str, Any]) -> bool:
    status = pod.get("status", {})
    conditions = {c["type"]: c["status"] for c in status.get("conditions", [])}
    return bool(status.get("podIP")) and conditions.get("Ready") == "True"
