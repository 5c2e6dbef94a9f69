"""`specfleet-testbed engine` as a process: refuses bad args, serves, stops on SIGTERM."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
from click.testing import CliRunner

from specfleet_testbed.cli import main

ENTRY = [sys.executable, "-c", "from specfleet_testbed.cli import main; main()"]


def test_bad_engine_args_exit_2_like_the_engine() -> None:
    runner = CliRunner()
    result = runner.invoke(
        main,
        [
            "engine",
            "--engine",
            "vllm",
            "--",
            "m",
            "--per-request-spec-decode-metrics",
            "summary",
        ],
    )
    assert result.exit_code == 2
    assert "vllm serve: error: --per-request-spec-decode-metrics requires" in result.output
    result = runner.invoke(main, ["engine", "--engine", "tensorrt-llm", "--", "trtllm-serve"])
    assert result.exit_code == 2 and "trtllm-serve: error" in result.output


def test_bad_scenario_and_effects_are_usage_errors(tmp_path: Path) -> None:
    bad = tmp_path / "s.yaml"
    bad.write_text("duration_s: 5\ntraffic_rps: 1\nclasses: {a: {share: 1.0, acceptance: 2}}\n")
    runner = CliRunner()
    result = runner.invoke(main, ["engine", "--engine", "vllm", "--scenario", str(bad), "--", "m"])
    assert result.exit_code == 2 and "classes.a.acceptance[0]" in result.output
    result = runner.invoke(
        main, ["engine", "--engine", "vllm", "--effects", '{"tpot": 1}', "--", "m"]
    )
    assert result.exit_code == 2 and "--effects" in result.output


def test_serves_and_stops_gracefully_on_sigterm() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [
            *ENTRY,
            "engine",
            "--engine",
            "vllm",
            "--listen",
            f"127.0.0.1:{port}",
            "--time-scale",
            "0.001",
            "--",
            "org/model",
            "--served-model-name",
            "m",
            "--port",
            "8000",
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 15
        while True:
            try:
                if httpx.get(url + "/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the simulator did not come up"
            time.sleep(0.05)
        r = httpx.post(
            url + "/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        )
        assert r.status_code == 200 and r.json()["model"] == "m"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
        assert proc.stderr is not None
        assert "vllm serving m on http://127.0.0.1" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
