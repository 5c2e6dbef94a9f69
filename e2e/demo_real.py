"""The demo's real engine: one kwok pod whose engine is the real vLLM (hack/real-engine.sh's CPU
build, the tiny model drafting for itself, started by `specfleet-testbed pods --engine-command`)
behind the real gateway, in a SpecModel of its own, and clients that decode greedily until they
switch to sampling: with the target as its own drafter, greedy drafts are all accepted and
sampled ones hardly any, so the acceptance collapse is the clients' doing, as it is in a fleet.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kubernetes import config

from e2e import real_clients, real_engine
from e2e.cluster.harness import LocalCluster
from e2e.fleet import Background, simulated_pods
from e2e.real_clients import Clients
from e2e.real_engine_pod import COMMAND
from specfleet.scenario import parse_scenario

NAMESPACE = "demo-real"
NAME = real_clients.NAME
SAMPLED = real_clients.SAMPLED
ANSWER_TOKENS = 24
READY_TIMEOUT_S = real_engine.START_TIMEOUT_S
"""How long the stand-in kubelet gives the real engine to answer /health."""
MIN_AVAILABLE_GIB = 10.0
"""A real engine takes 3.5-4.5 GiB, and the kill switch's restart runs two for a while."""
NO_TRIAL = {"cooldownSeconds": 3600, "maxCooldownSeconds": 3600}
SCENARIO = real_clients.scenario(2.0)


def specmodel(guard: dict[str, Any]) -> dict[str, Any]:
    """The demo's guard, for a CPU engine's few requests a window."""
    return real_clients.specmodel(
        # no trial within the demo: it would start a second real engine beside the fleet's
        guard={**guard, "minRequests": 5, "minDraftTokens": 50, **NO_TRIAL},
        pod={"replicas": 1},
    )


def cannot_carry() -> str | None:
    """Why this machine cannot run the real engine beside the simulated fleet, if it cannot."""
    meminfo = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    available = int(meminfo["MemAvailable"].split()[0]) / 2**20
    if available < MIN_AVAILABLE_GIB:
        return f"{available:.1f} GiB of memory available, {MIN_AVAILABLE_GIB:.0f} needed"
    return None


@contextmanager
def real_pod(cluster: LocalCluster, workdir: Path) -> Iterator[Clients]:
    """The real engine's pod (its SpecModel applied by the caller) and its clients, greedy;
    `send(clients)` once the pod is Ready."""
    options = ("--engine-command", COMMAND, "--ready-timeout", str(READY_TIMEOUT_S))
    workdir.mkdir(parents=True, exist_ok=True)
    with simulated_pods(cluster, NAMESPACE, SCENARIO, workdir, options):
        api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
        scenario = parse_scenario(SCENARIO)
        clients = Clients(
            api, NAMESPACE, NAME, NAME, scenario, time.time(), max_tokens=ANSWER_TOKENS
        )
        try:
            yield clients
        finally:
            clients.stop.set()
            api.close()


def send(clients: Clients) -> Background:
    return Background(lambda: asyncio.run(clients.run(clients.scenario.duration_s)), clients.stop)
