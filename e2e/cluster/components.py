"""The processes of the local cluster, in start order, with their command lines and configs."""

from __future__ import annotations

import copy
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from string import Template

import yaml

from e2e.cluster import pki, pod_ranges
from e2e.cluster.procs import Daemon
from specfleet.experiment.capacity_job import CAPACITY_APP

TEMPLATES = Path(__file__).parent / "templates"
# No kube-proxy runs: ClusterIPs route nowhere, so keep them on loopback like everything else.
SERVICE_CIDR = "127.96.0.0/16"
GPU_PRODUCTS = (("NVIDIA-H100-80GB-HBM3", 81559), ("NVIDIA-A100-SXM4-80GB", 81920))
MONITORING = ("webhook", "alertmanager", "prometheus")


@dataclass(frozen=True)
class Ports:
    etcd: int
    etcd_peer: int
    apiserver: int
    controller_manager: int
    scheduler: int
    kwok: int
    prometheus: int
    alertmanager: int
    webhook: int


@dataclass(frozen=True)
class Layout:
    """Where one local cluster keeps its state, and the binaries it runs."""

    state: Path
    bin_dir: Path
    ports: Ports
    pod_range: int = pod_ranges.LEGACY
    """N of the loopback range 127.N.0.0/16 this cluster's pods get, one per running cluster on
    the host (pod_ranges): node i has podCIDR 127.N.i.0/24, addresses a local process can bind."""

    @property
    def pod_prefix(self) -> str:
        return pod_ranges.prefix(self.pod_range)

    @property
    def pki_dir(self) -> Path:
        return self.state / "pki"

    @property
    def api_server_url(self) -> str:
        return f"https://127.0.0.1:{self.ports.apiserver}"

    @property
    def rules_dir(self) -> Path:
        return self.state / "prometheus-rules"

    def kubeconfig(self, identity: pki.Identity) -> Path:
        return self.state / f"{identity.name}.kubeconfig"

    def render(self, template: str, **values: object) -> Path:
        """Fills templates/<template> with `values` into the state dir; returns the file."""
        return self.write_config(template, fill(template, **values))

    def write_config(self, name: str, text: str) -> Path:
        out = self.state / "config" / name
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        return out


def fill(template: str, **values: object) -> str:
    return Template((TEMPLATES / template).read_text()).substitute(values)


def etcd(layout: Layout) -> Daemon:
    client = f"http://127.0.0.1:{layout.ports.etcd}"
    peer = f"http://127.0.0.1:{layout.ports.etcd_peer}"
    return Daemon(
        "etcd",
        [
            str(layout.bin_dir / "etcd"),
            "--name=e2e",
            f"--data-dir={layout.state / 'etcd'}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=e2e={peer}",
            "--auto-compaction-retention=1",
            "--quota-backend-bytes=2147483648",
        ],
    )


def apiserver(layout: Layout) -> Daemon:
    p = layout.pki_dir
    return Daemon(
        "kube-apiserver",
        [
            str(layout.bin_dir / "kube-apiserver"),
            f"--etcd-servers=http://127.0.0.1:{layout.ports.etcd}",
            "--bind-address=127.0.0.1",
            f"--secure-port={layout.ports.apiserver}",
            "--advertise-address=127.0.0.1",
            "--endpoint-reconciler-type=none",
            f"--tls-cert-file={p / 'apiserver.crt'}",
            f"--tls-private-key-file={p / 'apiserver.key'}",
            f"--client-ca-file={p / 'ca.crt'}",
            f"--service-account-key-file={p / 'sa.pub'}",
            f"--service-account-signing-key-file={p / 'sa.key'}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--authorization-mode=RBAC",
            "--allow-privileged=true",
        ],
    )


def controller_manager(layout: Layout) -> Daemon:
    p = layout.pki_dir
    return Daemon(
        "kube-controller-manager",
        [
            str(layout.bin_dir / "kube-controller-manager"),
            f"--kubeconfig={layout.kubeconfig(pki.CONTROLLER_MANAGER)}",
            "--bind-address=127.0.0.1",
            f"--secure-port={layout.ports.controller_manager}",
            "--leader-elect=false",
            "--use-service-account-credentials=true",
            f"--service-account-private-key-file={p / 'sa.key'}",
            f"--root-ca-file={p / 'ca.crt'}",
            "--kube-api-qps=100",
            "--kube-api-burst=200",
            # Slack for kwok's node heartbeats on a busy 2-core machine: a node judged
            # unresponsive gets its pods marked NotReady, which kwok never undoes.
            "--node-monitor-grace-period=5m",
            # kwok's pod IPs are loopback addresses, which Endpoints and EndpointSlices reject:
            # these controllers only retried failing writes and posted warning Events (40% of
            # the API server's requests with 300 SpecModels). Nothing here reads endpoints:
            # Prometheus discovers pods, the traffic generator follows Ready pods.
            "--controllers=*,-endpoints-controller,-endpointslice-controller,"
            "-endpointslice-mirroring-controller",
        ],
    )


def scheduler(layout: Layout) -> Daemon:
    return Daemon(
        "kube-scheduler",
        [
            str(layout.bin_dir / "kube-scheduler"),
            f"--kubeconfig={layout.kubeconfig(pki.SCHEDULER)}",
            "--bind-address=127.0.0.1",
            f"--secure-port={layout.ports.scheduler}",
            "--leader-elect=false",
            "--kube-api-qps=100",
            "--kube-api-burst=200",
        ],
    )


def kwok(layout: Layout) -> Daemon:
    return Daemon(
        "kwok",
        [
            str(layout.bin_dir / "kwok"),
            f"--kubeconfig={layout.kubeconfig(pki.ADMIN)}",
            f"--config={kwok_stages(layout)}",
            # Renew node leases (the heartbeat stage in use expects them); without leases the
            # node lifecycle controller judges the fake nodes unresponsive every few minutes.
            "--node-lease-duration-seconds=40",
            "--manage-all-nodes=false",
            "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
            "--node-ip=127.0.0.1",
            f"--server-address=127.0.0.1:{layout.ports.kwok}",
            f"--cidr={layout.pod_prefix}.255.0/24",
        ],
    )


MANAGED_BY = '.metadata.labels."app.kubernetes.io/managed-by"'
APP_NAME = '.metadata.labels."app.kubernetes.io/name"'
POOL = '.metadata.labels."specfleet.dev/pool"'
"""The plain pool's pods: specfleet's too, without managed-by."""


def kwok_stages(layout: Layout) -> Path:
    """kwok's default stages, except that specfleet's pods (the plain pool's too, which carry no
    managed-by) start Running but not Ready: the stand-in kubelet (`specfleet-testbed pods`)
    marks them Ready when their engine answers /health, as a readiness probe would, so rollouts
    wait for real processes like on a real cluster; and it, not kwok, ends an experiment's load
    tests, when their command has run."""
    stages = list(yaml.safe_load_all((layout.bin_dir / "kwok-stages.yaml").read_text()))
    [ready] = [s for s in stages if s and s["metadata"]["name"] == "pod-ready"]
    [complete] = [s for s in stages if s and s["metadata"]["name"] == "pod-complete"]
    complete["spec"]["selector"]["matchExpressions"].append(
        {"key": APP_NAME, "operator": "NotIn", "values": [CAPACITY_APP]}
    )
    base = copy.deepcopy(ready)
    template = base["spec"]["next"]["statusTemplate"]
    for kind in ("Ready", "ContainersReady"):
        template = re.sub(
            rf'status: "True"(\s+)type: {kind}\b', rf'status: "False"\1type: {kind}', template
        )
    template = template.replace("ready: true", "ready: false", 1)
    starting = []
    for label, value in ((MANAGED_BY, "specfleet"), (POOL, "plain")):
        ready["spec"]["selector"]["matchExpressions"].append(
            {"key": label, "operator": "NotIn", "values": [value]}
        )
        stage = copy.deepcopy(base)
        stage["metadata"]["name"] = f"specfleet-{value}-pod-starting"
        stage["spec"]["selector"]["matchExpressions"].append(
            {"key": label, "operator": "In", "values": [value]}
        )
        stage["spec"]["next"]["statusTemplate"] = template
        starting.append(stage)
    return layout.write_config("kwok-stages.yaml", yaml.safe_dump_all([*stages, *starting]))


def webhook(layout: Layout) -> Daemon:
    return Daemon(
        "webhook",
        [
            sys.executable,
            str(Path(__file__).parent / "webhook.py"),
            f"--listen=127.0.0.1:{layout.ports.webhook}",
            f"--out={webhook_log(layout)}",
        ],
    )


def webhook_log(layout: Layout) -> Path:
    return layout.state / "webhook" / "notifications.jsonl"


def alertmanager(layout: Layout) -> Daemon:
    config = layout.render("alertmanager.yml", webhook_port=layout.ports.webhook)
    return Daemon(
        "alertmanager",
        [
            str(layout.bin_dir / "alertmanager"),
            f"--config.file={config}",
            f"--storage.path={layout.state / 'alertmanager'}",
            f"--web.listen-address=127.0.0.1:{layout.ports.alertmanager}",
            "--cluster.listen-address=",
        ],
    )


def prometheus(layout: Layout) -> Daemon:
    layout.rules_dir.mkdir(parents=True, exist_ok=True)
    config = layout.render(
        "prometheus.yml",
        alertmanager_port=layout.ports.alertmanager,
        rules_dir=layout.rules_dir,
        api_server_url=layout.api_server_url,
        pki=layout.pki_dir,
    )
    return Daemon(
        "prometheus",
        [
            str(layout.bin_dir / "prometheus"),
            f"--config.file={config}",
            f"--storage.tsdb.path={layout.state / 'prometheus'}",
            f"--web.listen-address=127.0.0.1:{layout.ports.prometheus}",
            "--web.enable-lifecycle",
            "--storage.tsdb.retention.time=1d",
        ],
    )


def nodes_manifest(layout: Layout, count: int) -> Path:
    """Fake GPU nodes kwok-gpu-0..count-1: every 4th one an A100, the others H100s."""
    docs = []
    for index in range(count):
        product, memory_mib = GPU_PRODUCTS[1 if index % 4 == 3 else 0]
        docs.append(
            fill(
                "node.yaml",
                name=f"kwok-gpu-{index}",
                gpu_product=product,
                gpu_memory_mib=memory_mib,
                pod_cidr=f"{layout.pod_prefix}.{index}.0/24",
            )
        )
    return layout.write_config("nodes.yaml", "---\n".join(docs))
