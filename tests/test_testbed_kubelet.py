"""The stand-in kubelet's pod lifecycle, with real processes."""

from __future__ import annotations

import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

from kubernetes import client

from specfleet_testbed.kubelet import PodProcesses, PodRuntime, SimSettings, wait_unbound

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


def test_a_pod_starts_only_once_the_last_holder_of_its_ip_has_stopped(tmp_path: Path) -> None:
    old = PodProcesses("ns/old", "127.0.0.9", pre_stop_seconds=0.5)
    assert old.launch([(SLEEPER, tmp_path / "old.log")])
    stopping = threading.Thread(target=old.stop, args=(5.0,))
    stopping.start()
    new = PodProcesses("ns/new", "127.0.0.9")

    assert new.launch([(SLEEPER, tmp_path / "new.log")], after=stopping)

    assert old.processes[0].poll() is not None, "the old pod's process still holds the IP"
    assert new.alive()
    new.stop(5.0, pre_stop=False)
    assert not new.alive()


TERM_LINGERER = [
    sys.executable,
    "-c",
    "import signal, time\n"
    "signal.signal(signal.SIGTERM, lambda *_: None)\n"  # drains, as a gateway with streams does
    "time.sleep(60)\n",
]


def test_a_deleted_pod_drains_for_its_grace_less_its_prestop_then_is_killed(
    tmp_path: Path,
) -> None:
    pod = PodProcesses("ns/draining", "127.0.0.9", pre_stop_seconds=0.5, grace_seconds=3.5)
    assert pod.launch([(TERM_LINGERER, tmp_path / "gateway.log")])
    time.sleep(0.5)  # its handler set
    started = time.monotonic()

    pod.stop()

    took = time.monotonic() - started
    assert not pod.alive()
    assert 3.3 < took < 5.0, took  # a 3.5 s grace, the preStop's 0.5 s included


def test_a_pod_stopped_before_it_launched_starts_nothing(tmp_path: Path) -> None:
    pod = PodProcesses("ns/gone", "127.0.0.9")
    pod.stop(1.0)

    assert not pod.launch([(SLEEPER, tmp_path / "gone.log")])

    assert pod.processes == [] and not pod.alive()


def test_stopping_a_pod_stops_the_children_of_its_processes(tmp_path: Path) -> None:
    """A real engine runs its engine core as a child: a pod's stop reaches the whole group."""
    pid_file = tmp_path / "child.pid"
    parent = [
        sys.executable,
        "-c",
        "import signal, subprocess, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n"
        f"child = subprocess.Popen({SLEEPER!r})\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "time.sleep(60)\n",
    ]
    pod = PodProcesses("ns/engine", "127.0.0.9")
    assert pod.launch([(parent, tmp_path / "engine.log")])
    deadline = time.monotonic() + 10
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline, "the child never started"
        time.sleep(0.05)
    child = int(pid_file.read_text())

    pod.stop(5.0, pre_stop=False)

    deadline = time.monotonic() + 5  # a signalled process takes a moment to exit
    while _running(child):
        assert time.monotonic() < deadline, "the child outlived its pod"
        time.sleep(0.05)


def test_an_engine_command_replaces_the_simulator_with_the_pods_own_args(tmp_path: Path) -> None:
    settings = SimSettings(tmp_path, engine_command=("real-engine", "--flag"))
    runtime = PodRuntime(client.ApiClient(), settings)
    engine = {"args": ["org/model", "--port", "8000", "--chat-template", "/etc/t/chat.jinja"]}

    argv = runtime._engine_argv(pod(engine), "127.10.0.5", {"/etc/t": tmp_path / "t"})

    assert argv == [
        "real-engine",
        "--flag",
        "--listen",
        "127.10.0.5:8000",
        "--",
        "org/model",
        "--port",
        "8000",
        "--chat-template",
        f"{tmp_path}/t/chat.jinja",
    ]


def pod(engine: dict[str, Any], labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"labels": labels or {}},
        "spec": {"containers": [{"name": "engine", **engine}, {"name": "gateway"}]},
    }


def test_an_engine_command_for_some_pods_leaves_the_others_to_the_simulator(
    tmp_path: Path,
) -> None:
    """An experiment with its baseline and speculative arms on the real engine."""
    settings = SimSettings(
        tmp_path,
        engine_command=("real-engine",),
        engine_pods=("specfleet.dev/arm", frozenset({"baseline", "speculative"})),
    )
    runtime = PodRuntime(client.ApiClient(), settings)
    engine = {"args": ["org/model"]}

    def program(labels: dict[str, str]) -> str:
        return Path(runtime._engine_argv(pod(engine, labels), "127.10.0.5", {})[0]).name

    assert program({"specfleet.dev/arm": "speculative"}) == "real-engine"
    assert program({"specfleet.dev/arm": "both"}) == "specfleet-testbed"
    assert program({}) == "specfleet-testbed"


def test_without_an_engine_command_the_pod_runs_this_environments_simulator(
    tmp_path: Path,
) -> None:
    runtime = PodRuntime(client.ApiClient(), SimSettings(tmp_path, time_scale=0.5))
    engine = {"command": ["trtllm-serve"], "args": ["org/model"]}

    argv = runtime._engine_argv(pod(engine), "127.10.0.5", {})

    script = Path(sys.executable).parent / "specfleet-testbed"
    assert script.exists(), "the testbed is not installed in this environment"
    assert argv[:6] == [
        str(script),
        "engine",
        "--engine",
        "tensorrt-llm",
        "--listen",
        "127.10.0.5:8000",
    ]
    assert argv[-2:] == ["--", "org/model"]


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_a_pod_waits_for_another_stand_ins_process_to_leave_its_ip() -> None:
    """Another namespace's stand-in may still be draining the last holder of a pod's IP."""
    holder = socket.socket()
    holder.bind(("127.0.0.9", 0))
    holder.listen()
    port = holder.getsockname()[1]
    threading.Timer(0.5, holder.close).start()

    assert not wait_unbound("127.0.0.9", (port,), timeout=0.1)
    assert wait_unbound("127.0.0.9", (port,), timeout=10)


def test_a_pod_without_an_engine_is_left_to_kwok(tmp_path: Path) -> None:
    """A specfleet pod with no engine that is no load test (`load_tests`) is kwok's alone."""
    runtime = PodRuntime(client.ApiClient(), SimSettings(workdir=tmp_path))
    load_test = {
        "metadata": {"uid": "u1", "name": "exp-both-capacity-x", "namespace": "ns"},
        "spec": {"containers": [{"name": "capacity"}]},
        "status": {"phase": "Running", "podIP": "127.0.0.9"},
    }
    runtime.sync(load_test)
    assert runtime.running == {}


def test_a_plain_pools_pod_runs_its_engine_alone_and_is_probed_there(tmp_path: Path) -> None:
    """The plain pool's pods have no gateway (the fleet's gateways measure what they serve) and
    no managed-by label: the stand-in follows them by their pool label."""
    settings = SimSettings(tmp_path, engine_command=tuple(SLEEPER))
    runtime = PodRuntime(client.ApiClient(), settings)
    plain = {
        "metadata": {
            "uid": "p1",
            "name": "m-plain-x",
            "namespace": "ns",
            "labels": {"specfleet.dev/pool": "plain"},
        },
        "spec": {"containers": [{"name": "engine", "args": ["org/model"]}]},
        "status": {"phase": "Running", "podIP": "127.0.0.9"},
    }
    gatewayless = {**plain, "metadata": {**plain["metadata"], "uid": "p2", "labels": {}}}
    runtime.sync(gatewayless)
    assert runtime.running == {}  # an engine without a gateway is a plain pod's only
    runtime.sync(plain)
    started = runtime.running["p1"]
    try:
        assert started.probe_port == 8000
        deadline = time.monotonic() + 5
        while not started.processes:
            assert time.monotonic() < deadline, "the engine never started"
            time.sleep(0.05)
        assert len(started.processes) == 1
    finally:
        runtime.stop_all()


def test_stopping_the_stand_in_cuts_short_a_pod_still_in_its_pre_stop_pause(
    tmp_path: Path,
) -> None:
    """A pod released just before the stand-in stops is stopped with the rest, not left to its
    pause and drain (the stand-in's own stop is bounded: what outlives it stays on its IP)."""
    runtime = PodRuntime(client.ApiClient(), SimSettings(tmp_path, drain_seconds=2))
    released = PodProcesses("ns/plain", "127.0.0.9", pre_stop_seconds=60)
    assert released.launch([(SLEEPER, tmp_path / "engine.log")])
    runtime.running["u1"] = released
    runtime.sync({"metadata": {"uid": "u1", "name": "plain", "namespace": "ns"}}, deleted=True)
    began = time.monotonic()
    runtime.stop_all()
    assert not released.alive() and time.monotonic() - began < 10
