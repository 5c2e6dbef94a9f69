"""An experiment's load tests for the stand-in kubelet: the capacity phase's Job pods run their
container's command here (`specfleet experiment capacity` with the guidellm of
`hack/guidellm.sh`), against the arm's Service resolved to a Ready pod as the local cluster has
no DNS, and end like a kubelet ends a container: the pod Succeeded or Failed, the container
terminated with its exit code and its termination message (the file, or the log's tail when the
file is empty and the container failed, as `FallbackToLogsOnError` says)."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes import client

from specfleet.experiment.capacity_job import CAPACITY_APP
from specfleet_testbed.processes import signal_group, spawn

log = logging.getLogger(__name__)
Pod = dict[str, Any]
MESSAGE_BYTES = 4096
"""A kubelet keeps this much of a termination message."""


def is_load_test(pod: Pod) -> bool:
    labels = pod["metadata"].get("labels") or {}
    return labels.get("app.kubernetes.io/name") == CAPACITY_APP


@dataclass(frozen=True)
class Container:
    """What one load-test container runs, mapped onto this machine."""

    argv: list[str]
    env: dict[str, str]
    termination_message: Path
    log: Path
    fall_back_to_logs: bool


@dataclass
class LoadTest:
    namespace: str
    name: str
    container: str
    image: str
    _process: subprocess.Popen[bytes] | None = None
    _stopped: threading.Event = field(default_factory=threading.Event)

    def run(self, command: Container, finish: Callable[[Pod], None]) -> None:
        """Runs the container to its end and reports it with `finish` (the pod status patch);
        a pod deleted meanwhile reports nothing."""
        started = datetime.now(UTC)
        self._process = spawn(command.argv, command.log, command.env)
        code = self._process.wait()
        if self._stopped.is_set():
            return
        message = termination_message(command, code)
        log.info("load test %s/%s exited %s", self.namespace, self.name, code)
        finish(terminated_patch(self.container, self.image, code, message, started))

    def stop(self) -> None:
        self._stopped.set()
        if self._process is not None:
            signal_group(self._process, signal.SIGTERM)


def container_command(
    pod: Pod,
    workdir: Path,
    local_args: Callable[[list[str]], list[str]],
    program: Callable[[str], str],
    guidellm: str | None,
) -> Container:
    """The pod's one container as a local process: `program` finds its command on this
    machine, `local_args` maps its arguments (mounted files, Service URLs); its termination
    message is a file in `workdir`."""
    [spec] = pod["spec"]["containers"]
    workdir.mkdir(parents=True, exist_ok=True)
    message = workdir / "termination-log"
    message.write_bytes(b"")
    args = [
        a.replace(spec.get("terminationMessagePath", "/dev/termination-log"), str(message))
        for a in local_args(spec.get("args") or [])
    ]
    env = {**os.environ, **_env(spec)}
    if guidellm:
        env["SPECFLEET_GUIDELLM"] = guidellm
    return Container(
        argv=[program(spec["command"][0]), *spec["command"][1:], *args],
        env=env,
        termination_message=message,
        log=workdir / "container.log",
        fall_back_to_logs=spec.get("terminationMessagePolicy") == "FallbackToLogsOnError",
    )


def termination_message(command: Container, code: int) -> str:
    message = command.termination_message.read_bytes()
    if not message.strip() and code != 0 and command.fall_back_to_logs:
        message = command.log.read_bytes()[-MESSAGE_BYTES:]
    return message[:MESSAGE_BYTES].decode(errors="replace")


def terminated_patch(container: str, image: str, code: int, message: str, started: datetime) -> Pod:
    """The pod status a kubelet writes when the pod's one container has ended."""
    now = datetime.now(UTC).isoformat()
    terminated = {
        "exitCode": code,
        "reason": "Completed" if code == 0 else "Error",
        "message": message,
        "startedAt": started.isoformat(),
        "finishedAt": now,
    }
    status = {
        "name": container,
        "image": image,
        "ready": False,
        "restartCount": 0,
        "started": False,
        "state": {"terminated": terminated},
    }
    conditions = [
        {"type": kind, "status": "False", "lastTransitionTime": now, "reason": "PodCompleted"}
        for kind in ("Ready", "ContainersReady")
    ]
    phase = "Succeeded" if code == 0 else "Failed"
    return {"status": {"phase": phase, "conditions": conditions, "containerStatuses": [status]}}


def start_load_test(
    core: client.CoreV1Api,
    pod: Pod,
    command: Container,
) -> LoadTest:
    """The pod's container run in a thread; its end written to the pod's status."""
    namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
    [spec] = pod["spec"]["containers"]
    test = LoadTest(namespace, name, spec["name"], spec.get("image", ""))

    def finish(patch: Pod) -> None:
        try:
            core.patch_namespaced_pod_status(name, namespace, patch)
        except client.ApiException as exc:  # deleted meanwhile
            log.info("load test %s/%s not reported: %s", namespace, name, exc.reason)

    threading.Thread(target=test.run, args=(command, finish), daemon=True).start()
    return test


def _env(spec: Mapping[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in spec.get("env") or [] if "value" in e}
