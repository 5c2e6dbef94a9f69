"""`specfleet gateway` as a process: argument errors, --specmodel, graceful SIGTERM."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml
from click.testing import CliRunner

from conftest import free_port
from specfleet.api import parse_specmodel
from specfleet.cli import main
from specfleet.gateway.config import load_specmodel_config
from specfleet.render import render
from specfleet_testbed.engine.args import parse_vllm
from specfleet_testbed.engine.server import SimOptions, serve

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples/llama-3.1-8b-eagle3-fp8.yaml"
SPECMODELS = sorted((ROOT / "examples").glob("*.yaml"))
ENTRY = [sys.executable, "-c", "from specfleet.cli import main; main()"]


def test_exactly_one_config_source_is_required(tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(main, ["gateway", "--upstream", "http://127.0.0.1:1"])
    assert result.exit_code == 2 and "exactly one of --config or --specmodel" in result.output
    bad = tmp_path / "gateway.yaml"
    bad.write_text("classes: []\n")
    result = runner.invoke(main, ["gateway", "--upstream", "http://x", "--config", str(bad)])
    assert result.exit_code == 1 and "gateway.yaml" in result.output
    result = runner.invoke(
        main, ["gateway", "--upstream", "http://x", "--config", str(bad), "--listen", "nope"]
    )
    assert result.exit_code == 2 and "HOST:PORT" in result.output


def test_specmodel_gives_the_rendered_config_with_k() -> None:
    config = load_specmodel_config(EXAMPLE)
    assert [c.name for c in config.classes] == ["code", "tools", "json", "chat"]
    assert (config.default_class, config.served_name) == ("chat", "llama-3.1-8b")
    assert config.num_speculative_tokens == 4


@pytest.mark.parametrize("path", SPECMODELS, ids=lambda p: p.stem)
def test_specmodel_config_is_the_operators(path: Path) -> None:
    """The operator's fleet ConfigMap, drafting included (TensorRT-LLM's gateways need it)."""
    rendered = render(parse_specmodel(yaml.safe_load(path.read_text())))
    (configmap,) = [o for o in rendered if o["metadata"]["name"].endswith("-gateway")]
    assert load_specmodel_config(path).to_wire() == yaml.safe_load(
        configmap["data"]["gateway.yaml"]
    )


async def wait_healthy(url: str, proc: asyncio.subprocess.Process) -> None:
    async with httpx.AsyncClient() as http:
        for _ in range(200):
            assert proc.returncode is None, "gateway exited"
            try:
                if (await http.get(url + "/healthz")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.05)
    raise AssertionError("gateway did not come up")


async def test_sigterm_lets_an_in_flight_stream_finish() -> None:
    # 128 tokens at a quarter of real time take about half a second.
    config = parse_vllm(["m", "--served-model-name", "llama-3.1-8b"], env={})
    async with serve(config, SimOptions(time_scale=0.25)) as sim:
        port, metrics_port = free_port(), free_port()
        argv = [
            *ENTRY, "gateway", "--upstream", sim.url, "--specmodel", str(EXAMPLE),
            "--listen", f"127.0.0.1:{port}", "--metrics-listen", f"127.0.0.1:{metrics_port}",
            "--shutdown-grace", "20",
        ]  # fmt: skip
        proc = await asyncio.create_subprocess_exec(*argv)
        try:
            await wait_healthy(f"http://127.0.0.1:{metrics_port}", proc)
            messages = [{"role": "user", "content": "hi"}]
            body = {"model": "llama-3.1-8b", "messages": messages, "stream": True}
            async with httpx.AsyncClient(timeout=30) as http:
                request = http.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body)
                pending = asyncio.create_task(request)
                await asyncio.sleep(0.15)
                proc.send_signal(signal.SIGTERM)
                signalled = time.monotonic()
                response = await pending
            done = time.monotonic()
            assert await asyncio.wait_for(proc.wait(), 10) == 0
            assert 0.1 < done - signalled < 5  # the stream was cut short by nothing
            assert response.status_code == 200
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    events = [e for e in response.text.split("\n\n") if e.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    last = json.loads(events[-2].removeprefix("data: "))
    assert last["choices"][0]["finish_reason"] == "stop"
