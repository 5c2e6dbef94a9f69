"""A traffic generator for e2e tests and the demo: the scenario's class mix, sent with the real
`openai` client to the gateways of a SpecModel's Ready pods (kwok pods have loopback IPs; there
is no kube-proxy, so it balances over the pods itself, like a client-side load balancer)."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx
from kubernetes import client
from openai import APIError, AsyncOpenAI

from specfleet.scenario import Scenario

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city"],
            },
        },
    }
]


@dataclass
class TrafficReport:
    sent: Counter[str] = field(default_factory=Counter)
    ok: Counter[str] = field(default_factory=Counter)
    failed: Counter[str] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)


@dataclass
class Traffic:
    api: client.ApiClient
    namespace: str
    specmodel: str
    model: str
    scenario: Scenario
    epoch: float
    """Unix time of scenario t=0, shared with the simulated pods."""
    seed: int = 0
    stop: threading.Event = field(default_factory=threading.Event)
    """Set to end the traffic early; requests in flight finish."""
    report: TrafficReport = field(default_factory=TrafficReport)
    stream_share: float = 0.5
    """The share of requests that stream (only a stream has a TTFT and a TPOT)."""
    _targets: list[str] = field(default_factory=list)
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once a pod is ready to take traffic."""
    _next: int = 0

    async def run(self, seconds: float) -> TrafficReport:
        stop_at = time.time() + seconds
        rng = random.Random(self.seed)
        clients: dict[str, AsyncOpenAI] = {}
        tasks: set[asyncio.Task[None]] = set()
        refresh = asyncio.create_task(self._refresh_targets(stop_at))
        await asyncio.wait_for(self.ready.wait(), 30)
        start, end = time.time() - self.epoch, stop_at - self.epoch
        for t, klass in self.scenario.arrivals(rng, start, end):
            await asyncio.sleep(max(0.0, self.epoch + t - time.time()))
            if self.stop.is_set():
                break
            target = self._pick()
            if target is None:
                self.report.failed[klass] += 1
                self.report.errors.append(f"{time.strftime('%H:%M:%S')} {klass}: no ready pod")
                continue
            openai = clients.setdefault(target, _client(target))
            task = asyncio.create_task(self._one(openai, klass, rng.random() < self.stream_share))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        await asyncio.gather(*tasks)
        refresh.cancel()
        for openai in clients.values():
            await openai.close()
        return self.report

    def _pick(self) -> str | None:
        if not self._targets:
            return None
        self._next = (self._next + 1) % len(self._targets)
        return self._targets[self._next]

    async def _refresh_targets(self, stop_at: float) -> None:
        """Ready, not terminating pods the SpecModel's Service selects, as its endpoints would
        list them (not the plain pool's: no gateway, their clients are the fleet's gateways):
        the stand-in kubelet (`specfleet-testbed pods`) marks a pod Ready once its gateway
        answers /health."""
        core = client.CoreV1Api(self.api)
        selector = (
            f"app.kubernetes.io/instance={self.specmodel},app.kubernetes.io/managed-by=specfleet"
        )
        while time.time() < stop_at:
            listed = await asyncio.to_thread(
                core.list_namespaced_pod, self.namespace, label_selector=selector
            )
            pods = self.api.sanitize_for_serialization(listed)["items"]
            self._targets = [f"http://{p['status']['podIP']}:8080/v1" for p in pods if serving(p)]
            if self._targets:
                self.ready.set()
            await asyncio.sleep(0.3)

    def request(self, klass: str) -> dict[str, Any]:
        """The chat completion request a client of `klass` sends (the simulator decides the
        answer's length)."""
        kwargs: dict[str, Any] = {
            "model": self.model,
            "messages": [{"role": "user", "content": f"a {klass} request " * 20}],
            "max_tokens": 4096,
            "extra_headers": {"x-specfleet-class": klass},
        }
        if self.scenario.classes[klass].tool_call_rate > 0:
            kwargs["tools"] = TOOLS
        return kwargs

    async def _one(self, openai: AsyncOpenAI, klass: str, stream: bool) -> None:
        self.report.sent[klass] += 1
        kwargs = self.request(klass)
        try:
            if stream:
                async for _ in await openai.chat.completions.create(stream=True, **kwargs):
                    pass
            else:
                await openai.chat.completions.create(**kwargs)
            self.report.ok[klass] += 1
        except (APIError, httpx.HTTPError) as exc:
            self.report.failed[klass] += 1
            cause = f" ({exc.__cause__!r})" if exc.__cause__ else ""
            at = time.strftime("%H:%M:%S")
            self.report.errors.append(f"{at} {klass} via {openai.base_url}: {exc}{cause}"[:300])


def serving(pod: dict[str, Any]) -> bool:
    status = pod.get("status", {})
    if "deletionTimestamp" in pod["metadata"] or not status.get("podIP"):
        return False
    return any(c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions", []))


def _client(base_url: str) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=60)
