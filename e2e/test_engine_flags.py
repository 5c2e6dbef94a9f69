"""The flag list of the vLLM that runs here is its own parser's: hack/engine_flags.py run by the
real engine's Python prints exactly api/flags/vllm-<version>.txt, the list extraArgs are checked
against when a SpecModel declares that engine.version."""

from __future__ import annotations

import subprocess
from pathlib import Path

from e2e import real_engine

ROOT = Path(__file__).resolve().parent.parent


def test_the_committed_list_is_what_the_real_parser_prints() -> None:
    python = real_engine.build().vllm.parent / "python"
    printed = subprocess.run(
        [str(python), str(ROOT / "hack/engine_flags.py")],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    ).stdout
    version = printed.split()[2]
    committed = ROOT / f"operator/specfleet/api/flags/vllm-{version}.txt"
    assert committed.read_text() == printed
