"""A simulated GPU fleet for e2e tests: the operator (with the guard reading the real
Prometheus and alerting the real Alertmanager), `specfleet-testbed pods` running the simulator and
gateway of every kwok pod, and a traffic generator."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

import yaml
from kubernetes import config

from e2e.cluster.harness import LocalCluster
from e2e.traffic import LongStream, LongStreams, Traffic, TrafficReport
from specfleet.scenario import Scenario, parse_scenario

Report = TypeVar("Report")
GUIDELLM_BUILD = Path(__file__).resolve().parent.parent / "hack" / "guidellm.sh"


def guidellm() -> str:
    """The guidellm command experiments' load tests run, built once (`make guidellm`); the
    script only prints its path when it is."""
    out = subprocess.run([str(GUIDELLM_BUILD)], capture_output=True, text=True, check=True)
    return out.stdout.strip().removeprefix("guidellm=")


@dataclass
class Fleet:
    cluster: LocalCluster
    namespace: str
    scenario: Scenario
    epoch: float
    scenario_path: Path | None = None
    """The file `specfleet-testbed pods` gives every engine it starts."""

    def change_scenario(self, plan: dict[str, Any]) -> None:
        """The engines started from now on read `plan` (same clock); the running ones keep the
        scenario they started with, and the traffic generators theirs."""
        if self.scenario_path is None:
            raise RuntimeError("this fleet's pods do not read a scenario file")
        staged = self.scenario_path.with_suffix(".new")
        staged.write_text(yaml.safe_dump(plan))
        staged.replace(self.scenario_path)  # an engine starting now reads one or the other

    def traffic(
        self,
        specmodel: str,
        model: str,
        seconds: float,
        seed: int = 0,
        stop: threading.Event | None = None,
        plan: dict[str, Any] | None = None,
    ) -> TrafficReport:
        """`plan`: a scenario for this generator alone, its rate (`traffic_rps`, on the shared
        clock) and class mix (`share`, `tool_call_rate`: whether requests offer tools); the
        pods keep the fleet's scenario, which decides how they answer."""
        api = config.new_client_from_config(config_file=str(self.cluster.kubeconfig))
        stop = stop or threading.Event()
        scenario = self.scenario if plan is None else parse_scenario(plan)
        try:
            traffic = Traffic(
                api, self.namespace, specmodel, model, scenario, self.epoch, seed, stop
            )
            return asyncio.run(traffic.run(seconds))
        finally:
            api.close()

    def traffic_in_background(
        self, specmodel: str, model: str, seconds: float, plan: dict[str, Any] | None = None
    ) -> Background[TrafficReport]:
        stop = threading.Event()
        return Background(
            lambda: self.traffic(specmodel, model, seconds, stop=stop, plan=plan), stop
        )

    def long_streams_in_background(
        self, specmodel: str, model: str, seconds: float = 600
    ) -> tuple[list[LongStream], Background[list[LongStream]]]:
        """Streams of a minute or more (`LongStreams`), until halted: the streams so far (a
        list that grows), and the background whose `result` returns them all once those in
        flight have finished."""
        stop = threading.Event()
        api = config.new_client_from_config(config_file=str(self.cluster.kubeconfig))
        streams = LongStreams(
            api, self.namespace, specmodel, model, self.scenario, self.epoch, stop=stop
        )

        def run() -> list[LongStream]:
            try:
                asyncio.run(streams.run(seconds))
            finally:
                api.close()
            for stream in streams.streams:
                stream.pod_gone = streams.gone.get(stream.pod)
            return streams.streams

        return streams.streams, Background(run, stop)

    def scenario_time(self) -> float:
        return time.time() - self.epoch


class Background(threading.Thread, Generic[Report]):
    """Traffic in a thread; `result()` returns its report or raises what went wrong."""

    def __init__(self, work: Callable[[], Report], stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self._work, self._stop_traffic = work, stop
        self._report: Report | None = None
        self._error: BaseException | None = None
        self.start()

    def run(self) -> None:
        try:
            self._report = self._work()
        except BaseException as exc:  # handed to the test thread by result()
            self._error = exc

    def halt(self) -> None:
        """No more requests; those in flight finish (`result` waits for them)."""
        self._stop_traffic.set()

    def result(self, timeout: float | None = None, stop: bool = False) -> Report:
        """The report, once the traffic ends (at once, if `stop`)."""
        if stop:
            self._stop_traffic.set()
        self.join(timeout)
        if self._error is not None:
            raise self._error
        if self._report is None:
            raise TimeoutError("the traffic generator is still running")
        return self._report


def engine_pods(cluster: LocalCluster, namespace: str, name: str) -> set[str]:
    """The uids of a SpecModel's fleet's engine pods (not the plain pool's, nor a canary's): an
    engine restart replaces them."""
    selector = f"app.kubernetes.io/instance={name},app.kubernetes.io/name=specfleet-engine"
    items = cluster.kubectl_json("get", "pods", "-n", namespace, "-l", selector)["items"]
    return {p["metadata"]["uid"] for p in items if "deletionTimestamp" not in p["metadata"]}


@contextmanager
def simulated_pods(
    cluster: LocalCluster,
    namespace: str,
    scenario: dict[str, Any],
    workdir: Path,
    options: tuple[str, ...] = (),
) -> Iterator[Fleet]:
    """`specfleet-testbed pods` for one namespace, sharing the scenario clock with the traffic;
    `options` are more of its command-line options."""
    path = workdir / "scenario.yaml"
    path.write_text(yaml.safe_dump(scenario))
    epoch = time.time()
    argv = [
        str(Path(sys.executable).parent / "specfleet-testbed"),
        "pods",
        "--namespace",
        namespace,
        "--scenario",
        str(path),
        "--epoch",
        str(epoch),
        "--workdir",
        str(workdir / "pods"),
        *options,
    ]
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
    with (workdir / "sim-pods.log").open("w") as log:
        process = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        yield Fleet(cluster, namespace, parse_scenario(scenario), epoch, path)
    finally:
        process.terminate()
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
