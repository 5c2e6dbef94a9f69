"""Runs specfleet's operator for e2e tests: in-process (a kopf thread), or as the chart installs
it (a `specfleet run` process authenticated as the chart's ServiceAccount)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import yaml
from prometheus_client.parser import text_string_to_metric_families

from e2e.cluster.harness import Cluster, eventually
from specfleet.controller.metrics import REGISTRY
from specfleet.controller.run import RunOptions, run


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass(frozen=True)
class RunningOperator:
    metrics_url: str

    def writes(self, namespace: str) -> float:
        """Requests that changed `namespace`, as the in-process operator counted them."""
        verbs = ("apply", "delete", "status", "event")
        labels = ({"namespace": namespace, "verb": verb} for verb in verbs)
        samples = (REGISTRY.get_sample_value("specfleet_api_writes_total", x) for x in labels)
        return sum(value or 0.0 for value in samples)


@contextmanager
def in_process(
    cluster: Cluster,
    resync_seconds: float = 5.0,
    prometheus_url: str | None = None,
    alertmanager_url: str | None = None,
) -> Iterator[RunningOperator]:
    os.environ["KUBECONFIG"] = str(cluster.kubeconfig)
    options = RunOptions(
        metrics_port=free_port(),
        health_port=free_port(),
        bind_address="127.0.0.1",
        resync_seconds=resync_seconds,
        gateway_image="specfleet:e2e",
        prometheus_url=prometheus_url,
        alertmanager_url=alertmanager_url,
        guard_tick_seconds=1.0,
    )
    stop, ready = threading.Event(), threading.Event()
    thread = threading.Thread(target=run, args=(options, stop, ready), daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not ready.wait(0.2):
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the operator did not start (see the log above)")
    try:
        yield RunningOperator(metrics_url=f"http://127.0.0.1:{options.metrics_port}/metrics")
    finally:
        stop.set()
        thread.join(30)


def service_account_kubeconfig(cluster: Cluster, namespace: str, account: str, path: Path) -> Path:
    """A kubeconfig that authenticates as a ServiceAccount (a bound token), nothing more."""
    token = cluster.kubectl("create", "token", account, "-n", namespace, "--duration=1h").strip()
    config = yaml.safe_load(cluster.kubeconfig.read_text())
    config["users"] = [{"name": account, "user": {"token": token}}]
    for context in config["contexts"]:
        context["context"]["user"] = account
    path.write_text(yaml.safe_dump(config))
    return path


@dataclass(frozen=True)
class OperatorProcess:
    pid: int
    metrics_url: str
    health_url: str = ""

    def samples(self, name: str) -> list[tuple[dict[str, str], float]]:
        """A series of the process's own metrics, by labels; none while it does not answer."""
        try:
            with urllib.request.urlopen(self.metrics_url, timeout=2) as response:
                text = response.read().decode()
        except OSError:
            return []
        return [
            (sample.labels, float(sample.value))
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == name
        ]

    def total(self, name: str) -> float:
        """A series summed over its labels (0 before its first sample)."""
        return sum(value for _, value in self.samples(name))

    def health(self) -> str:
        with urllib.request.urlopen(self.health_url, timeout=2) as response:
            return str(response.read().decode())


@contextmanager
def as_process(
    kubeconfig: Path, log: Path, *args: str, env: dict[str, str] | None = None
) -> Iterator[OperatorProcess]:
    """`specfleet run` as a subprocess, once its health endpoint answers. `env`: added to this
    process's environment (e.g. the chart's POD_NAME)."""
    health, metrics = free_port(), free_port()
    env = {**os.environ, **(env or {}), "KUBECONFIG": str(kubeconfig)}
    argv = [
        str(Path(sys.executable).parent / "specfleet"),
        "run",
        f"--health-port={health}",
        f"--metrics-port={metrics}",
        "--gateway-image=specfleet:e2e",
        *args,
    ]
    with log.open("w") as out:
        process = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{health}/healthz"
    try:
        eventually(lambda: _answers(url) or process.poll() is not None, "the operator's health")
        if process.poll() is not None:
            raise RuntimeError(f"specfleet run exited {process.returncode}: {log.read_text()}")
        yield OperatorProcess(process.pid, f"http://127.0.0.1:{metrics}/metrics", url)
    finally:
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False
