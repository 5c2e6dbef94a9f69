"""The stand-in kubelet runs an experiment's load tests (the capacity Jobs' pods) as a kubelet
would: the container's command with its files made local, the arm's Service resolved, and the
pod's end written with the termination message the operator reads back."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import experiment_doc, specmodel_doc
from specfleet.api import parse_specmodel
from specfleet.api.validation import parse_specexperiment
from specfleet.experiment.capacity import Capacity, termination_message
from specfleet.experiment.capacity_job import (
    CapacityFailed,
    capacity_of_pod,
    render_capacity_jobs,
)
from specfleet_testbed.kubelet import _local_paths
from specfleet_testbed.load_tests import (
    Container,
    LoadTest,
    container_command,
    is_load_test,
)

SPEC = {
    "quantization": {"weights": "fp8", "online": True},
    "speculative": {"method": "ngram", "numSpeculativeTokens": 4},
    "classes": [{"name": "chat", "slo": {"maxP95TtftSeconds": 1.5}}],
    "defaultClass": "chat",
}
ARM_POD = "http://127.0.0.7:8080"


def load_test_pod() -> dict[str, Any]:
    specmodel = parse_specmodel(specmodel_doc(**SPEC))
    experiment = parse_specexperiment(experiment_doc(capacity={"maxConcurrency": 4, "steps": 2}))
    job = render_capacity_jobs(specmodel, experiment, "capacity:1")[0]
    template = job["spec"]["template"]
    metadata = {**template["metadata"], "name": "x-baseline-capacity-abc", "namespace": "ns"}
    return {"metadata": metadata, "spec": template["spec"]}


def test_a_load_test_runs_its_command_with_local_files_and_the_arms_pod_address(
    tmp_path: Path,
) -> None:
    pod = load_test_pod()
    mounts = {"/etc/specfleet/capacity": tmp_path / "volumes" / "requests"}

    def local_args(args: list[str]) -> list[str]:
        return [
            a.replace("http://x-baseline.ns.svc:80", ARM_POD) for a in _local_paths(args, mounts)
        ]

    command = container_command(
        pod, tmp_path / "pod", local_args, lambda name: f"/venv/bin/{name}", "/cache/guidellm"
    )

    assert is_load_test(pod)
    assert command.argv[:3] == ["/venv/bin/specfleet", "experiment", "capacity"]
    options = dict(a.removeprefix("--").split("=", 1) for a in command.argv[3:])
    assert options["url"] == ARM_POD
    assert options["requests"] == str(tmp_path / "volumes/requests/requests.jsonl")
    assert options["result-file"] == str(command.termination_message)
    assert command.termination_message.parent == tmp_path / "pod"
    assert command.env["SPECFLEET_GUIDELLM"] == "/cache/guidellm"
    assert command.env["HOME"] == "/tmp" and command.fall_back_to_logs


def finished(tmp_path: Path, script: str, message: bytes = b"") -> dict[str, Any]:
    """The pod as it is once the container ran `script` to its end."""
    pod = load_test_pod()
    [spec] = pod["spec"]["containers"]
    command = Container(
        argv=[sys.executable, "-c", script],
        env={},
        termination_message=tmp_path / "termination-log",
        log=tmp_path / "container.log",
        fall_back_to_logs=True,
    )
    command.termination_message.write_bytes(message)
    reports: list[dict[str, Any]] = []
    LoadTest("ns", "x-baseline-capacity-abc", spec["name"], spec["image"]).run(
        command, reports.append
    )
    [patch] = reports
    return {**pod, **patch}


def test_a_load_test_that_wrote_its_result_succeeds_with_it(tmp_path: Path) -> None:
    result = Capacity(throughput_at_slo=3.5, concurrency=4)
    script = (
        f"open({str(tmp_path / 'termination-log')!r}, 'w').write({termination_message(result)!r})"
    )

    pod = finished(tmp_path, script)

    assert pod["status"]["phase"] == "Succeeded"
    assert capacity_of_pod(pod) == result


def test_a_failed_load_test_says_why_in_its_logs_tail(tmp_path: Path) -> None:
    pod = finished(tmp_path, "import sys; print('error: guidellm failed: no route'); sys.exit(3)")

    assert pod["status"]["phase"] == "Failed"
    with pytest.raises(CapacityFailed, match=r"Error \(exit 3\): error: guidellm failed: no route"):
        capacity_of_pod(pod)


def test_a_load_test_stopped_with_its_pod_reports_nothing(tmp_path: Path) -> None:
    pod = load_test_pod()
    command = Container(
        argv=[sys.executable, "-c", "import time; time.sleep(30)"],
        env={},
        termination_message=tmp_path / "termination-log",
        log=tmp_path / "container.log",
        fall_back_to_logs=True,
    )
    test = LoadTest("ns", pod["metadata"]["name"], "capacity", "capacity:1")
    reports: list[dict[str, Any]] = []
    running = threading.Thread(target=test.run, args=(command, reports.append))
    running.start()
    while test._process is None:
        time.sleep(0.01)
    test.stop()
    running.join(10)

    assert not running.is_alive() and reports == []
