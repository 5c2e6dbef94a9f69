"""Which loopback range a local cluster's pods get: 127.N.0.0/16, a different N for each local
cluster running on this host.

kwok gives node i's pods IPs in its podCIDR 127.N.i.0/24 and the stand-in kubelet binds each
pod's engine and gateway to that IP. Two clusters with the same N (a second checkout's `make
demo` beside a running `make test`) would hand out the same IPs, and a pod's gateway could reach
the other cluster's engine. So a cluster claims its N when it is first brought up: a file
CLAIMS/N.json naming its state directory, written under a host-wide lock. A claim is taken over
once neither its cluster runs nor the process that claimed it (stopped without `down`, its state
deleted). N is also passed over where a kwok runs with it (a cluster started before claims
existed, always on 127.10) or something listens in 127.N.0.0/16. A node's podCIDR cannot
change, so a cluster keeps its N until `down` releases it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path

LEGACY = 10
"""127.10.0.0/16: every cluster's range before claims, and the first one tried."""
LAST = 95
"""127.96.0.0/16 is the clusters' ClusterIP range (nothing binds it: no kube-proxy)."""
CLAIMS = (
    Path(os.environ.get("SPECFLEET_CACHE", Path.home() / ".cache" / "specfleet")) / "e2e-pod-ranges"
)
PROC_NET_TCP = Path("/proc/net/tcp")
TCP_LISTEN = "0A"

Alive = Callable[[Path], bool]
"""Whether the local cluster with this state directory runs (any of its processes)."""


class PodRangeTaken(RuntimeError):
    """No range can be had: the message says which clusters hold them and what to do."""


def prefix(octet: int) -> str:
    return f"127.{octet}"


def claim(state: Path, alive: Alive, claims: Path = CLAIMS) -> int:
    """A free N for the new cluster in `state`, claimed for it."""
    with _locked(claims):
        used = listening_octets() | kwok_octets()
        for octet in range(LEGACY, LAST + 1):
            if octet not in used and _take(claims / f"{octet}.json", state, alive):
                return octet
        holders = sorted({str(owner(path)) for path in claims.glob("*.json")} - {"None"})
    raise PodRangeTaken(
        f"no free loopback pod range for a local cluster in {state}: 127.{LEGACY}-{LAST}.0.0/16 "
        f"are all taken by running clusters ({', '.join(holders) or 'none claimed'}), their "
        f"kwok or processes listening in them; stop one (`make cluster-down` in its checkout)"
    )


def keep(state: Path, octet: int, alive: Alive, claims: Path = CLAIMS) -> None:
    """Re-claims the N a cluster in `state` was created with (its nodes' podCIDRs carry it),
    before its processes start again; refuses if another running cluster holds it now."""
    path = claims / f"{octet}.json"
    with _locked(claims):
        if _take(path, state, alive):
            return
    raise PodRangeTaken(
        f"the local cluster in {state} was created with pod range {prefix(octet)}.0.0/16, "
        f"which the cluster in {owner(path)} runs on now: two clusters on one range would "
        f"reach each other's pods. Stop that one (`make cluster-down` in its checkout), or "
        f"delete this one (`make cluster-down` here) and start it again on a free range"
    )


def release(state: Path, claims: Path = CLAIMS) -> None:
    """Drops every claim the cluster in `state` holds (at `down`)."""
    if not claims.is_dir():
        return
    with _locked(claims):
        for path in claims.glob("*.json"):
            if owner(path) == state.resolve():
                path.unlink(missing_ok=True)


def owner(path: Path) -> Path | None:
    """The state directory a claim names; None if it is gone or unreadable."""
    try:
        return Path(json.loads(path.read_text())["state"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


@contextlib.contextmanager
def _locked(claims: Path) -> Iterator[None]:
    """One claimer at a time on this host (an flock, released when the process ends)."""
    claims.mkdir(parents=True, exist_ok=True)
    with (claims / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _take(path: Path, state: Path, alive: Alive) -> bool:
    """Claims `path` for `state` if it is free, ours already, or its holder is gone: neither
    its cluster runs nor the process that claimed it (which may still be starting it)."""
    mine = state.resolve()
    if path.exists():
        holder = owner(path)
        if holder == mine:
            return True
        if holder is not None and (alive(holder) or _pid_alive(_claimer(path))):
            return False
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps({"state": str(mine), "pid": os.getpid()}) + "\n")
    tmp.replace(path)
    return True


def _claimer(path: Path) -> int | None:
    try:
        return int(json.loads(path.read_text())["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _pid_alive(pid: int | None) -> bool:
    if pid is None or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def listening_octets(proc_net_tcp: Path = PROC_NET_TCP) -> set[int]:
    """Each N with a TCP listener on an address in 127.N.0.0/16 (Linux; elsewhere none known)."""
    try:
        lines = proc_net_tcp.read_text().splitlines()[1:]
    except OSError:
        return set()
    octets = set()
    for line in lines:
        fields = line.split()
        if len(fields) < 4 or fields[3] != TCP_LISTEN:
            continue
        address = fields[1].split(":")[0]  # little-endian hex: 0100007F is 127.0.0.1
        if len(address) == 8 and address[6:8] == "7F":
            octets.add(int(address[4:6], 16))
    return octets


KWOK_CIDR = re.compile(rb"--cidr=127\.(\d+)\.")


def kwok_octets(proc: Path = Path("/proc")) -> set[int]:
    """Each N a running kwok hands out (`--cidr=127.N.255.0/24`), claimed or not."""
    octets = set()
    for cmdline in proc.glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes()
        except OSError:
            continue  # ended meanwhile, or not ours to read
        if b"kwok" in argv.split(b"\0", 1)[0]:
            octets.update(int(n) for n in KWOK_CIDR.findall(argv))
    return octets
