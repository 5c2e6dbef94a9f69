"""The simulator held to the real vLLM, live: the same requests to a real `vllm serve` (its CPU
build, the tiny local model, n-gram speculation) and to `specfleet-testbed engine` given the very
same args, compared by wire shape (`specfleet_testbed.conformance`). Where they differ, the
simulator is wrong. `tests/test_conformance_fixtures.py` makes the same comparison offline,
against this engine's answers recorded by `hack/record_real_vllm.py`.

One engine for the module: it takes about a minute to start and 3.5 GiB while it runs.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
import yaml

from e2e import real_engine
from specfleet.api.validation import parse_specmodel
from specfleet_testbed.conformance import CASES, Case, engine_families, exchange
from specfleet_testbed.engine.args import parse_vllm
from specfleet_testbed.engine.server import SimOptions, serve

EXAMPLE = real_engine.REPO / "examples" / "qwen2.5-coder-7b-ngram.yaml"
# A tool-call parser that needs no special tokens in the tiny tokenizer, so a named tool choice
# answers with a tool call instead of the "requires --tool-call-parser" error; compact JSON, so
# the random model's structured outputs (bounded by their schemas) end instead of running into
# max_tokens with whitespace.
EXTRA_ARGS = [
    "--enable-auto-tool-choice",
    "--tool-call-parser",
    "pythonic",
    "--structured-outputs-config",
    '{"backend": "xgrammar", "disable_any_whitespace": true}',
]
TIMEOUT = httpx.Timeout(120.0)


def conformance_args(build: real_engine.Build, port: int) -> list[str]:
    """The renderer's args for the n-gram example, on the local engine, plus EXTRA_ARGS."""
    specmodel = parse_specmodel(yaml.safe_load(EXAMPLE.read_text()))
    return [*real_engine.engine_args(specmodel, build, port), *EXTRA_ARGS]


@dataclass(frozen=True)
class Real:
    url: str
    args: list[str]

    @property
    def served_name(self) -> str:
        return self.args[self.args.index("--served-model-name") + 1]


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Real]:
    build = real_engine.build()
    args = conformance_args(build, real_engine.free_port())
    log = tmp_path_factory.mktemp("conformance") / "vllm.log"
    with real_engine.running(build, args, log) as engine:
        yield Real(engine.url, args)


async def answers(url: str, case: Case, model: str) -> object:
    async with httpx.AsyncClient(timeout=TIMEOUT) as http:
        return await exchange(http, url, case, model)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
async def test_the_simulator_answers_like_the_real_engine(real: Real, case: Case) -> None:
    expected = await answers(real.url, case, real.served_name)
    async with serve(parse_vllm(real.args), SimOptions(time_scale=0.001)) as sim:
        assert await answers(sim.url, case, real.served_name) == expected


async def test_the_simulators_metric_families_are_the_real_engines(real: Real) -> None:
    """Every `vllm:*` family the simulator exposes exists in the real engine with the same type
    and label names (the real engine has more, which nothing here reads)."""
    chat = next(c for c in CASES if c.name == "chat")
    await answers(real.url, chat, real.served_name)
    async with httpx.AsyncClient(timeout=TIMEOUT) as http:
        theirs = engine_families((await http.get(real.url + "/metrics")).text)
    async with serve(parse_vllm(real.args), SimOptions(time_scale=0.001)) as sim:
        await answers(sim.url, chat, real.served_name)
        async with httpx.AsyncClient(timeout=TIMEOUT) as http:
            ours = engine_families((await http.get(sim.url + "/metrics")).text)
    assert ours, "the simulator exposes no vllm:* family"
    assert {name: theirs.get(name) for name in ours} == ours
