"""The capacity phase for real: `specfleet experiment capacity` drives guidellm (the venv of
hack/guidellm.sh) against `specfleet-testbed engine` on 127.0.0.1, two classes at two
concurrency steps. No cluster."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from e2e.fleet import guidellm
from e2e.operator_runner import free_port
from specfleet.api.spec import ClassSlo
from specfleet.experiment.capacity import CapacityReport, capacity

SIM = [sys.executable, "-c", "from specfleet_testbed.cli import main; main()", "engine"]
CLI = [sys.executable, "-c", "from specfleet.cli import main; main()"]
LOOSE = {"chat": ClassSlo(max_p95_ttft_seconds=30.0), "code": ClassSlo(max_p95_tpot_seconds=5.0)}


@pytest.fixture
def engine() -> Iterator[str]:
    port = free_port()
    args = ["--engine", "vllm", "--listen", f"127.0.0.1:{port}", "--", "org/model"]
    proc = subprocess.Popen([*SIM, *args, "--served-model-name", "m"], stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while not _healthy(url):
            assert proc.poll() is None and time.monotonic() < deadline, "no simulator"
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=15)


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/health").status_code == 200
    except httpx.TransportError:
        return False


def requests_file(path: Path) -> Path:
    lines = [
        {
            "class": name,
            "messages": [{"role": "user", "content": f"{name} question {i}: answer briefly"}],
            "max_tokens": tokens,
        }
        for i in range(4)
        for name, tokens in (("chat", 16), ("code", 32))
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_throughput_at_slo_grows_with_concurrency_and_shrinks_with_the_slo(
    engine: str, tmp_path: Path
) -> None:
    slo = json.dumps({name: s.to_wire() for name, s in LOOSE.items()})
    result_file = tmp_path / "termination-log"
    command = [*CLI, "experiment", "capacity", "--url", engine, "--slo", slo]
    command += ["--requests", str(requests_file(tmp_path / "requests.jsonl"))]
    command += ["--max-concurrency", "4", "--steps", "2", "--step-seconds", "30"]
    command += ["--guidellm", guidellm(), "--result-file", str(result_file)]
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    report = CapacityReport.model_validate_json(done.stdout)
    one, two = report.steps
    assert (one.concurrency, two.concurrency) == (2, 4)
    # every request of both classes came back, and twice the streams served more per second
    assert {c: (m.requests, m.errors) for c, m in one.classes.items()} == {
        "chat": (4, 0),
        "code": (4, 0),
    }
    assert two.throughput > 1.3 * one.throughput > 0
    assert (report.throughput_at_slo, report.concurrency) == (two.throughput, 4)
    assert json.loads(result_file.read_text())["throughputAtSlo"] == two.throughput
    for step in report.steps:
        for measured in step.classes.values():
            assert 0 < measured.p95_ttft_seconds < 5 and 0 < measured.p95_tpot_seconds < 1
    # the same steps judged by tighter SLOs: under what the first step achieved, none
    fastest_ttft = min(m.p95_ttft_seconds for m in one.classes.values())
    tight = {"chat": ClassSlo(max_p95_ttft_seconds=fastest_ttft / 2), "code": LOOSE["code"]}
    assert capacity(report.steps, tight).throughput_at_slo == 0.0
    print(f"capacity run {time.monotonic() - started:.0f} s: {report.model_dump_json()}")
