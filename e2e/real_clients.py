"""The clients of a SpecModel served by the real vLLM (the tiny model drafting for itself, as
`specmodel` gives it): each class decodes greedily until told to sample. With the target as its
own drafter, greedy drafts are all accepted and sampled ones hardly any, so an acceptance
collapse is the clients' own doing, as it is in a fleet, not a script.

Kept apart from `real_engine`, which the pods' engine command imports: that needs no cluster.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from kubernetes import config

from e2e import real_engine
from e2e.cluster.harness import LocalCluster
from e2e.fleet import Background
from e2e.traffic import Traffic
from specfleet.scenario import parse_scenario

NAME = real_engine.SERVED_NAME
PROMPTS = {"code": "def add(a, b):", "chat": "Tell me about the weather."}
SAMPLED = 0.7
"""The temperature of a class's clients once they sample."""
FLOOR = 0.5
"""The `code` class's acceptance floor: sampled clients' acceptance collapses under it."""


def specmodel(source: str = real_engine.TINY_SOURCE, **spec: Any) -> dict[str, Any]:
    """The tiny model drafting for itself (`real_engine.PAIR_SOURCE`: the pair's target and its
    1-layer prefix as the draft, for which speculation pays on a CPU), its `code` class critical
    with an acceptance floor; `spec` adds fields such as the guard and the pod."""
    return real_engine.tiny_specmodel(
        {"method": "draft_model", "draftModel": source, "numSpeculativeTokens": 3},
        source,
        classes=[
            {"name": "code", "critical": True, "slo": {"minAcceptanceRate": FLOOR}},
            {"name": "chat"},
        ],
        defaultClass="chat",
        **spec,
    )


def scenario(rps: float) -> dict[str, Any]:
    """The simulator's scenario format; with a real engine only the arrivals and the class mix
    matter."""
    return {
        "duration_s": 3600,
        "traffic_rps": [[0, rps]],
        "classes": {klass: {"share": 0.5, "acceptance": 1.0} for klass in PROMPTS},
    }


def chat_request(klass: str, temperature: float, max_tokens: int) -> dict[str, Any]:
    """Answers are `max_tokens` long (`ignore_eos`: a random-weight model may end anywhere)."""
    return {
        "model": NAME,
        "messages": [{"role": "user", "content": PROMPTS[klass]}],
        "max_tokens": max_tokens,
        "temperature": temperature,
        "extra_headers": {"x-specfleet-class": klass},
        "extra_body": {"ignore_eos": True},
    }


@dataclass
class Clients(Traffic):
    """Each class's clients decode greedily or sampled as `temperature` says when a request is
    sent."""

    max_tokens: int = 16
    stream_share: float = 1.0
    """Every request streams: the guard's measured speedup is the TPOT of streams."""
    temperature: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PROMPTS, 0.0))

    def request(self, klass: str) -> dict[str, Any]:
        return chat_request(klass, self.temperature[klass], self.max_tokens)


def in_background(
    cluster: LocalCluster, namespace: str, rps: float, seconds: float, max_tokens: int = 16
) -> tuple[Clients, Background]:
    """The real `openai` clients of NAME at `rps`, greedy in both classes until told otherwise,
    for `seconds` in the background."""
    api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    scenario_ = parse_scenario(scenario(rps))
    clients = Clients(api, namespace, NAME, NAME, scenario_, time.time(), max_tokens=max_tokens)

    def run() -> Any:
        try:
            return asyncio.run(clients.run(seconds))
        finally:
            api.close()

    return clients, Background(run, clients.stop)
