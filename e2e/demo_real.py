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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import config

from e2e import real_engine
from e2e.cluster.harness import LocalCluster
from e2e.fleet import Background, simulated_pods
from e2e.real_engine_pod import COMMAND
from e2e.traffic import Traffic
from specfleet.scenario import parse_scenario

NAMESPACE = "demo-real"
NAME = real_engine.SERVED_NAME
PROMPTS = {"code": "def add(a, b):", "chat": "Tell me about the weather."}
SAMPLED = 0.7
ANSWER_TOKENS = 24
READY_TIMEOUT_S = real_engine.START_TIMEOUT_S
"""How long the stand-in kubelet gives the real engine to answer /health."""
MIN_AVAILABLE_GIB = 10.0
"""A real engine takes 3.5-4.5 GiB, and the kill switch's restart runs two for a while."""
NO_TRIAL = {"cooldownSeconds": 3600, "maxCooldownSeconds": 3600}
SCENARIO = {
    "duration_s": 3600,
    "traffic_rps": [[0, 2.0]],
    "classes": {klass: {"share": 0.5, "acceptance": 1.0} for klass in PROMPTS},
}
"""With a real engine only the arrivals and the class mix of the simulator's scenario matter."""


def specmodel(guard: dict[str, Any]) -> dict[str, Any]:
    """The demo's guard, for a CPU engine's few requests a window."""
    return real_engine.tiny_specmodel(
        {"method": "draft_model", "draftModel": "local/tiny", "numSpeculativeTokens": 3},
        classes=[
            {"name": "code", "critical": True, "slo": {"minAcceptanceRate": 0.5}},
            {"name": "chat"},
        ],
        defaultClass="chat",
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


@dataclass
class Clients(Traffic):
    """Each class's clients decode greedily or sampled as `temperature` says when a request is
    sent; answers are ANSWER_TOKENS long (`ignore_eos`: a random-weight model ends anywhere)."""

    temperature: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PROMPTS, 0.0))

    def request(self, klass: str) -> dict[str, Any]:
        return {
            "model": NAME,
            "messages": [{"role": "user", "content": PROMPTS[klass]}],
            "max_tokens": ANSWER_TOKENS,
            "temperature": self.temperature[klass],
            "extra_headers": {"x-specfleet-class": klass},
            "extra_body": {"ignore_eos": True},
        }


@contextmanager
def real_pod(cluster: LocalCluster, workdir: Path) -> Iterator[Clients]:
    """The real engine's pod (its SpecModel applied by the caller) and its clients, greedy;
    `send(clients)` once the pod is Ready."""
    options = ("--engine-command", COMMAND, "--ready-timeout", str(READY_TIMEOUT_S))
    workdir.mkdir(parents=True, exist_ok=True)
    with simulated_pods(cluster, NAMESPACE, SCENARIO, workdir, options):
        api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
        clients = Clients(api, NAMESPACE, NAME, NAME, parse_scenario(SCENARIO), time.time())
        try:
            yield clients
        finally:
            clients.stop.set()
            api.close()


def send(clients: Clients) -> Background:
    return Background(lambda: asyncio.run(clients.run(clients.scenario.duration_s)), clients.stop)
