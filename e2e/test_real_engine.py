"""The real gateway (`specfleet gateway`) in front of a real vLLM (its CPU build, the tiny local
model drafting for itself) with real speculative decoding, driven by the real `openai` client.

One engine for the module: it takes about a minute to start and 3.5 GiB while it runs.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from openai import OpenAI

from e2e import real_clients, real_engine
from specfleet.api.validation import parse_specmodel

K = 3
# The model becomes the local target and so does the draft: with the target drafting for
# itself, greedy decoding accepts every draft and sampling almost none.
SPECMODEL = real_engine.tiny_specmodel(
    {"method": "draft_model", "draftModel": "local/tiny", "numSpeculativeTokens": K},
    classes=[{"name": "code", "critical": True}, {"name": "chat"}],
    defaultClass="chat",
)
MAX_TOKENS = 24
SETTLE_S = 10.0
PROMPTS = {
    "code": ["def add(a, b):", "import json\nprint(json.dumps(", "class Engine:\n    def"],
    "chat": ["Tell me about the weather.", "What is a draft token?", "Say hello."],
}
Samples = dict[str, dict[str, float]]
# The gateway's per-class counters and the engine's own counters for the same quantity.
GATEWAY_TO_ENGINE = {
    "specfleet_spec_draft_tokens_total": "vllm:spec_decode_num_draft_tokens_total",
    "specfleet_spec_accepted_tokens_total": "vllm:spec_decode_num_accepted_tokens_total",
    "specfleet_spec_steps_total": "vllm:spec_decode_num_drafts_total",
    "specfleet_output_tokens_total": "vllm:generation_tokens_total",
    "specfleet_requests_total": "vllm:request_success_total",
}


@dataclass
class Served:
    engine: real_engine.RealEngine
    gateway_metrics: str
    client: OpenAI

    def snapshot(self) -> Snapshot:
        return Snapshot(
            real_engine.samples(self.engine.metrics()),
            real_engine.samples(_get(self.gateway_metrics)),
        )


@dataclass
class Snapshot:
    engine: Samples
    gateway: Samples


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    work = tmp_path_factory.mktemp("real-engine")
    spec_file = work / "specmodel.yaml"
    spec_file.write_text(yaml.safe_dump(SPECMODEL))
    build = real_engine.build()
    args = real_engine.engine_args(parse_specmodel(SPECMODEL), build, real_engine.free_port())
    with (
        real_engine.running(build, args, work / "vllm.log") as engine,
        gateway(engine.url, spec_file, work / "gateway.log") as (url, metrics_url),
    ):
        client = OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
        yield Served(engine, f"{metrics_url}/metrics", client)


@contextmanager
def gateway(upstream: str, spec_file: Path, log: Path) -> Iterator[tuple[str, str]]:
    """`specfleet gateway --specmodel` on loopback; yields its proxy and metrics URLs."""
    port, metrics_port = real_engine.free_port(), real_engine.free_port()
    argv = [str(Path(sys.executable).parent / "specfleet"), "gateway", "--upstream", upstream]
    argv += ["--specmodel", str(spec_file), "--listen", f"127.0.0.1:{port}"]
    argv += ["--metrics-listen", f"127.0.0.1:{metrics_port}"]
    with log.open("wb") as sink:
        process = subprocess.Popen(
            argv, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
        )
    metrics_url = f"http://127.0.0.1:{metrics_port}"
    try:
        real_engine.wait_healthy(process, f"{metrics_url}/healthz", log, 30, "specfleet gateway")
        yield f"http://127.0.0.1:{port}", metrics_url
    finally:
        real_engine.stop(process)


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


def delta(
    after: dict[str, dict[str, float]], before: dict[str, dict[str, float]], name: str
) -> dict[str, float]:
    return {k: v - before.get(name, {}).get(k, 0.0) for k, v in after.get(name, {}).items()}


def ask(
    served: Served, klass: str, prompt: str, temperature: float, stream: bool, **body: Any
) -> None:
    """One chat completion through the gateway; `ignore_eos` keeps every answer MAX_TOKENS long
    (a random-weight model may emit EOS anywhere)."""
    request: dict[str, Any] = {
        "model": real_engine.SERVED_NAME,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": MAX_TOKENS,
        "temperature": temperature,
        "extra_headers": {"x-specfleet-class": klass},
        "extra_body": {"ignore_eos": True, **body},
    }
    if stream:
        chunks = list(served.client.chat.completions.create(stream=True, **request))
        assert any(c.choices and c.choices[0].finish_reason == "length" for c in chunks)
    else:
        answer = served.client.chat.completions.create(**request)
        assert answer.usage is not None and answer.usage.completion_tokens == MAX_TOKENS


def mismatches(before: Snapshot, after: Snapshot) -> dict[str, tuple[float, float]]:
    """Counter -> (gateway delta summed over classes, engine delta), where they differ."""
    out = {}
    for ours, theirs in GATEWAY_TO_ENGINE.items():
        gateway_total = sum(delta(after.gateway, before.gateway, ours).values())
        engine_total = sum(delta(after.engine, before.engine, theirs).values())
        if gateway_total != engine_total:
            out[ours] = (gateway_total, engine_total)
    return out


def assert_gateway_matches_engine(served: Served, before: Snapshot) -> Snapshot:
    """Each side counts a request as it ends, on its own schedule: compare until they agree,
    for up to SETTLE_S seconds, then name every counter that does not. Returns the last
    snapshot."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        after = served.snapshot()
        off = mismatches(before, after)
        if not off or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert not off, f"gateway vs engine deltas: {off}"
    return after


def test_per_class_counts_sum_to_the_engines_counters(served: Served) -> None:
    before = served.snapshot()
    for klass, prompts in PROMPTS.items():
        for i, prompt in enumerate(prompts):
            temperature = 0.0 if i % 2 == 0 else 0.7
            ask(served, klass, prompt, temperature, stream=False)
            ask(served, klass, prompt, temperature, stream=True)
            ask(
                served,
                klass,
                prompt,
                temperature,
                stream=True,
                stream_options={"include_usage": True},
            )
    after = assert_gateway_matches_engine(served, before)
    drafts = delta(after.gateway, before.gateway, "specfleet_spec_draft_tokens_total")
    assert drafts.get("code", 0) > 0 and drafts.get("chat", 0) > 0
    requests = delta(after.gateway, before.gateway, "specfleet_requests_total")
    assert requests == {"code": 9, "chat": 9}


def test_a_stream_with_empty_stream_options_is_counted(served: Served) -> None:
    """vLLM sends no usage chunk for `stream_options: {}` unless the gateway asks for one."""
    before = served.snapshot()
    ask(served, "code", PROMPTS["code"][0], 0.0, stream=True, stream_options={})
    ask(
        served,
        "chat",
        PROMPTS["chat"][0],
        0.0,
        stream=True,
        stream_options={"continuous_usage_stats": True},
    )
    assert_gateway_matches_engine(served, before)


def test_sampling_collapses_acceptance_in_its_class(served: Served) -> None:
    """The target drafting for itself: greedy `code` accepts nearly every draft, sampled `chat`
    nearly none. A real collapse, per class, in the gateway's counters."""
    before = served.snapshot()
    for prompt in PROMPTS["code"]:
        ask(served, "code", prompt, 0.0, stream=True)
    # Sampled acceptance is a draw: three requests once read 0.25 and twelve 0.22, so each
    # prompt is sampled four times and the collapse is judged as the guard judges it: under the
    # floor the real clients' SpecModel sets.
    for prompt in PROMPTS["chat"] * 4:
        ask(served, "chat", prompt, 0.7, stream=True)
    after = served.snapshot()
    drafted = delta(after.gateway, before.gateway, "specfleet_spec_draft_tokens_total")
    accepted = delta(after.gateway, before.gateway, "specfleet_spec_accepted_tokens_total")
    rate = {klass: accepted[klass] / drafted[klass] for klass in PROMPTS}
    assert rate["code"] >= 0.9, rate
    assert rate["chat"] < real_clients.FLOOR, rate


def test_rendered_args_map_to_the_tiny_model_on_cpu() -> None:
    """What `engine_args` keeps, replaces and drops of a GPU SpecModel's rendered args."""
    build = real_engine.Build(vllm=Path("/engine/vllm"), models=Path("/models"))
    specmodel = real_engine.tiny_specmodel(
        {
            "method": "draft_model",
            "draftModel": "org/draft",
            "numSpeculativeTokens": 4,
            "draftTensorParallelSize": 1,
        },
        model={
            "source": "org/big",
            "servedName": "big",
            "maxModelLen": 32768,
            "tensorParallelSize": 4,
            "toolCallParser": "hermes",
        },
        quantization={"weights": "awq", "kvCacheDtype": "fp8", "preQuantized": True},
    )
    args = real_engine.engine_args(parse_specmodel(specmodel), build, 9000)
    flags = dict(zip(args[1::2], args[2::2], strict=False))
    assert args[0] == "/models/target"
    assert flags["--host"] == "127.0.0.1" and flags["--port"] == "9000"
    assert flags["--served-model-name"] == "big"
    assert flags["--max-model-len"] == str(real_engine.TINY_MAX_MODEL_LEN)
    assert flags["--tensor-parallel-size"] == "1" and flags["--dtype"] == "float32"
    assert flags["--kv-cache-dtype"] == "fp8"
    assert "--quantization" not in args and "--tool-call-parser" not in args
    assert "--enable-auto-tool-choice" not in args
    speculative = json.loads(flags["--speculative-config"])
    assert speculative == {
        "method": "draft_model",
        "model": "/models/target",
        "num_speculative_tokens": 4,
    }


def test_the_pair_source_maps_to_the_pair_target_and_its_draft() -> None:
    build = real_engine.Build(vllm=Path("/engine/vllm"), models=Path("/models"))
    specmodel = real_engine.tiny_specmodel(
        {"method": "draft_model", "draftModel": "org/draft", "numSpeculativeTokens": 3},
        source=real_engine.PAIR_SOURCE,
    )
    args = real_engine.engine_args(parse_specmodel(specmodel), build, 9000)
    assert args[0] == "/models/pair/target"
    speculative = json.loads(args[args.index("--speculative-config") + 1])
    assert speculative["model"] == "/models/pair/draft"
    plain = real_engine.engine_args(parse_specmodel(specmodel), build, 9000, speculation=False)
    assert plain[0] == "/models/pair/target" and "--speculative-config" not in plain
