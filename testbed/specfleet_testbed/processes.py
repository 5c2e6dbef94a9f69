"""The stand-in kubelet's processes: each leads its own group, so that stopping it reaches its
children too (a real engine's engine core, a load test's guidellm)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping
from pathlib import Path


def spawn(
    argv: list[str], log_path: Path, env: Mapping[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """`argv` with its output appended to `log_path`; `env` defaults to this process's."""
    with log_path.open("ab") as out:
        return subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=dict(os.environ if env is None else env),
            start_new_session=True,
        )


def signal_group(process: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, sig)
