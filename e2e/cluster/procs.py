"""Background processes of the local cluster: started detached, tracked by pid files."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

STOP_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Daemon:
    """One long-running process: its name (pid and log file stem) and its command line."""

    name: str
    argv: list[str]
    cwd: Path | None = None


def pid_file(state: Path, name: str) -> Path:
    return state / "pids" / f"{name}.pid"


def log_file(state: Path, name: str) -> Path:
    return state / "logs" / f"{name}.log"


def start(state: Path, daemon: Daemon) -> int:
    """Starts `daemon` in its own session (it outlives the caller) and records its pid."""
    log = log_file(state, daemon.name)
    log.parent.mkdir(parents=True, exist_ok=True)
    pid_file(state, daemon.name).parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        out.write(f"--- {time.strftime('%H:%M:%S')} {' '.join(daemon.argv)}\n".encode())
        out.flush()
        process = subprocess.Popen(
            daemon.argv,
            cwd=daemon.cwd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    pid_file(state, daemon.name).write_text(f"{process.pid}\n{daemon.argv[0]}\n")
    return process.pid


def running_pid(state: Path, name: str) -> int | None:
    """The pid of `name` if the process we started is still alive (not a zombie, not reused)."""
    path = pid_file(state, name)
    if not path.exists():
        return None
    pid_text, executable = path.read_text().splitlines()[:2]
    pid = int(pid_text)
    return pid if _is_alive(pid, executable) else None


def stop(state: Path, name: str) -> None:
    """Stops `name` (SIGTERM, then SIGKILL after STOP_TIMEOUT_S) and forgets its pid."""
    pid = running_pid(state, name)
    if pid is not None:
        _terminate(pid)
    pid_file(state, name).unlink(missing_ok=True)


def _terminate(pid: int) -> None:
    _signal_group(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while time.monotonic() < deadline:
        _reap(pid)
        if not _is_alive(pid, None):
            return
        time.sleep(0.05)
    _signal_group(pid, signal.SIGKILL)
    while _is_alive(pid, None):
        _reap(pid)
        time.sleep(0.05)


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, sig)


def _reap(pid: int) -> None:
    """Collects the exit status if `pid` is our own child, so it does not linger as a zombie."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def _is_alive(pid: int, executable: str | None) -> bool:
    proc = Path(f"/proc/{pid}")
    try:
        state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        argv0 = (proc / "cmdline").read_bytes().split(b"\0", 1)[0].decode()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    if state in ("Z", "X"):
        return False
    return executable is None or argv0 == executable
