"""`specfleet-testbed pods`: a stand-in kubelet for kwok's fake GPU pods.

kwok pods run no containers. For every Running SpecModel pod with an IP, this starts the engine
simulator (or, given an engine command, that program: a real engine) with the pod's own engine
command line and the gateway with the pod's own arguments (a plain pool's pod runs no gateway:
its engine alone), both bound to the pod's IP (kwok gives pods loopback addresses), with the
pod's ConfigMap volumes written to a local directory. Prometheus then scrapes real gateways found
through the real API server, and a kill-switch flip (new pods, new args) really changes what is
measured. When a pod terminates, its processes get SIGTERM and drain, like a kubelet would do,
and the pod object stays (a finalizer) until they have stopped, so kwok hands its IP to no other
pod meanwhile.
An experiment's load tests (its capacity Jobs' pods) run to their end here too (`load_tests`).
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import urllib3
from kubernetes import client, watch

from specfleet_testbed.load_tests import (
    LoadTest,
    container_command,
    is_load_test,
    start_load_test,
)
from specfleet_testbed.processes import signal_group, spawn
from specfleet_testbed.volumes import ConfigMapVolume, Volumes

log = logging.getLogger(__name__)
MANAGED = "app.kubernetes.io/managed-by=specfleet"
PLAIN = "specfleet.dev/pool=plain"
"""The plain pool's pods: specfleet's, without managed-by (`render.workload.pod_labels`)."""
ENGINE_PORT = 8000
GATEWAY_PORT = 8080
RELEASE_TIMEOUT_SECONDS = 60.0
RETRY_SECONDS = 1.0
RELEASE_ATTEMPTS = 120
FINALIZER = "specfleet.dev/testbed-processes"
"""Held by a pod whose processes run here. A kubelet removes a deleted pod only once its
containers have stopped, and a CNI frees its IP only then; kwok deletes at once and recycles the
IP first, so a new pod would wait out the old one's drain (a stream of minutes) on that IP."""
Pod = dict[str, Any]


@dataclass(frozen=True)
class SimSettings:
    workdir: Path
    scenario: Path | None = None
    time_scale: float = 1.0
    epoch: float | None = None
    namespace: str | None = None
    drain_seconds: float = 10.0
    """What the stand-in's own stop (`stop_all`) gives each pod's processes after SIGTERM; a
    deleted pod gets its own grace."""
    engine_command: tuple[str, ...] = ()
    """Run instead of the simulator, as `ENGINE_COMMAND --listen IP:PORT -- ENGINE_ARGS`, the
    simulator's own interface (empty: the simulator)."""
    engine_pods: tuple[str, frozenset[str]] | None = None
    """Only pods whose label (the first) has one of these values run `engine_command`; the others
    the simulator (None: every pod)."""
    ready_timeout: float = 60.0
    """Seconds a pod's engine gets to answer /health before the pod is left not Ready."""
    volume_sync_seconds: float = 2.0
    """How often a running pod's ConfigMap volumes are brought up to date."""
    guidellm: str | None = None
    """The guidellm command load tests run (None: `guidellm` on PATH)."""


DEFAULT_GRACE_SECONDS = 30.0
"""A pod's terminationGracePeriodSeconds where it says none (the API server's default)."""
MIN_DRAIN_SECONDS = 2.0
"""What a kubelet gives the containers after SIGTERM when the preStop used up the grace."""

Command = tuple[list[str], Path]
"""A process to start: its argv and its log file."""


@dataclass
class PodProcesses:
    name: str
    ip: str
    pre_stop_seconds: float = 0.0
    """The pod's own preStop pause (its `sleep N` hooks), while endpoints drop the pod."""
    grace_seconds: float = DEFAULT_GRACE_SECONDS
    """Its terminationGracePeriodSeconds: from deletion to SIGKILL, the preStop included."""
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    volumes: list[ConfigMapVolume] = field(default_factory=list)
    probe_port: int = GATEWAY_PORT
    """Where its readiness probe asks /health: its gateway, or a plain pod's engine."""
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stopped: bool = False
    _cut: threading.Event = field(default_factory=threading.Event)
    """Set by a stop without the pause: it cuts short one in progress."""

    def launch(self, commands: list[Command], after: threading.Thread | None = None) -> bool:
        """Starts the pod's processes once `after` (the stopping of the pod that last held this
        pod's IP) is done, unless this pod was stopped first."""
        if after is not None:
            log.info("pod %s waits for %s's last holder to stop", self.name, self.ip)
            after.join()
        with self._lock:
            if not self._stopped:
                self.processes = [spawn(argv, log_path) for argv, log_path in commands]
            return not self._stopped

    def alive(self) -> bool:
        return bool(self.processes) and all(p.poll() is None for p in self.processes)

    def stop(self, drain_seconds: float | None = None, pre_stop: bool = True) -> None:
        """Like a kubelet: the preStop pause, SIGTERM, then SIGKILL after the drain (None: what
        the pod's grace leaves after its preStop, at least the kubelet's 2 s), each to the
        process's whole group (a real engine runs its engine core as a child process)."""
        with self._lock:
            self._stopped = True
        if pre_stop:
            self._cut.wait(self.pre_stop_seconds)
        else:
            self._cut.set()
        if drain_seconds is None:
            drain_seconds = max(self.grace_seconds - self.pre_stop_seconds, MIN_DRAIN_SECONDS)
        for process in self.processes:
            signal_group(process, signal.SIGTERM)
        for process in self.processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(drain_seconds)
            signal_group(process, signal.SIGKILL)
            process.wait()


class PodRuntime:
    def __init__(self, api: client.ApiClient, settings: SimSettings) -> None:
        self._core = client.CoreV1Api(api)
        self.settings = settings
        self.running: dict[str, PodProcesses] = {}
        self.load_tests: dict[str, LoadTest] = {}
        self._releasing: dict[str, threading.Thread] = {}
        """Pod IP -> the thread stopping the pod that held it last. kwok frees a deleted pod's
        IP at once, a CNI only once the pod's sandbox is gone: a new pod given that IP starts
        after the old one's processes have stopped, or the old gateway would answer its
        readiness probe and the new one would fail to bind."""
        self._draining: list[PodProcesses] = []
        """Pods released while running (their preStop pause, their drain): stopping this
        stand-in cuts them short rather than leave them behind."""
        self._lock = threading.Lock()
        self._volumes = Volumes(self._core)

    def run(self, stop: threading.Event) -> None:
        """Follows pods until `stop` is set, then stops every process it started."""
        threading.Thread(target=self._sync_volumes, args=(stop,), daemon=True).start()
        plain = threading.Thread(target=self._follow, args=(stop, PLAIN), daemon=True)
        plain.start()
        try:
            self._follow(stop, MANAGED)
        finally:
            plain.join()
            self.stop_all()

    def _follow(self, stop: threading.Event, selector: str) -> None:
        """Watches again after the API server went away (restarted), as a kubelet does."""
        while not stop.is_set():
            try:
                self._watch_once(stop, selector)
            except (client.ApiException, urllib3.exceptions.HTTPError) as exc:
                log.warning(
                    "watching pods (%s) failed, again in %.0f s: %s", selector, RETRY_SECONDS, exc
                )
                stop.wait(RETRY_SECONDS)

    def _watch_once(self, stop: threading.Event, selector: str) -> None:
        stream = watch.Watch()
        if self.settings.namespace:
            lister: Any = self._core.list_namespaced_pod
            kwargs: dict[str, Any] = {"namespace": self.settings.namespace}
        else:
            lister, kwargs = self._core.list_pod_for_all_namespaces, {}
        for event in stream.stream(lister, label_selector=selector, timeout_seconds=5, **kwargs):
            pod = self._core.api_client.sanitize_for_serialization(event["object"])
            self.sync(pod, deleted=event["type"] == "DELETED")
            if stop.is_set():
                stream.stop()

    def sync(self, pod: Pod, deleted: bool = False) -> None:
        if is_load_test(pod):
            self._sync_load_test(pod, deleted)
            return
        uid, status = pod["metadata"]["uid"], pod.get("status", {})
        alive = (
            not deleted
            and "deletionTimestamp" not in pod["metadata"]
            and status.get("phase") == "Running"
            and bool(status.get("podIP"))
            and _serves(pod)
        )
        with self._lock:
            if alive and uid not in self.running:
                self.running[uid] = self._start(pod)
                return
            stopping = None if alive else self.running.pop(uid, None)
            if stopping is not None:
                stopper = threading.Thread(target=self._stop, args=(stopping,))
                self._releasing[stopping.ip] = stopper
                self._draining = [p for p in self._draining if p.alive()] + [stopping]
                stopper.start()

    def _sync_load_test(self, pod: Pod, deleted: bool) -> None:
        """Started once when kwok runs the pod; stopped when the pod goes (a Job's deadline)."""
        uid = pod["metadata"]["uid"]
        gone = deleted or "deletionTimestamp" in pod["metadata"]
        with self._lock:
            if gone:
                test = self.load_tests.pop(uid, None)
                if test is not None:
                    test.stop()
            elif uid not in self.load_tests and pod.get("status", {}).get("phase") == "Running":
                self.load_tests[uid] = self._start_load_test(pod)

    def _start_load_test(self, pod: Pod) -> LoadTest:
        namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        workdir = self.settings.workdir / namespace / name
        shutil.rmtree(workdir, ignore_errors=True)
        mounts = {path: v.local for path, v in self._write_config_maps(pod, workdir).items()}

        def local_args(args: list[str]) -> list[str]:
            return [self._volumes.resolve(a) for a in _local_paths(args, mounts)]

        command = container_command(pod, workdir, local_args, _script, self.settings.guidellm)
        log.info("load test %s/%s runs %s", namespace, name, command.argv)
        return start_load_test(self._core, pod, command)

    def stop_all(self) -> None:
        with self._lock:
            pods, self.running = list(self.running.values()), {}
            pods += [p for p in self._draining if p.alive()]
            tests, self.load_tests = list(self.load_tests.values()), {}
        for test in tests:
            test.stop()
        # All at once: one at a time, pods whose engines linger (a plain pool's, holding the
        # gateways' idle connections) add up past whatever stops this stand-in, and outlive it.
        stoppers = [
            threading.Thread(target=self._stop, args=(pod, self.settings.drain_seconds, False, 1))
            for pod in pods
        ]
        for stopper in stoppers:
            stopper.start()
        for stopper in stoppers:
            stopper.join()

    def _start(self, pod: Pod) -> PodProcesses:
        namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        ip: str = pod["status"]["podIP"]
        workdir = self.settings.workdir / namespace / name
        shutil.rmtree(workdir, ignore_errors=True)
        volumes = self._write_config_maps(pod, workdir)
        mounts = {path: volume.local for path, volume in volumes.items()}
        containers = {c["name"]: c for c in pod["spec"]["containers"]}
        logs = workdir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        processes = PodProcesses(
            f"{namespace}/{name}",
            ip,
            _pre_stop_seconds(pod["spec"]["containers"]),
            float(pod["spec"].get("terminationGracePeriodSeconds", DEFAULT_GRACE_SECONDS)),
            volumes=list(volumes.values()),
        )
        # Under the lock that registers the pod, so that no stop can release it first.
        self._patch_finalizers(processes, {"finalizers": [FINALIZER]})
        commands = [(self._engine_argv(pod, ip, mounts), logs / "engine.log")]
        if "gateway" in containers:
            gateway = _gateway_argv(containers["gateway"], ip, mounts)
            commands.append((gateway, logs / "gateway.log"))
        else:
            processes.probe_port = ENGINE_PORT
        previous = self._releasing.pop(ip, None)
        threading.Thread(
            target=self._run_pod, args=(processes, commands, previous), daemon=True
        ).start()
        return processes

    def _run_pod(
        self, pod: PodProcesses, commands: list[Command], previous: threading.Thread | None
    ) -> None:
        if not wait_unbound(pod.ip, (ENGINE_PORT, GATEWAY_PORT), RELEASE_TIMEOUT_SECONDS):
            log.warning("pod %s starts while something else still listens on %s", pod.name, pod.ip)
        if pod.launch(commands, after=previous):
            log.info("started engine and gateway for pod %s at %s", pod.name, pod.ip)
            self._mark_ready(pod)

    def _stop(
        self,
        pod: PodProcesses,
        drain_seconds: float | None = None,
        pre_stop: bool = True,
        attempts: int = RELEASE_ATTEMPTS,
    ) -> None:
        """Stops the pod's processes, then lets its object go (and kwok free its IP), trying
        `attempts` times while the API server does not answer."""
        pod.stop(drain_seconds, pre_stop)
        release = {"$deleteFromPrimitiveList/finalizers": [FINALIZER]}
        self._patch_finalizers(pod, release, attempts)

    def _patch_finalizers(
        self, pod: PodProcesses, metadata: dict[str, Any], attempts: int = 1
    ) -> None:
        """`attempts`: how often to try while the API server does not answer (one second
        apart); a pod whose finalizer is never released is never deleted."""
        namespace, name = pod.name.split("/", 1)
        for attempt in range(attempts):
            try:
                self._core.patch_namespaced_pod(name, namespace, {"metadata": metadata})
                return
            except client.ApiException as exc:  # gone, or being deleted (no finalizer added)
                log.info("pod %s/%s finalizers not patched: %s", namespace, name, exc.reason)
                return
            except urllib3.exceptions.HTTPError as exc:
                log.warning("pod %s/%s finalizers not patched: %s", namespace, name, exc)
                if attempt + 1 < attempts:
                    time.sleep(RETRY_SECONDS)

    def _mark_ready(self, pod: PodProcesses) -> None:
        """The readiness probe: once the engine answers /health through the pod's own gateway
        (a plain pod's engine itself), the pod is Ready (kwok starts specfleet's pods not Ready,
        so rollouts wait for this)."""
        namespace, name = pod.name.split("/", 1)
        deadline = time.monotonic() + self.settings.ready_timeout
        while time.monotonic() < deadline and pod.alive():
            try:
                with urllib.request.urlopen(f"http://{pod.ip}:{pod.probe_port}/health", timeout=1):
                    break
            except OSError:
                time.sleep(0.2)
        else:
            log.warning("pod %s never became healthy (its processes: %s)", pod.name, pod.alive())
            return
        try:
            self._core.patch_namespaced_pod_status(name, namespace, ready_patch(datetime.now(UTC)))
        except client.ApiException as exc:  # deleted meanwhile
            log.info("pod %s/%s not marked Ready: %s", namespace, name, exc.reason)

    def _engine_argv(self, pod: Pod, ip: str, mounts: dict[str, Path]) -> list[str]:
        [engine] = [c for c in pod["spec"]["containers"] if c["name"] == "engine"]
        args = _local_paths(engine.get("args") or [], mounts)
        if self._runs_engine_command(pod):
            return [*self.settings.engine_command, "--listen", f"{ip}:{ENGINE_PORT}", "--", *args]
        kind = "tensorrt-llm" if (engine.get("command") or [""])[0] == "trtllm-serve" else "vllm"
        argv = [
            _script("specfleet-testbed"),
            "engine",
            "--engine",
            kind,
            "--listen",
            f"{ip}:{ENGINE_PORT}",
        ]
        argv += ["--time-scale", str(self.settings.time_scale)]
        if self.settings.epoch is not None:
            argv += ["--epoch", str(self.settings.epoch)]
        if self.settings.scenario is not None:
            argv += ["--scenario", str(self.settings.scenario)]
        return [*argv, "--", *args]

    def _runs_engine_command(self, pod: Pod) -> bool:
        if not self.settings.engine_command:
            return False
        if self.settings.engine_pods is None:
            return True
        label, values = self.settings.engine_pods
        return (pod["metadata"].get("labels") or {}).get(label) in values

    def _write_config_maps(self, pod: Pod, workdir: Path) -> dict[str, ConfigMapVolume]:
        """ConfigMap volumes as local directories; returns mount path -> the volume."""
        spec, namespace = pod["spec"], pod["metadata"]["namespace"]
        volumes = {
            v["name"]: v["configMap"]["name"] for v in spec.get("volumes", []) if "configMap" in v
        }
        mounts: dict[str, ConfigMapVolume] = {}
        for container in spec["containers"]:
            for mount in container.get("volumeMounts", []):
                if mount["name"] not in volumes:
                    continue
                local = workdir / "volumes" / mount["name"]
                volume = ConfigMapVolume(volumes[mount["name"]], local)
                self._volumes.write(namespace, volume)
                mounts[mount["mountPath"]] = volume
        return mounts

    def _sync_volumes(self, stop: threading.Event) -> None:
        """Like a kubelet, every running pod's ConfigMap volumes kept up to date."""
        while not stop.wait(self.settings.volume_sync_seconds):
            with self._lock:
                pods = list(self.running.values())
            for pod in pods:
                namespace = pod.name.split("/", 1)[0]
                for volume in pod.volumes:
                    try:
                        if self._volumes.write(namespace, volume):
                            log.info("pod %s: ConfigMap %s updated", pod.name, volume.config_map)
                    except (client.ApiException, OSError) as exc:  # deleted meanwhile
                        log.info("pod %s: %s not synced: %s", pod.name, volume.config_map, exc)


def wait_unbound(ip: str, ports: tuple[int, ...], timeout: float) -> bool:
    """Until nothing listens on `ip` at `ports`; False after `timeout` seconds. Another stand-in
    (one per namespace) may still be stopping the deleted pod that last held this IP."""
    deadline = time.monotonic() + timeout
    while not all(_unbound(ip, port) for port in ports):
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(0.5, left))
    return True


def _unbound(ip: str, port: int) -> bool:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT is no holder
        try:
            probe.bind((ip, port))
        except OSError:
            return False
        return True


def ready_patch(now: datetime) -> dict[str, Any]:
    """The pod status patch a kubelet's passing readiness probe amounts to."""
    conditions = [
        {"type": kind, "status": "True", "lastTransitionTime": now.isoformat()}
        for kind in ("Ready", "ContainersReady")
    ]
    return {"status": {"conditions": conditions}}


def _serves(pod: Pod) -> bool:
    """An engine pod (the fleet's, a canary's, an arm's, the plain pool's); specfleet's other
    pods (an experiment's load tests) are left to kwok."""
    names = {c["name"] for c in pod["spec"]["containers"]}
    plain = (pod["metadata"].get("labels") or {}).get("specfleet.dev/pool") == "plain"
    return "engine" in names and ("gateway" in names or plain)


def _pre_stop_seconds(containers: list[Pod]) -> float:
    """The longest `sleep N` preStop hook of the pod's containers."""
    pauses = [0.0]
    for container in containers:
        command = container.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command")
        if command and command[0] == "sleep" and len(command) == 2:
            pauses.append(float(command[1]))
    return max(pauses)


def _gateway_argv(gateway: Pod, ip: str, mounts: dict[str, Path]) -> list[str]:
    args = [a.replace("0.0.0.0", ip).replace("127.0.0.1", ip) for a in gateway.get("args", [])]
    return [_script("specfleet"), *_local_paths(args, mounts)]


def _local_paths(args: list[str], mounts: dict[str, Path]) -> list[str]:
    """Paths under a mount, as an argument or an option's value (`--file=PATH`), made local."""
    out = []
    for arg in args:
        is_option = arg.startswith("--") and "=" in arg
        option, _, value = arg.partition("=") if is_option else ("", "", arg)
        for mount_path, local in mounts.items():
            if value.startswith(mount_path + "/"):
                value = str(local) + value[len(mount_path) :]
        out.append(f"{option}={value}" if option else value)
    return out


def _script(name: str) -> str:
    """A console script of this environment (the gateway's `specfleet`, the simulator's)."""
    return str(Path(sys.executable).parent / name)
