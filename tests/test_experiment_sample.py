"""The capacity phase's sample of prompts: taken from a Ready fleet pod's gateway (a real one,
on loopback), made a request file `specfleet experiment capacity` replays: one API, no prompt
in two classes, every class kept when the file is cut to what a ConfigMap holds."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from conftest import experiment_doc
from specfleet.api.validation import parse_specexperiment
from specfleet.experiment.capacity_job import REQUESTS_KEY, render_requests
from specfleet.experiment.replay import check_requests, load_requests, request_line
from specfleet.experiment.sample import (
    REQUESTS_BYTES,
    SampleUnavailable,
    get_sample,
    replayable,
    sample_urls,
    take_sample,
)
from test_gateway_mirror import GREEDY, SAMPLE_TOKEN, Arm, eventually, fleet, post


def line(klass: str, content: str | None = None, **body: Any) -> str:
    request = body or {"messages": [{"role": "user", "content": content}], "max_tokens": 16}
    return json.dumps({**request, "class": klass}) + "\n"


def test_the_sample_keeps_its_most_common_api_and_drops_prompts_two_classes_share() -> None:
    jsonl = (
        line("chat", "hello") + line("chat", "shared") + line("code", "shared")
        + line("code", "def f():") + line("code", "def f():")
        + line("chat", prompt="a completion") + "not json\n" + line("", "no class")
    )  # fmt: skip
    requests = replayable(jsonl)
    assert [(r.class_name, r.messages[0]["content"]) for r in requests if r.messages] == [
        ("chat", "hello"), ("code", "def f():"), ("code", "def f():")
    ]  # fmt: skip
    assert len(requests) == 3 and check_requests(requests) == []


def test_a_sample_cut_to_its_budget_keeps_every_class() -> None:
    jsonl = "".join(line("chat", f"chat {i} " + "x" * 500) for i in range(200))
    jsonl += "".join(line("code", f"code {i}") for i in range(3))
    budget = 20 * len(request_line(replayable(line("chat", "chat 0 " + "x" * 500))[0]))
    requests = replayable(jsonl, budget)
    assert sum(len(request_line(r).encode()) for r in requests) <= budget
    assert sorted({r.class_name for r in requests}) == ["chat", "code"]
    assert sum(r.class_name == "code" for r in requests) == 3


@pytest.mark.parametrize("jsonl", ["", "garbage\n", line("chat", "x") + line("code", "x")])
def test_a_sample_with_nothing_to_replay_is_unavailable_never_empty(jsonl: str) -> None:
    with pytest.raises(SampleUnavailable):
        replayable(jsonl)


def pod(name: str, ip: str, ready: bool = True, app: str = "specfleet-engine") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": app}},
        "status": {
            "podIP": ip,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def test_the_sample_is_taken_from_ready_fleet_pods_first_to_last() -> None:
    pods = [
        pod("m-c", "10.0.0.3"),
        pod("m-a", "10.0.0.1", ready=False),
        pod("m-canary", "10.0.0.9", app="specfleet-engine-canary"),  # a canary does not mirror
        pod("m-b", "fd00::2"),
    ]
    urls = sample_urls(pods)
    assert urls == ["http://[fd00::2]:9090/mirror/sample", "http://10.0.0.3:9090/mirror/sample"]
    answers = {urls[0]: SampleUnavailable("HTTP 404"), urls[1]: line("chat", "hi")}

    def fetch(url: str, experiment: str, token: str) -> str:
        assert token == "t" * 32
        answer = answers[url]
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert [r.class_name for r in take_sample(urls, "x", "t" * 32, fetch)] == ["chat"]
    del answers[urls[1]]
    with pytest.raises(SampleUnavailable, match="HTTP 404") as failed:
        take_sample(urls[:1], "x", "t" * 32, fetch)
    assert urls[0] in str(failed.value)
    with pytest.raises(SampleUnavailable, match="no Ready pod"):
        take_sample([], "x", "t" * 32, fetch)


async def test_the_gateways_sample_becomes_the_file_the_load_tests_replay(tmp_path: Path) -> None:
    arm = Arm()
    async with fleet({"baseline": arm}, keepSample=4) as gw, httpx.AsyncClient() as client:
        for i in range(6):
            await post(client, gw, {**GREEDY, "messages": [{"role": "user", "content": f"q{i}"}]})
            await post(client, gw, GREEDY, **{"x-team": "code"})
        await eventually(lambda: len(arm.seen) == 12)
        url = gw.metrics_url + "/mirror/sample"
        with httpx.Client() as http:
            jsonl = await asyncio.to_thread(get_sample, http, url, "four-arms", SAMPLE_TOKEN)
            with pytest.raises(SampleUnavailable, match="experiment four-arms's"):
                await asyncio.to_thread(get_sample, http, url, "another", SAMPLE_TOKEN)
            with pytest.raises(SampleUnavailable, match="HTTP 401"):
                await asyncio.to_thread(get_sample, http, url, "four-arms", "w" * 32)
    requests = replayable(jsonl)
    # code's one prompt, kept four times, is still one class's: chat's four and code's four
    assert sorted(r.class_name for r in requests) == ["chat"] * 4 + ["code"] * 4
    configmap = render_requests(parse_specexperiment(experiment_doc()), requests)
    path = tmp_path / REQUESTS_KEY
    path.write_text(configmap["data"][REQUESTS_KEY])
    assert len(load_requests(path)) == 8
    assert len(path.read_bytes()) <= REQUESTS_BYTES


def test_a_gateway_that_does_not_answer_is_unavailable() -> None:
    with httpx.Client() as http, pytest.raises(SampleUnavailable, match="ConnectError"):
        get_sample(http, "http://127.0.0.1:9/mirror/sample", "x", "t" * 32)
