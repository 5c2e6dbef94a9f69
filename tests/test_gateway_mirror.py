"""Mirroring to an experiment's arms (issue 18, same traffic): the client's answer and latency
never depend on an arm, the queue is bounded, the sample holds its shares, greedy outputs are
compared with the baseline arm's, hostile requests and arms break nothing, and a reload adds
and removes arms. Real servers on loopback: the fleet's gateway and its engine, arms on
127.0.0.2 and up (the testbed's engine simulator behind their own gateways where it matters)."""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from aiohttp import web
from pydantic import ValidationError

from specfleet.api.gateway import (
    MIRRORED_HEADER,
    SAMPLE_EXPERIMENT_HEADER,
    GatewayConfig,
    MirrorArm,
)
from specfleet.gateway.config import load_gateway_config
from specfleet.gateway.mirror import (
    Reservoir,
    is_greedy,
    sampled,
    word_prefix_agreement,
)
from specfleet.gateway.server import GatewayServer, Watch, running
from specfleet_testbed.engine.args import parse_vllm
from specfleet_testbed.engine.server import SimOptions, serve

CHAT = "/v1/chat/completions"
CLASSES = [{"name": "code", "match": {"headers": {"x-team": "code"}}}, {"name": "chat"}]
SAMPLE_TOKEN = "s3cr3t-sample-token"
GREEDY = {"model": "llama", "messages": [{"role": "user", "content": "hi"}], "temperature": 0}


def config(arms: dict[str, str] | None = None, **mirror: Any) -> GatewayConfig:
    doc: dict[str, Any] = {
        "specmodel": "m",
        "engine": "vllm",
        "servedName": "llama",
        "classes": CLASSES,
        "defaultClass": "chat",
    }
    if arms is not None:
        doc["mirror"] = {
            "experiment": "four-arms",
            "arms": [{"name": name, "url": url} for name, url in arms.items()],
            "baseline": next(iter(arms)),
            "sample": {"code": 1.0, "chat": 1.0},
            **({"sampleToken": SAMPLE_TOKEN} if "keepSample" in mirror else {}),
            **mirror,
        }
    return GatewayConfig.model_validate(doc)


def completion(content: str | None, calls: list[Any] | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
    choice = {"index": 0, "message": message, "finish_reason": "stop"}
    return {"object": "chat.completion", "choices": [choice], "usage": {"completion_tokens": 3}}


class Arm:
    """An arm's gateway stand-in: answers what `answer` says, or holds every request."""

    def __init__(self, answer: Callable[[dict[str, Any]], web.Response] | None = None) -> None:
        self.answer = answer or (lambda body: web.json_response(completion("the quick fox")))
        self.held = asyncio.Event()
        self.hold = False
        self.seen: list[tuple[dict[str, str], dict[str, Any]]] = []

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.seen.append((dict(request.headers), body))
        if self.hold:
            self.held.set()
            await asyncio.Event().wait()  # never answers
        return self.answer(body)


@asynccontextmanager
async def serving(handler: Any, host: str = "127.0.0.1") -> AsyncIterator[str]:
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post(CHAT, handler)
    runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=0.1)
    await runner.setup()
    await web.TCPSite(runner, host, 0).start()
    try:
        yield f"http://{host}:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


async def engine(request: web.Request) -> web.Response:
    """The fleet's own engine: answers at once."""
    await request.read()
    return web.json_response(completion("fleet answer"))


@asynccontextmanager
async def fleet(
    arms: dict[str, Arm], down: tuple[str, ...] = (), watch: Watch | None = None, **mirror: Any
) -> AsyncIterator[GatewayServer]:
    """The fleet's gateway mirroring to `arms` (served on 127.0.0.2, .3, ...) and to `down`
    arms that listen nowhere."""
    async with serving(engine) as engine_url:
        urls: dict[str, str] = {}
        async with _arms(arms, urls):
            urls.update(dict.fromkeys(down, "http://127.0.0.9:9"))
            async with running(config(urls, **mirror), engine_url, watch=watch) as gw:
                yield gw


@asynccontextmanager
async def _arms(arms: dict[str, Arm], urls: dict[str, str]) -> AsyncIterator[None]:
    if not arms:
        yield
        return
    (name, arm), *rest = arms.items()
    async with serving(arm.chat, f"127.0.0.{len(urls) + 2}") as url:
        urls[name] = url
        async with _arms(dict(rest), urls):
            yield


def value(gw: GatewayServer, name: str, **labels: str) -> float:
    return gw.metrics.registry.get_sample_value(name, labels) or 0.0


async def eventually(check: Callable[[], bool], seconds: float = 5.0) -> None:
    for _ in range(int(seconds / 0.01)):
        if check():
            return
        await asyncio.sleep(0.01)
    assert check(), "timed out"


async def post(
    http: httpx.AsyncClient, gw: GatewayServer, body: Any = GREEDY, **headers: str
) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return await http.post(gw.url + CHAT, content=content, headers=headers)


def sent(gw: GatewayServer, arm: str, klass: str = "chat") -> float:
    return value(gw, "specfleet_mirror_sent_total", arm=arm, **{"class": klass})


def dropped(gw: GatewayServer, reason: str) -> float:
    return value(gw, "specfleet_mirror_dropped_total", reason=reason)


def arm_errors(gw: GatewayServer, arm: str, reason: str) -> float:
    return value(gw, "specfleet_mirror_errors_total", arm=arm, reason=reason)


# ------------------------------------------------------------- the client never waits on an arm


async def test_a_stalled_arm_never_stalls_the_client() -> None:
    stalled = Arm()
    stalled.hold = True
    timings: dict[str, list[float]] = {"off": [], "on": []}
    async with httpx.AsyncClient(timeout=5.0) as http:
        async with serving(engine) as url, running(config(), url) as plain:
            for _ in range(30):
                started = time.perf_counter()
                baseline_answer = await post(http, plain)
                timings["off"].append(time.perf_counter() - started)
        async with fleet({"baseline": stalled}, concurrency=1, queueBound=4) as gw:
            for _ in range(30):
                started = time.perf_counter()
                answer = await post(http, gw)
                timings["on"].append(time.perf_counter() - started)
                assert answer.status_code == 200
                assert answer.json() == baseline_answer.json()
            assert stalled.held.is_set()  # the arm held a request all along
            assert dropped(gw, "queue_full") == 30 - 1 - 4
    off, on = statistics.median(timings["off"]), statistics.median(timings["on"])
    assert on < 3 * off + 0.05, (on, off)


async def test_an_arm_that_is_down_is_counted_and_the_others_still_served() -> None:
    up = Arm()
    async with fleet({"baseline": up}, down=("quantized",)) as gw, httpx.AsyncClient() as http:
        for _ in range(5):
            assert (await post(http, gw)).status_code == 200
        await eventually(lambda: arm_errors(gw, "quantized", "unreachable") == 5)
        assert sent(gw, "baseline") == sent(gw, "quantized") == 5
        assert len(up.seen) == 5
        assert value(gw, "specfleet_gateway_errors_total", stage="mirror") == 0


async def test_a_slow_arm_times_out_and_is_counted() -> None:
    slow = Arm()
    slow.hold = True
    async with fleet({"baseline": slow}, timeoutSeconds=0.1) as gw, httpx.AsyncClient() as http:
        await post(http, gw)
        await eventually(lambda: arm_errors(gw, "baseline", "timeout") == 1)


# ---------------------------------------------------------------------------------- sampling


@pytest.mark.parametrize("share", [0.05, 0.5, 1.0])
def test_the_sample_holds_its_share(share: float) -> None:
    n = 20_000
    hits = sum(sampled(number, share) for number in range(1, n + 1))
    sd = (n * share * (1 - share)) ** 0.5
    assert abs(hits - n * share) <= 4 * sd + 1e-9


async def test_each_class_is_sampled_at_its_own_share_and_the_arm_sees_the_class() -> None:
    arm = Arm()
    sample = {"code": 0.5}  # chat: not mirrored
    async with fleet({"baseline": arm}, sample=sample) as gw, httpx.AsyncClient() as http:
        for i in range(200):
            await post(http, gw, **({"x-team": "code"} if i % 2 else {}))
        await eventually(lambda: len(arm.seen) == sent(gw, "baseline", "code"))
        assert 50 - 4 * 5 <= len(arm.seen) <= 50 + 4 * 5  # 100 code requests at 0.5
        assert sent(gw, "baseline", "chat") == 0
    for headers, _ in arm.seen:
        assert headers["x-specfleet-class"] == "code"
        assert headers[MIRRORED_HEADER] == "four-arms"
        assert "x-team" not in headers  # only the class travels, not the client's headers


async def test_a_full_queue_drops_and_counts() -> None:
    stalled = Arm()
    stalled.hold = True
    async with (
        fleet({"baseline": stalled}, concurrency=2, queueBound=3) as gw,
        httpx.AsyncClient() as http,
    ):
        for _ in range(10):
            await post(http, gw)
        await eventually(lambda: len(stalled.seen) == 2)
        assert dropped(gw, "queue_full") == 10 - 2 - 3
        assert sent(gw, "baseline") == 2
    assert dropped(gw, "stopped") == 2 + 3  # in flight and queued when the gateway stopped


async def test_a_mirrored_request_is_never_mirrored_again() -> None:
    arm = Arm()
    async with fleet({"baseline": arm}) as gw, httpx.AsyncClient() as http:
        await post(http, gw, **{MIRRORED_HEADER: "other"})
        await post(http, gw)
        await eventually(lambda: len(arm.seen) == 1)
        await asyncio.sleep(0.05)
        assert len(arm.seen) == 1


# ----------------------------------------------------------------------- greedy comparison


@pytest.mark.parametrize(
    ("baseline", "arm", "agreement"),
    [("", "", 1.0), ("a b c d", "a b c d", 1.0), ("a b c d", "a b x d e", 2 / 5),
     ("a b", "a b c d", 2 / 4), ("a", "", 0.0)],
)  # fmt: skip
def test_word_prefix_agreement(baseline: str, arm: str, agreement: float) -> None:
    assert word_prefix_agreement(baseline.split(), arm.split()) == agreement


@pytest.mark.parametrize(
    ("temperature", "greedy"), [(0, True), (0.0, True), (None, False), (0.7, False), (False, False)]
)
def test_only_an_explicit_temperature_zero_is_greedy(temperature: Any, greedy: bool) -> None:
    body = {} if temperature is None else {"temperature": temperature}
    assert is_greedy(body) is greedy


def answering(content: str, calls: list[Any] | None = None) -> Arm:
    return Arm(lambda body: web.json_response(completion(content, calls)))


CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}


async def test_greedy_outputs_are_compared_with_the_baselines() -> None:
    arms = {
        "baseline": answering("the quick brown fox", [CALL]),
        "quantized": answering("the quick brown fox", [CALL]),
        "speculative": answering("the quick red fox", [CALL]),
        "both": answering("the quick brown fox"),
    }
    async with fleet(arms) as gw, httpx.AsyncClient() as http:
        await post(http, gw)
        await post(http, gw, {**GREEDY, "temperature": 0.7})  # sent, not compared
        await eventually(lambda: all(len(arm.seen) == 2 for arm in arms.values()))
        await eventually(lambda: compared(gw, "both") == 1)
        assert compared(gw, "baseline") == 0
        # the baseline: the 4 words of its text, then the call's name and its 2 words of arguments
        expected = {"quantized": (1, 1.0), "speculative": (0, 2 / 7), "both": (0, 4 / 7)}
        for name, (exact, agreement) in expected.items():
            assert compared(gw, name) == 1
            labels = {"arm": name, "class": "chat"}
            assert value(gw, "specfleet_mirror_exact_matches_total", **labels) == exact
            assert value(gw, "specfleet_mirror_agreement_total", **labels) == pytest.approx(
                agreement
            )


def compared(gw: GatewayServer, arm: str) -> float:
    return value(gw, "specfleet_mirror_compared_total", arm=arm, **{"class": "chat"})


async def test_arms_behind_their_own_gateways_measure_the_same_classes() -> None:
    """The testbed's engine simulator behind each arm's gateway: same seed, same greedy output;
    another seed drifts. Each arm's gateway counts the fleet's classes, streams included."""
    engine_args = parse_vllm(["m", "--served-model-name", "llama"], env={})
    async with (
        serve(engine_args, SimOptions(time_scale=0.0002, seed=1)) as same_sim,
        serve(engine_args, SimOptions(time_scale=0.0002, seed=1)) as base_sim,
        serve(engine_args, SimOptions(time_scale=0.0002, seed=2)) as other_sim,
        running(config(), base_sim.url) as base,
        running(config(), same_sim.url) as same,
        running(config(), other_sim.url) as other,
        serving(engine) as engine_url,
    ):
        arms = {"baseline": base.url, "same": same.url, "other": other.url}
        async with (
            running(config(arms, concurrency=1), engine_url) as gw,
            httpx.AsyncClient() as http,
        ):
            for i in range(6):
                body = {**GREEDY, "max_tokens": 24, "stream": i % 2 == 0}
                await post(http, gw, body, **({"x-team": "code"} if i < 2 else {}))
            await eventually(lambda: compared(gw, "other") == 4, seconds=10)
            assert compared(gw, "same") == 4
            assert value(gw, "specfleet_mirror_exact_matches_total", arm="same", **CHAT_LABEL) == 4
            assert value(gw, "specfleet_mirror_exact_matches_total", arm="other", **CHAT_LABEL) < 4
        for arm in (base, same, other):
            assert requests(arm, "code") == 2
            assert requests(arm, "chat") == 4
            assert value(arm, "specfleet_ttft_seconds_count", **CHAT_LABEL, pool="fleet") == 4
            assert value(arm, "specfleet_tpot_seconds_count", **CHAT_LABEL, pool="fleet") == 4


CHAT_LABEL = {"class": "chat"}


def requests(gw: GatewayServer, klass: str) -> float:
    return value(gw, "specfleet_requests_total", outcome="ok", pool="fleet", **{"class": klass})


# ------------------------------------------------------------------------------- hostile


async def test_hostile_requests_never_crash_the_mirror() -> None:
    arm = Arm()
    async with (
        fleet({"baseline": arm}, maxRequestBytes=4096) as gw,
        httpx.AsyncClient() as http,
    ):
        huge = {**GREEDY, "messages": [{"role": "user", "content": "x" * 100_000}]}
        assert (await post(http, gw, huge)).status_code == 200  # the fleet serves it
        assert (await post(http, gw, b"not json{")).status_code == 400
        assert (await post(http, gw, b"[1, 2]")).status_code == 400
        streamed = {**GREEDY, "stream": True, "stream_options": {"include_usage": True}}
        await post(http, gw, streamed)
        await eventually(lambda: len(arm.seen) == 1)
        await asyncio.sleep(0.05)
        assert len(arm.seen) == 1
        assert dropped(gw, "too_large") == 1
        _, body = arm.seen[0]
        assert body["stream"] is True  # the arm's gateway times its tokens
        assert "stream_options" not in body
        assert body["model"] == "llama"
        assert value(gw, "specfleet_gateway_errors_total", stage="mirror") == 0


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (lambda body: web.Response(text="<html>", content_type="text/html"), "unreadable"),
        (lambda body: web.Response(body=b"x" * (5 * 1024 * 1024)), "unreadable"),
        (lambda body: web.json_response({"error": {"message": "no"}}, status=500), "status"),
        (lambda body: web.json_response({"choices": "nonsense"}), "unreadable"),
    ],
)
async def test_hostile_answers_from_an_arm_are_counted(
    answer: Callable[[dict[str, Any]], web.Response], reason: str
) -> None:
    arms = {"baseline": Arm(), "quantized": Arm(answer)}
    async with fleet(arms) as gw, httpx.AsyncClient() as http:
        assert (await post(http, gw)).status_code == 200
        await eventually(lambda: arm_errors(gw, "quantized", reason) == 1)
        assert compared(gw, "quantized") == 0
        assert value(gw, "specfleet_gateway_errors_total", stage="mirror") == 0


# ------------------------------------------------------------------- the sample of prompts


def prompt(i: int, words: int = 1) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": f"p{i} " + "w " * words}], "max_tokens": 8}


def test_the_kept_sample_is_uniform_per_class_and_bounded_in_requests() -> None:
    firsts = 0
    for seed in range(200):
        reservoir = Reservoir(size=10, class_bytes=10**6, rng=random.Random(seed))
        for i in range(100):
            reservoir.offer("chat", prompt(i))
            reservoir.offer("code", prompt(1000 + i))
        lines = [json.loads(line) for line in reservoir.jsonl().splitlines()]
        by_class = {k: [r for r in lines if r["class"] == k] for k in ("chat", "code")}
        assert [len(rows) for rows in by_class.values()] == [10, 10]
        assert all(r["max_tokens"] == 8 for r in lines)
        firsts += sum(int(r["messages"][0]["content"].split()[0][1:]) % 1000 < 10 for r in lines)
    # each of the first ten prompts of a class stays with probability 1/10, as every other one
    assert abs(firsts / (200 * 20) - 0.1) < 0.03


def test_the_kept_sample_is_bounded_in_bytes_per_class() -> None:
    reservoir = Reservoir(size=1000, class_bytes=2000, rng=random.Random(1))
    for i in range(500):
        reservoir.offer("chat", prompt(i, words=i % 40))
        reservoir.offer("code", prompt(i, words=2000))  # each longer than the bound: none kept
    lines = reservoir.jsonl().splitlines(keepends=True)
    assert sum(len(line) for line in lines) <= 2000
    assert lines and all(json.loads(line)["class"] == "chat" for line in lines)


async def sample_of(
    http: httpx.AsyncClient, gw: GatewayServer, token: str = SAMPLE_TOKEN
) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"}
    return await http.get(gw.metrics_url + "/mirror/sample", headers=headers)


async def test_the_sample_is_kept_only_when_asked_and_served_on_the_metrics_port() -> None:
    arm = Arm()
    async with fleet({"baseline": arm}) as gw, httpx.AsyncClient() as http:
        await post(http, gw)
        await eventually(lambda: len(arm.seen) == 1)
        assert gw.proxy.mirroring.reservoir is None
        assert (await sample_of(http, gw)).status_code == 404
    async with fleet({"baseline": arm}, keepSample=3) as gw, httpx.AsyncClient() as http:
        for i in range(8):
            await post(http, gw, {**GREEDY, "messages": [{"role": "user", "content": f"q{i}"}]})
            await post(http, gw, GREEDY, **{"x-team": "code"})
        await eventually(lambda: len(arm.seen) == 1 + 16)
        served = await sample_of(http, gw)
        assert (await http.get(gw.url + "/mirror/sample")).status_code != 200  # not the proxy's
        # live prompts: only to the mirror's token
        for refused in (
            await sample_of(http, gw, "a" * 32),
            await http.get(gw.metrics_url + "/mirror/sample"),
        ):
            assert refused.status_code == 401 and "sampleToken" in refused.text
            assert refused.headers["WWW-Authenticate"] == "Bearer"
    assert served.status_code == 200 and served.headers[SAMPLE_EXPERIMENT_HEADER] == "four-arms"
    assert served.headers["content-type"].startswith("application/jsonl")
    rows = [json.loads(line) for line in served.text.splitlines()]
    assert sorted(r["class"] for r in rows) == ["chat"] * 3 + ["code"] * 3
    assert all(r["messages"][0]["content"].startswith("q") for r in rows if r["class"] == "chat")
    assert all(r["temperature"] == 0 and r["model"] == "llama" for r in rows)


async def test_a_mirror_that_stops_asking_drops_the_sample(tmp_path: Path) -> None:
    arm = Arm()
    path = tmp_path / "gateway.yaml"
    write = lambda doc: path.write_text(yaml.safe_dump(doc.to_wire()))  # noqa: E731
    watch = Watch(path, load_gateway_config, interval=0.02)
    async with fleet({"baseline": arm}, watch=watch, keepSample=5) as gw:
        url = gw.proxy.mirroring.mirror.arms[0].url  # type: ignore[union-attr]
        write(config({"baseline": url}, keepSample=5))  # the same ask: the sample stays
        async with httpx.AsyncClient() as http:
            await post(http, gw)
            await eventually(lambda: b"hi" in gw.proxy.mirroring.reservoir.jsonl())  # type: ignore[union-attr]
            write(config({"baseline": url}))
            await eventually(lambda: gw.proxy.mirroring.reservoir is None)
            assert (await sample_of(http, gw)).status_code == 404


# -------------------------------------------------------------------------------- reload


async def test_a_reload_adds_and_removes_arms(tmp_path: Path) -> None:
    first, second = Arm(), Arm()
    async with serving(second.chat, "127.0.0.5") as second_url:
        path = tmp_path / "gateway.yaml"
        write = lambda doc: path.write_text(yaml.safe_dump(doc.to_wire()))  # noqa: E731
        write(config())
        watch = Watch(path, load_gateway_config, interval=0.02)
        async with fleet({"first": first}, watch=watch) as gw, httpx.AsyncClient() as http:
            first_url = gw.proxy.mirroring.mirror.arms[0].url  # type: ignore[union-attr]
            write(config({"first": first_url, "second": second_url}))
            await eventually(lambda: gw.proxy.mirroring.mirror.arms[-1].name == "second")  # type: ignore[union-attr]
            await post(http, gw)
            await eventually(lambda: len(second.seen) == 1 and len(first.seen) == 1)
            write(config())  # mirroring off
            await eventually(lambda: gw.proxy.mirroring.mirror is None)
            await post(http, gw)
            await asyncio.sleep(0.05)
            assert len(first.seen) == len(second.seen) == 1


# -------------------------------------------------------------------------------- config


@pytest.mark.parametrize(
    "url",
    [
        "https://arm.ns.svc",
        "http://169.254.169.254",
        "http://10.0.0.1:8080",
        "http://example.com",
        "http://arm.ns.svc.evil.com.example",
        "http://user:pw@arm.ns.svc",
        "http://arm.ns.svc/v1",
        "http://arm.ns.svc?x=1",
        "file:///etc/passwd",
    ],
)
def test_an_arm_url_outside_the_cluster_is_refused(url: str) -> None:
    with pytest.raises(ValidationError):
        MirrorArm(name="a", url=url)


@pytest.mark.parametrize(
    "url", ["http://arm.ns.svc", "http://arm.ns.svc.cluster.local:80/", "http://127.0.0.2:8080"]
)
def test_arm_urls_in_the_cluster_are_accepted(url: str) -> None:
    assert MirrorArm(name="a", url=url).url == url.rstrip("/")


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"baseline": "nope"}, "is not one of the arms"),
        ({"sample": {"prose": 0.5}}, "classes that do not exist"),
        ({"sample": {"chat": 0.0}}, r"shares must be in \(0, 1\]"),
        ({"sample": {"chat": 1.5}}, r"shares must be in \(0, 1\]"),
        ({"arms": [{"name": "a", "url": "http://a.n.svc"}] * 2}, "unique"),
    ],
)
def test_a_mirror_config_that_cannot_work_is_refused(patch: dict[str, Any], message: str) -> None:
    doc = config({"a": "http://a.n.svc"}).to_wire()
    doc["mirror"].update(patch)
    with pytest.raises(ValidationError, match=message):
        GatewayConfig.model_validate(doc)
