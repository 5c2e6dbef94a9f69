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


MAX_TOKENS = 64
"""A client's limit: over the e2e scenarios' answers (48 tokens), and what an experiment's load
test then asks of each sampled request, as long as it allowed (guidellm sends `ignore_eos`, and
the simulator, as vLLM, answers to the limit: 4096 made every load-test answer a minute long)."""


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
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    """The serving pods by target URL, as last listed."""
    gone: dict[str, float] = field(default_factory=dict)
    """When each pod that served was first seen terminating or gone (Unix time), by name."""

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
            served = {f"http://{p['status']['podIP']}:8080/v1": p for p in pods if serving(p)}
            names = {p["metadata"]["name"] for p in served.values()}
            for pod in self.pods.values():
                if pod["metadata"]["name"] not in names:
                    self.gone.setdefault(pod["metadata"]["name"], time.time())
            self.pods, self._targets = served, list(served)
            if self._targets:
                self.ready.set()
            await asyncio.sleep(0.3)

    def request(self, klass: str) -> dict[str, Any]:
        """The chat completion request a client of `klass` sends (the simulator decides the
        answer's length, under MAX_TOKENS)."""
        kwargs: dict[str, Any] = {
            "model": self.model,
            "messages": [{"role": "user", "content": f"a {klass} request " * 20}],
            "max_tokens": MAX_TOKENS,
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


@dataclass
class LongStream:
    """One stream of a minute or more, and what became of it."""

    pod: str
    started: float
    tokens_asked: int
    ended: float = 0.0
    tokens: int = 0
    finish: str | None = None
    error: str | None = None
    pod_gone: float | None = None
    """When its pod was first seen terminating or gone."""

    def whole(self) -> bool:
        """Run to its limit: not cut by a pod's termination or anything else."""
        return self.error is None and self.finish == "length" and self.tokens == self.tokens_asked

    def crossed(self, moment: float | None) -> bool:
        return moment is not None and self.started < moment < self.ended


LONG_STREAM_TOKENS = {"on": 9500, "off": 4800}
"""Tokens for about 65 s on the simulator, by the pod's speculation (a step of 15 ms makes
one token without it, two and more with it)."""


@dataclass
class LongStreams(Traffic):
    """A stream of a minute or more started every `every` seconds on a Ready pod in turn
    (`ignore_eos`: the answer runs to max_tokens), until stopped: what a flip's or a rollout
    step's pod terminations must let finish. Its report is `streams`."""

    every: float = 5.0
    klass: str = "chat"
    streams: list[LongStream] = field(default_factory=list)

    async def run(self, seconds: float) -> TrafficReport:
        stop_at = time.time() + seconds
        tasks: set[asyncio.Task[None]] = set()
        refresh = asyncio.create_task(self._refresh_targets(stop_at + 120))
        await asyncio.wait_for(self.ready.wait(), 30)
        while time.time() < stop_at and not self.stop.is_set():
            target = self._pick()
            if target is not None:
                task = asyncio.create_task(self._long(target))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            await asyncio.sleep(self.every)
        await asyncio.gather(*tasks)
        refresh.cancel()
        return self.report

    async def _long(self, target: str) -> None:
        pod = self.pods[target]
        labels = pod["metadata"].get("labels") or {}
        tokens = LONG_STREAM_TOKENS[labels.get("specfleet.dev/speculation", "on")]
        stream = LongStream(pod["metadata"]["name"], time.time(), tokens)
        self.streams.append(stream)
        kwargs = self.request(self.klass) | {"max_tokens": tokens}
        kwargs.pop("tools", None)  # an answer, not a tool call
        openai = AsyncOpenAI(base_url=target, api_key="unused", max_retries=0, timeout=300)
        try:
            chunks = await openai.chat.completions.create(
                stream=True, stream_options={"include_usage": True},
                extra_body={"ignore_eos": True}, **kwargs,
            )  # fmt: skip
            async for chunk in chunks:
                if chunk.choices and chunk.choices[0].finish_reason:
                    stream.finish = chunk.choices[0].finish_reason
                if chunk.usage:
                    stream.tokens = chunk.usage.completion_tokens
        except (APIError, httpx.HTTPError) as exc:
            stream.error = f"{exc}{f' ({exc.__cause__!r})' if exc.__cause__ else ''}"[:300]
        finally:
            stream.ended = time.time()
            await openai.close()


def serving(pod: dict[str, Any]) -> bool:
    status = pod.get("status", {})
    if "deletionTimestamp" in pod["metadata"] or not status.get("podIP"):
        return False
    return any(c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions", []))


def _client(base_url: str) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=60)
