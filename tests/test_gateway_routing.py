"""The gateway routes the classes its configuration sends to the plain pool: against a pair of
loopback engines (a speculative local one, a plain one), with the fallback to the local engine
when the pool cannot be reached (and the pool left alone for its back-off), a trial share served
locally, and the routing switched by a configuration reload."""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from specfleet.api.gateway import GatewayConfig, PlainRoute
from specfleet.gateway.config import load_gateway_config
from specfleet.gateway.proxy import ProxySettings
from specfleet.gateway.server import GatewayServer, Watch, running
from specfleet_testbed.engine.args import EngineConfig, parse_vllm
from specfleet_testbed.engine.server import EngineSimulator, SimOptions, serve
from test_gateway_backoff import Clock
from test_gateway_edges import Upstream, hang_up_mid_stream
from test_gateway_proxy import EAGLE3, MESSAGES, WEATHER, client, gateway_config, metric, scrape

OPTIONS = SimOptions(time_scale=0.0002, seed=7)
TOOLS = ["--enable-auto-tool-choice", "--tool-call-parser", "llama3_json"]


def engine(speculative: bool) -> EngineConfig:
    spec = ["--speculative-config", EAGLE3, "--per-request-spec-decode-metrics", "summary"]
    argv = ["m", "--served-model-name", "llama", *(spec if speculative else []), *TOOLS]
    return parse_vllm(argv, env={})


def routed(url: str | None, *classes: str, trial: dict[str, float] | None = None) -> GatewayConfig:
    """The test gateway's configuration, `classes` routed to the plain pool at `url`."""
    config = gateway_config("vllm")
    if url is None:
        return config
    route = PlainRoute(url=url, classes=list(classes), trial=trial or {})
    return config.model_copy(update={"plain_pool": route})


def unused_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port  # closed: a connection to it is refused


def blackhole() -> tuple[socket.socket, socket.socket]:
    """A listener that never accepts, its one-place queue taken: connections to its port never
    complete (a Service whose pods are gone and whose packets are dropped). Close both to free
    the port."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    queued = socket.create_connection(listener.getsockname())
    return listener, queued


@asynccontextmanager
async def engines() -> AsyncIterator[tuple[EngineSimulator, EngineSimulator]]:
    async with serve(engine(True), OPTIONS) as local, serve(engine(False), OPTIONS) as plain:
        yield local, plain


async def served(sim: EngineSimulator) -> float:
    return metric(await scrape(sim.url), "vllm:request_success_total")


async def send(gw: GatewayServer, cls: str, stream: bool, **options: Any) -> str:
    """One request of `cls` (`options` for the request); what the client got back."""
    oai = client(gw.url)
    extra: dict[str, Any] = {"extra_headers": {"x-specfleet-class": cls}, **options}
    if cls == "tools":
        extra = {"tools": [WEATHER], "tool_choice": "required", **options}
    if not stream:
        answer = await oai.chat.completions.create(model="llama", messages=MESSAGES, **extra)
        return answer.choices[0].finish_reason
    chunks = await oai.chat.completions.create(
        model="llama", messages=MESSAGES, stream=True, **extra
    )
    return "".join([c.choices[0].finish_reason or "" async for c in chunks if c.choices])


def requests(text: str, cls: str, pool: str, outcome: str = "ok") -> float:
    labels = {"class": cls, "pool": pool, "outcome": outcome}
    return metric(text, "specfleet_requests_total", **labels)


async def test_routed_classes_are_served_by_the_plain_pool_and_counted_as_its() -> None:
    async with (
        engines() as (local, plain),
        running(routed(plain.url, "code", "tools"), local.url) as gw,
    ):
        for cls in ("code", "tools", "chat"):
            for stream in (True, True, False):
                assert await send(gw, cls, stream) in ("stop", "tool_calls", "length")
        text = await scrape(gw.metrics_url)
        assert (await served(plain), await served(local)) == (6, 3)
        assert [requests(text, c, "plain") for c in ("code", "tools", "chat")] == [3, 3, 0]
        assert [requests(text, c, "fleet") for c in ("code", "tools", "chat")] == [0, 0, 3]
        # the plain pool drafts nothing; the fleet's engine still drafts for chat
        assert metric(text, "specfleet_spec_draft_tokens_total", pool="plain") == 0
        assert metric(text, "specfleet_spec_draft_tokens_total", pool="fleet") > 0
        # streams' latency and the tool calls' validity are measured for the plain pool too
        assert metric(text, "specfleet_ttft_seconds_count", **{"class": "code", "pool": "plain"})
        assert metric(text, "specfleet_tool_calls_total", pool="plain", valid="true") > 0
        assert metric(text, "specfleet_gateway_plain_pool_fallbacks_total") == 0


async def test_an_unreachable_plain_pool_is_served_locally_and_counted_never_failed() -> None:
    config = routed(f"http://127.0.0.1:{unused_port()}", "code")
    async with engines() as (local, _), running(config, local.url) as gw:
        for stream in (True, False):
            assert await send(gw, "code", stream) in ("stop", "length")
        text = await scrape(gw.metrics_url)
        assert await served(local) == 2
        assert requests(text, "code", "fleet") == 2 and requests(text, "code", "plain") == 0
        fallbacks = "specfleet_gateway_plain_pool_fallbacks_total"
        assert metric(text, fallbacks, **{"class": "code"}) == 2
        assert metric(text, "specfleet_spec_draft_tokens_total", pool="fleet") > 0


async def test_an_unreachable_plain_pool_is_not_tried_during_its_back_off_then_used_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "specfleet.gateway.plain")
    clock, connect_timeout = Clock(), ProxySettings.connect_timeout
    listener, queued = blackhole()
    port = listener.getsockname()[1]
    async with (
        serve(engine(True), OPTIONS) as local,
        running(routed(f"http://127.0.0.1:{port}", "code"), local.url) as gw,
    ):
        assert gw.proxy.routing.plain is not None
        gw.proxy.routing.plain.backoff.clock = clock
        with listener, queued:
            first = await timed(send(gw, "code", True, max_tokens=16))
            later = [
                await timed(send(gw, "code", stream=i % 5 == 0, max_tokens=16)) for i in range(10)
            ]
        # An attempt waits out the whole timeout on a blackholed pool; these tried none.
        assert first >= connect_timeout
        assert max(later) < connect_timeout / 2, later
        text = await scrape(gw.metrics_url)
        assert await served(local) == 11 and requests(text, "code", "fleet") == 11
        fallbacks = "specfleet_gateway_plain_pool_fallbacks_total"
        assert metric(text, fallbacks, **{"class": "code", "reason": "unreachable"}) == 1
        assert metric(text, fallbacks, **{"class": "code", "reason": "backing_off"}) == 10
        async with serve(engine(False), OPTIONS, port=port) as plain:
            clock.now += 1.0  # the first back-off has passed: one request probes the pool
            for stream in (True, False):
                await send(gw, "code", stream)
            assert (await served(plain), await served(local)) == (2, 11)
            text = await scrape(gw.metrics_url)
            assert requests(text, "code", "plain") == 2
            assert metric(text, fallbacks) == 11
    said = [(r.levelname, r.getMessage()) for r in caplog.records if r.name.endswith(".plain")]
    assert [level for level, _ in said] == ["WARNING", "INFO"], said


async def timed(request: Any) -> float:
    started = time.perf_counter()
    await request
    return time.perf_counter() - started


async def test_a_class_on_trial_has_its_share_served_by_the_fleet() -> None:
    async with engines() as (local, plain):
        config = routed(plain.url, "code", "chat", trial={"code": 0.5})
        async with running(config, local.url) as gw:
            gw.proxy.trial_draws.seed(29)
            for i in range(40):
                await send(gw, "code", stream=i % 10 == 0, max_tokens=16)
            for stream in (True, False):
                await send(gw, "chat", stream)  # routed, not on trial
            text = await scrape(gw.metrics_url)
        on_trial, off = requests(text, "code", "fleet"), requests(text, "code", "plain")
        assert on_trial + off == 40 and 8 <= on_trial <= 32  # 0.5 of 40, within 4 sd
        assert (await served(local), await served(plain)) == (on_trial, off + 2)
        assert [requests(text, "chat", pool) for pool in ("fleet", "plain")] == [0, 2]
        # served by the fleet, a trial speculates and is measured as the fleet's
        drafts = "specfleet_spec_draft_tokens_total"
        assert metric(text, drafts, **{"class": "code", "pool": "fleet"}) > 0
        assert metric(text, drafts, pool="plain") == 0
        assert metric(text, "specfleet_gateway_plain_pool_fallbacks_total") == 0


async def test_a_reloaded_configuration_switches_the_routing_without_a_restart(
    tmp_path: Path,
) -> None:
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(routed(None).to_wire()))
    watch = Watch(path, load_gateway_config, interval=0.02)
    async with engines() as (local, plain), running(routed(None), local.url, watch=watch) as gw:
        await send(gw, "code", True)
        assert (await served(local), await served(plain)) == (1, 0)
        await reload(gw, path, routed(plain.url, "code"))
        await send(gw, "code", True)
        assert (await served(local), await served(plain)) == (1, 1)
        await reload(gw, path, routed(None))
        await send(gw, "code", True)
        assert (await served(local), await served(plain)) == (2, 1)


async def reload(gw: GatewayServer, path: Path, config: GatewayConfig) -> None:
    path.with_suffix(".new").write_text(yaml.safe_dump(config.to_wire()))
    path.with_suffix(".new").replace(path)  # a new inode, as a ConfigMap update swaps it
    for _ in range(200):
        if gw.proxy.routing.config == config:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the configuration was not reloaded")


async def test_a_client_that_hangs_up_cancels_the_plain_pools_request() -> None:
    async with (
        Upstream().serve() as local,
        Upstream().serve() as plain,
        running(routed(plain.url, "code"), local.url) as gw,
    ):
        await hang_up_mid_stream(gw, local, plain)
        assert (plain.cancelled, plain.finished, local.bodies) == (1, 0, [])
        assert requests(await scrape(gw.metrics_url), "code", "plain", "cancelled") == 1


async def test_the_routed_classes_plain_series_exist_before_any_request() -> None:
    async with engines() as (local, plain), running(routed(plain.url, "code"), local.url) as gw:
        text = await scrape(gw.metrics_url)
    assert 'specfleet_requests_total{class="code",outcome="ok",pool="plain"} 0.0' in text
    assert 'class="chat",outcome="ok",pool="plain"' not in text


@pytest.mark.parametrize(
    ("route", "error"),
    [
        ({"url": "http://127.0.0.1:1", "classes": ["cod"]}, "plainPool.classes names classes"),
        ({"url": "http://10.0.0.7:80", "classes": ["code"]}, "host must be loopback or a Service"),
        ({"url": "http://m-plain.ns.svc/v1", "classes": ["code"]}, "no path"),
        ({"url": "http://m-plain.ns.svc", "classes": []}, "at least 1 item"),
    ],
)
def test_a_route_to_an_unknown_class_or_outside_the_cluster_is_refused(
    route: dict[str, Any], error: str
) -> None:
    with pytest.raises(ValidationError, match=error):
        GatewayConfig.model_validate({**gateway_config("vllm").to_wire(), "plainPool": route})


@pytest.mark.parametrize(
    ("trial", "error"),
    [
        (
            {"chat": 0.5},
            r"trial names classes not routed to the plain pool: \['chat'\]; add them to "
            "classes or drop them from trial",
        ),
        ({"code": 0.0}, r"shares must be in \(0, 1\]: code"),
        ({"code": 1.5}, r"shares must be in \(0, 1\]: code"),
    ],
)
def test_a_trial_of_a_class_not_routed_or_outside_0_1_is_refused(
    trial: dict[str, float], error: str
) -> None:
    route = {"url": "http://m-plain.ns.svc:80", "classes": ["code"], "trial": trial}
    with pytest.raises(ValidationError, match=error):
        GatewayConfig.model_validate({**gateway_config("vllm").to_wire(), "plainPool": route})


def test_a_route_without_a_trial_writes_none() -> None:
    """A gateway from before trials refuses unknown fields: an empty trial is left out."""
    route = PlainRoute(url="http://m-plain.ns.svc:80", classes=["code"])
    assert route.to_wire() == {"url": "http://m-plain.ns.svc:80", "classes": ["code"]}
    trial = route.model_copy(update={"trial": {"code": 0.25}})
    assert PlainRoute.model_validate(trial.to_wire()) == trial
