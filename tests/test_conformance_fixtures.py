"""The simulator held to the real vLLM, offline: its answers to the conformance cases compared
by wire shape (`specfleet_testbed.conformance`) with the real engine's, recorded by
`hack/record_real_vllm.py` into `tests/data/real-vllm/` (the engine's version and args in
`engine.json`). The simulator gets the same args the real engine got. `e2e/test_conformance.py`
makes the same comparison live."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from specfleet_testbed.conformance import CASES, Case, engine_families, exchange
from specfleet_testbed.engine.args import parse_vllm
from specfleet_testbed.engine.server import SimOptions, serve

FIXTURES = Path(__file__).parent / "data" / "real-vllm"
RECORDED = json.loads((FIXTURES / "engine.json").read_text())
ARGS: list[str] = RECORDED["args"]
SERVED_NAME = ARGS[ARGS.index("--served-model-name") + 1]
SIM_OPTIONS = SimOptions(time_scale=0.0005)
# What our stack reads from vLLM (reference/engines.md): the simulator must expose them all.
READ_FAMILIES = {
    "vllm:spec_decode_num_drafts",
    "vllm:spec_decode_num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens",
    "vllm:spec_decode_num_accepted_tokens_per_pos",
    "vllm:time_to_first_token_seconds",
    "vllm:inter_token_latency_seconds",
    "vllm:request_time_per_output_token_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:request_success",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:prompt_tokens",
    "vllm:generation_tokens",
}


def fixture(name: str) -> Any:
    return json.loads((FIXTURES / f"{name}.json").read_text())


def test_every_case_has_its_recording() -> None:
    recorded = {p.stem for p in FIXTURES.glob("*.json")} - {"engine", "metrics"}
    assert recorded == {case.name for case in CASES}


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
async def test_the_simulator_answers_like_the_recorded_real_engine(case: Case) -> None:
    async with serve(parse_vllm(ARGS), SIM_OPTIONS) as sim, httpx.AsyncClient() as http:
        assert await exchange(http, sim.url, case, SERVED_NAME) == fixture(case.name)


async def test_the_simulators_metric_families_are_the_real_engines() -> None:
    """Every `vllm:*` family the simulator exposes exists in the real engine with the same type
    and label names, and the simulator exposes every family our stack reads."""
    recorded = fixture("metrics")
    chat = next(c for c in CASES if c.name == "chat")
    async with serve(parse_vllm(ARGS), SIM_OPTIONS) as sim, httpx.AsyncClient() as http:
        await exchange(http, sim.url, chat, SERVED_NAME)
        ours = engine_families((await http.get(sim.url + "/metrics")).text)
    assert set(recorded) >= READ_FAMILIES
    assert set(ours) >= READ_FAMILIES
    assert {name: recorded.get(name) for name in ours} == ours
