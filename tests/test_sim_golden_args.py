"""The contract between the renderer and the simulator: every engine command line
the renderer's golden files hold starts the simulator (as it must start the engine)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from specfleet.sim.engine_args import parse_trtllm, parse_vllm

GOLDEN = sorted((Path(__file__).parent / "golden").glob("*.yaml"))


def _engine(path: Path) -> tuple[list[str], dict[str, str]]:
    docs: list[dict[str, Any]] = [d for d in yaml.safe_load_all(path.read_text()) if d]
    files = {
        k: v for d in docs if d["kind"] == "ConfigMap" for k, v in (d.get("data") or {}).items()
    }
    for doc in docs:
        if doc["kind"] != "Deployment":
            continue
        for container in doc["spec"]["template"]["spec"]["containers"]:
            if container["name"] == "engine":
                return [*(container.get("command") or []), *container.get("args", [])], files
    raise AssertionError(f"{path.name}: no engine container")


@pytest.mark.skipif(not GOLDEN, reason="no golden files")
@pytest.mark.parametrize("path", GOLDEN, ids=[p.stem for p in GOLDEN])
def test_golden_engine_args_start_the_simulator(path: Path) -> None:
    argv, files = _engine(path)
    if path.name.startswith("vllm"):
        cfg = parse_vllm(argv, env={})
    else:
        cfg = parse_trtllm(argv, read_file=lambda p: files[Path(p).name])
    on = "-on" in path.stem
    assert (cfg.speculation is not None) == on, path.name
