"""The local e2e cluster: bring it up (idempotently), tear it down, and the API tests use.

CLI: python -m e2e.cluster.harness up|down|status   (run from the repo root; see e2e/README.md)
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from e2e.cluster import components, health, pki, pod_ranges, procs
from e2e.cluster.components import Layout, Ports
from e2e.cluster.webhook import read_notifications

REPO = Path(__file__).resolve().parents[2]
INSTALL = REPO / "e2e" / "cluster" / "install.sh"
DEFAULT_NODES = 4
CONTROL_PLANE = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
PROCESSES = CONTROL_PLANE + components.MONITORING
DAEMONS = {
    "etcd": components.etcd,
    "kube-apiserver": components.apiserver,
    "kube-controller-manager": components.controller_manager,
    "kube-scheduler": components.scheduler,
    "kwok": components.kwok,
    "webhook": components.webhook,
    "alertmanager": components.alertmanager,
    "prometheus": components.prometheus,
}


class KubectlError(subprocess.CalledProcessError):
    def __str__(self) -> str:
        return f"kubectl {' '.join(self.cmd[1:])} failed ({self.returncode}): {self.stderr}"


@dataclass(frozen=True, kw_only=True)
class Cluster:
    """Any cluster the e2e tests run against: local, or another one given by a kubeconfig."""

    kubeconfig: Path
    kubectl_bin: str
    prometheus_url: str | None = None
    alertmanager_url: str | None = None

    def run_kubectl(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        """Runs kubectl against this cluster; never raises for a non-zero exit."""
        argv = [self.kubectl_bin, f"--kubeconfig={self.kubeconfig}", *args]
        return subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=120)

    def kubectl(self, *args: str, stdin: str | None = None) -> str:
        """Runs kubectl and returns its stdout; raises KubectlError on failure."""
        done = self.run_kubectl(*args, stdin=stdin)
        if done.returncode != 0:
            raise KubectlError(done.returncode, done.args, done.stdout, done.stderr)
        return done.stdout

    def kubectl_json(self, *args: str) -> Any:
        return json.loads(self.kubectl(*args, "-o", "json"))

    def install_crd(self, kind: str = "specmodel") -> None:
        """Applies the repository's CRD and waits until it is served. `kubectl wait` fails at
        once, rather than waiting, while a new CRD's status holds no conditions yet."""
        self.kubectl("apply", "--server-side", "-f", str(REPO / f"crds/{kind}.yaml"))
        eventually(
            lambda: (
                self.run_kubectl(
                    "wait", "--for=condition=Established", f"crd/{kind}s.specfleet.dev"
                ).returncode
                == 0
            ),
            f"the {kind} CRD to be established",
        )


@dataclass(frozen=True, kw_only=True)
class LocalCluster(Cluster):
    """The cluster this harness runs: its processes, Prometheus, Alertmanager and webhook."""

    layout: Layout
    nodes: int = DEFAULT_NODES

    @property
    def api_server_url(self) -> str:
        return self.layout.api_server_url

    @property
    def webhook_url(self) -> str:
        return f"http://127.0.0.1:{self.layout.ports.webhook}"

    @property
    def rules_dir(self) -> Path:
        """Prometheus loads *.yml / *.yaml rule files from here on reload_prometheus()."""
        return self.layout.rules_dir

    def webhook_alerts(self) -> list[dict[str, Any]]:
        """Every notification Alertmanager sent to the webhook receiver, oldest first."""
        return read_notifications(components.webhook_log(self.layout))

    def stop_prometheus(self) -> None:
        procs.stop(self.layout.state, "prometheus")

    def start_prometheus(self) -> None:
        """Starts Prometheus again on the same port and data dir; returns once it is ready."""
        _start(self.layout, "prometheus")
        _wait_ready(self.layout, ("prometheus",))

    def stop_alertmanager(self) -> None:
        procs.stop(self.layout.state, "alertmanager")

    def start_alertmanager(self) -> None:
        """Starts Alertmanager again on the same port (its alerts, held in memory, are gone);
        returns once it is ready."""
        _start(self.layout, "alertmanager")
        _wait_ready(self.layout, ("alertmanager",))

    def restart_control_plane(self) -> int:
        """Stops the API server and etcd, starts etcd and compacts its whole history, then the
        API server: every watch it served before resumes from a compacted resourceVersion (410
        Gone) and must relist. Returns once the API server is ready; the revision compacted."""
        for name in ("kube-apiserver", "etcd"):
            procs.stop(self.layout.state, name)
        _start(self.layout, "etcd")
        _wait_ready(self.layout, ("etcd",))
        revision = compact_etcd(f"http://127.0.0.1:{self.layout.ports.etcd}")
        _start(self.layout, "kube-apiserver")
        _wait_ready(self.layout, ("kube-apiserver",))
        return revision

    def alertmanager_alerts(self, namespace: str) -> list[dict[str, Any]]:
        """The alerts Alertmanager holds (GET /api/v2/alerts) with label `namespace`."""
        query = urllib.parse.urlencode({"filter": f'namespace="{namespace}"'})
        url = f"{self.alertmanager_url}/api/v2/alerts?{query}"
        with health.opener().open(url, timeout=10) as response:
            alerts: list[dict[str, Any]] = json.loads(response.read())
        return alerts

    def reload_prometheus(self) -> None:
        """Re-reads the config and the rule files (POST /-/reload)."""
        request = urllib.request.Request(f"{self.prometheus_url}/-/reload", method="POST")
        with health.opener().open(request, timeout=10):
            pass


def eventually(condition: Callable[[], object], what: str, timeout_s: float = 60) -> None:
    """Polls `condition` until it returns something truthy; raises TimeoutError naming `what`."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(0.2)


def compact_etcd(url: str) -> int:
    """Compacts etcd (its JSON gateway at `url`) up to its current revision; returns it."""

    def post(path: str, body: dict[str, Any]) -> Any:
        request = urllib.request.Request(f"{url}{path}", json.dumps(body).encode(), method="POST")
        with health.opener().open(request, timeout=10) as response:
            return json.loads(response.read())

    revision = int(post("/v3/kv/range", {"key": "AA=="})["header"]["revision"])
    post("/v3/kv/compaction", {"revision": str(revision), "physical": True})
    return revision


def state_dir() -> Path:
    return Path(os.environ.get("SPECFLEET_E2E_STATE", REPO / "e2e" / ".state"))


def external(kubeconfig: Path) -> Cluster:
    """Another cluster (kind, k3d, a real one); kubectl comes from $KUBECTL or PATH."""
    kubectl = os.environ.get("KUBECTL") or shutil.which("kubectl")
    if kubectl is None:
        kubectl = str(_install() / "kubectl")
    return Cluster(
        kubeconfig=kubeconfig,
        kubectl_bin=kubectl,
        prometheus_url=os.environ.get("SPECFLEET_E2E_PROMETHEUS_URL"),
        alertmanager_url=os.environ.get("SPECFLEET_E2E_ALERTMANAGER_URL"),
    )


def any_running(state: Path | None = None) -> bool:
    """True if some process of the local cluster runs (someone started it)."""
    return any(procs.running_pid(state or state_dir(), name) for name in PROCESSES)


def running(state: Path | None = None) -> LocalCluster | None:
    """The local cluster if every process of it is up and ready, else None."""
    cluster = _load(state or state_dir())
    if cluster is None:
        return None
    probes = health.probes(cluster.layout)
    alive = all(procs.running_pid(cluster.layout.state, name) for name in PROCESSES)
    return cluster if alive and all(probes[name]() for name in PROCESSES) else None


def up(state: Path | None = None, nodes: int | None = None) -> LocalCluster:
    """Starts whatever part of the local cluster is not running; returns once all is ready."""
    state = state or state_dir()
    if (cluster := running(state)) is not None:
        return cluster
    bin_dir = _install()
    saved = _load(state)
    if saved is None:
        _wipe(state, keep_logs=False)
        ports = Ports(*_free_ports(len(Ports.__dataclass_fields__)))
        node_count = nodes or int(os.environ.get("SPECFLEET_E2E_NODES", DEFAULT_NODES))
        pod_range = pod_ranges.claim(state, any_running)
    else:
        ports, node_count = saved.layout.ports, nodes or saved.nodes
        pod_range = saved.layout.pod_range
        pod_ranges.keep(state, pod_range, any_running)
    cluster = _local(Layout(state, bin_dir, ports, pod_range), node_count)
    _save(cluster)
    _start_all(cluster)
    return cluster


def down(state: Path | None = None) -> None:
    """Stops every process the harness started and deletes the state (logs stay)."""
    state = state or state_dir()
    for name in reversed(PROCESSES):
        procs.stop(state, name)
    _wipe(state, keep_logs=True)
    pod_ranges.release(state)


def _start_all(cluster: LocalCluster) -> None:
    layout = cluster.layout
    pki.ensure_pki(layout.pki_dir)
    for identity in pki.IDENTITIES:
        pki.write_kubeconfig(
            layout.kubeconfig(identity), layout.api_server_url, layout.pki_dir, identity
        )
    for name in ("etcd", "kube-apiserver"):
        _start(layout, name)
        _wait_ready(layout, (name,))
    _apply(cluster, layout.render("prometheus-rbac.yaml", user=pki.PROMETHEUS.user))
    _apply(cluster, components.nodes_manifest(layout, cluster.nodes))
    rest = PROCESSES[2:]
    for name in rest:
        _start(layout, name)
    _wait_ready(layout, rest)
    cluster.kubectl("wait", "--for=condition=Ready", "node", "-l", "type=kwok", "--timeout=60s")


def _start(layout: Layout, name: str) -> None:
    if procs.running_pid(layout.state, name) is None:
        procs.start(layout.state, DAEMONS[name](layout))


def _wait_ready(layout: Layout, names: tuple[str, ...]) -> None:
    probes = health.probes(layout)
    for name in names:
        health.wait_until(probes[name], name, procs.log_file(layout.state, name))


def _apply(cluster: Cluster, manifest: Path) -> None:
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(manifest))


def _local(layout: Layout, nodes: int) -> LocalCluster:
    return LocalCluster(
        kubeconfig=layout.kubeconfig(pki.ADMIN),
        kubectl_bin=str(layout.bin_dir / "kubectl"),
        prometheus_url=f"http://127.0.0.1:{layout.ports.prometheus}",
        alertmanager_url=f"http://127.0.0.1:{layout.ports.alertmanager}",
        layout=layout,
        nodes=nodes,
    )


def _install() -> Path:
    done = subprocess.run([str(INSTALL)], check=True, stdout=subprocess.PIPE, text=True)
    return Path(done.stdout.strip().splitlines()[-1])


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _save(cluster: LocalCluster) -> None:
    cluster.layout.state.mkdir(parents=True, exist_ok=True)
    saved = {
        "bin_dir": str(cluster.layout.bin_dir),
        "nodes": cluster.nodes,
        "ports": asdict(cluster.layout.ports),
        "pod_range": cluster.layout.pod_range,
    }
    (cluster.layout.state / "cluster.json").write_text(json.dumps(saved, indent=2) + "\n")


def _load(state: Path) -> LocalCluster | None:
    path = state / "cluster.json"
    if not path.exists():
        return None
    saved = json.loads(path.read_text())
    # Saved before pod ranges were claimed: 127.10, the one range there was.
    pod_range = saved.get("pod_range", pod_ranges.LEGACY)
    layout = Layout(state, Path(saved["bin_dir"]), Ports(**saved["ports"]), pod_range)
    return _local(layout, saved["nodes"])


def _wipe(state: Path, keep_logs: bool) -> None:
    if not state.exists():
        return
    for child in state.iterdir():
        if keep_logs and child.name == "logs":
            continue
        if child.is_dir():
            shutil.rmtree(child)
        else:
            child.unlink()


def _cli_up() -> int:
    started = time.monotonic()
    try:
        cluster = up()
    except pod_ranges.PodRangeTaken as refused:  # nothing started; its state stays as it was
        print(f"cluster-up refused: {refused}", file=sys.stderr)
        return 1
    except Exception as error:
        print(f"cluster-up failed: {error}\nlogs: {state_dir() / 'logs'}", file=sys.stderr)
        down()
        return 1
    print(
        f"cluster ready in {time.monotonic() - started:.1f}s: {cluster.api_server_url}, "
        f"prometheus {cluster.prometheus_url}, alertmanager {cluster.alertmanager_url}, "
        f"pods {cluster.layout.pod_prefix}.0.0/16",
        file=sys.stderr,
    )
    print(cluster.kubeconfig)
    return 0


def _cli_down() -> int:
    down()
    return 0


def _cli_status() -> int:
    cluster = running()
    print(f"running: {cluster.kubeconfig}" if cluster else "not running")
    return 0 if cluster else 1


def main(argv: list[str]) -> int:
    commands = {"up": _cli_up, "down": _cli_down, "status": _cli_status}
    if len(argv) != 1 or argv[0] not in commands:
        print("usage: python -m e2e.cluster.harness up|down|status", file=sys.stderr)
        return 2
    return commands[argv[0]]()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
