"""The contract between the renderer and the simulator: every engine command line
the renderer's golden files hold starts the simulator (as it must start the engine)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from specfleet_testbed.engine.args import parse_trtllm, parse_vllm

GOLDEN = sorted((Path(__file__).parent / "golden").glob("*.yaml"))


def _engines(path: Path) -> list[tuple[list[str], dict[str, str], bool]]:
    """Each Deployment's engine command line, the files of the ConfigMaps its pods mount, and
    whether its pods are labelled as speculating (the fleet's, and a trial's canary)."""
    docs: list[dict[str, Any]] = [d for d in yaml.safe_load_all(path.read_text()) if d]
    maps = {d["metadata"]["name"]: d.get("data") or {} for d in docs if d["kind"] == "ConfigMap"}
    found = []
    for doc in docs:
        if doc["kind"] != "Deployment":
            continue
        template = doc["spec"]["template"]
        mounted = [v["configMap"]["name"] for v in template["spec"]["volumes"] if "configMap" in v]
        files = {k: v for name in mounted for k, v in maps[name].items()}
        [engine] = [c for c in template["spec"]["containers"] if c["name"] == "engine"]
        argv = [*(engine.get("command") or []), *engine.get("args", [])]
        found.append(
            (argv, files, template["metadata"]["labels"]["specfleet.dev/speculation"] == "on")
        )
    assert found, f"{path.name}: no engine container"
    return found


@pytest.mark.skipif(not GOLDEN, reason="no golden files")
@pytest.mark.parametrize("path", GOLDEN, ids=[p.stem for p in GOLDEN])
def test_golden_engine_args_start_the_simulator(path: Path) -> None:
    for argv, files, on in _engines(path):
        if path.name.startswith("vllm"):
            cfg = parse_vllm(argv, env={})
        else:
            cfg = parse_trtllm(argv, read_file=lambda p, files=files: files[Path(p).name])
        assert (cfg.speculation is not None) == on, path.name
