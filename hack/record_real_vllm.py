#!/usr/bin/env python3
"""Record the real vLLM's answers to the conformance cases as fixtures for the offline test.

    .venv/bin/python hack/record_real_vllm.py [--out tests/data/real-vllm]

Starts the real engine (hack/real-engine.sh builds it once) with the args of
e2e/test_conformance.py, sends every `specfleet_testbed.conformance.CASES` request and writes
their shapes (no ids, timestamps, fingerprint hashes or text: `conformance.shape`), one file
per case, plus `metrics.json` (the `vllm:*` families and label names) and `engine.json`
(the args, the local model directory replaced by `<model>`, and the engine's version).
Review the diff before committing: the fixtures are what the simulator is held to.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from e2e import real_engine  # noqa: E402
from e2e.test_conformance import Real, conformance_args  # noqa: E402

from specfleet_testbed.conformance import CASES, engine_families, exchange  # noqa: E402


def write(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value, indent=1, sort_keys=True) + "\n")


async def record(real: Real, out: Path, model_dir: str) -> None:
    async with httpx.AsyncClient(timeout=httpx.Timeout(120.0)) as http:
        for case in CASES:
            write(out / f"{case.name}.json", await exchange(http, real.url, case, real.served_name))
            print(f"recorded {case.name}", file=sys.stderr)
        families = engine_families((await http.get(real.url + "/metrics")).text)
        version = (await http.get(real.url + "/version")).json()["version"]
    write(out / "metrics.json", families)
    args = [a.replace(model_dir, "<model>") for a in real.args]
    write(out / "engine.json", {"version": version, "args": args})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "tests" / "data" / "real-vllm")
    out = parser.parse_args().out
    out.mkdir(parents=True, exist_ok=True)
    build = real_engine.build()
    args = conformance_args(build, real_engine.free_port())
    log = Path(tempfile.mkdtemp(prefix="record-real-vllm-")) / "vllm.log"
    print(f"starting vllm serve (log {log})", file=sys.stderr)
    with real_engine.running(build, args, log) as engine:
        asyncio.run(record(Real(engine.url, args), out, str(build.models)))


if __name__ == "__main__":
    main()
