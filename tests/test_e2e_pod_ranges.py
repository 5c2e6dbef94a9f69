"""Two local clusters on one host get different loopback pod ranges (e2e/cluster/pod_ranges.py),
or the second is refused with a message saying which cluster holds what."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from e2e.cluster import components, pod_ranges
from e2e.cluster.components import Layout, Ports

LISTENING, KWOKS = pod_ranges.listening_octets, pod_ranges.kwok_octets
"""The real readers of /proc, before the tests replace them."""


def dead_pid() -> int:
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    return int(done.stdout)


def stale(claims: Path, octet: int) -> None:
    """The claim as a cluster that was killed (not brought down) leaves it."""
    path = claims / f"{octet}.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "pid": dead_pid()}))


@pytest.fixture(autouse=True)
def nothing_else_on_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """This host's real listeners and kwoks (a running e2e cluster) stay out of these tests."""
    monkeypatch.setattr(pod_ranges, "listening_octets", lambda: set())
    monkeypatch.setattr(pod_ranges, "kwok_octets", lambda: set())


def never_alive(state: Path) -> bool:
    return False


def always_alive(state: Path) -> bool:
    return True


def test_the_first_cluster_keeps_127_10_and_a_second_gets_the_next_range(tmp_path: Path) -> None:
    claims = tmp_path / "claims"
    first = pod_ranges.claim(tmp_path / "a", always_alive, claims)
    second = pod_ranges.claim(tmp_path / "b", always_alive, claims)
    assert (first, second) == (10, 11)
    assert pod_ranges.owner(claims / "11.json") == (tmp_path / "b").resolve()


def test_a_claim_outlives_its_claimer_while_its_cluster_runs(tmp_path: Path) -> None:
    claims = tmp_path / "claims"
    pod_ranges.claim(tmp_path / "a", never_alive, claims)
    stale(claims, 10)
    assert pod_ranges.claim(tmp_path / "b", always_alive, claims) == 11


def test_a_claim_is_held_while_its_claimer_runs_before_its_cluster_does(tmp_path: Path) -> None:
    claims = tmp_path / "claims"
    pod_ranges.claim(tmp_path / "a", never_alive, claims)  # this process: still starting it
    assert pod_ranges.claim(tmp_path / "b", never_alive, claims) == 11


def test_a_range_whose_cluster_and_claimer_are_gone_is_taken_over(tmp_path: Path) -> None:
    claims = tmp_path / "claims"
    pod_ranges.claim(tmp_path / "a", never_alive, claims)
    stale(claims, 10)
    assert pod_ranges.claim(tmp_path / "b", never_alive, claims) == 10
    assert pod_ranges.owner(claims / "10.json") == (tmp_path / "b").resolve()


def test_down_releases_the_range(tmp_path: Path) -> None:
    claims = tmp_path / "claims"
    pod_ranges.claim(tmp_path / "a", always_alive, claims)
    pod_ranges.claim(tmp_path / "b", always_alive, claims)
    pod_ranges.release(tmp_path / "a", claims)
    assert sorted(p.name for p in claims.glob("*.json")) == ["11.json"]
    assert pod_ranges.claim(tmp_path / "c", always_alive, claims) == 10


def test_ranges_in_use_without_a_claim_are_passed_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cluster started before claims (its kwok on 127.10), pods listening on 127.11."""
    monkeypatch.setattr(pod_ranges, "kwok_octets", lambda: {10})
    monkeypatch.setattr(pod_ranges, "listening_octets", lambda: {0, 11})
    assert pod_ranges.claim(tmp_path / "a", always_alive, tmp_path / "claims") == 12


def test_a_restarted_cluster_keeps_its_range_or_is_refused_if_another_runs_on_it(
    tmp_path: Path,
) -> None:
    claims = tmp_path / "claims"
    assert pod_ranges.claim(tmp_path / "a", never_alive, claims) == 10
    pod_ranges.keep(tmp_path / "a", 10, never_alive, claims)  # its own: fine
    stale(claims, 10)
    assert pod_ranges.claim(tmp_path / "b", never_alive, claims) == 10  # while a was stopped
    with pytest.raises(pod_ranges.PodRangeTaken) as refused:
        pod_ranges.keep(tmp_path / "a", 10, always_alive, claims)
    message = str(refused.value)
    assert "127.10.0.0/16" in message and str((tmp_path / "b").resolve()) in message
    assert "make cluster-down" in message


def test_no_free_range_is_refused_naming_who_holds_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    claims = tmp_path / "claims"
    pod_ranges.claim(tmp_path / "a", always_alive, claims)
    monkeypatch.setattr(pod_ranges, "listening_octets", lambda: set(range(11, 96)))
    with pytest.raises(pod_ranges.PodRangeTaken) as refused:
        pod_ranges.claim(tmp_path / "b", always_alive, claims)
    assert str((tmp_path / "a").resolve()) in str(refused.value)
    assert "make cluster-down" in str(refused.value)


def test_listeners_and_kwoks_are_read_from_proc(tmp_path: Path) -> None:
    tcp = tmp_path / "tcp"
    tcp.write_text(
        "  sl  local_address rem_address   st\n"
        "   0: 05000B7F:1F40 00000000:0000 0A\n"  # 127.11.0.5:8000, listening
        "   1: 05000C7F:1F40 0100007F:A000 01\n"  # 127.12.0.5, an established connection
        "   2: 0100007F:0050 00000000:0000 0A\n"  # 127.0.0.1:80
    )
    assert LISTENING(tcp) == {11, 0}
    for pid, argv in (
        ("7", ["/cache/bin/k8s/kwok", "--kubeconfig=k", "--cidr=127.10.255.0/24"]),
        ("8", ["/usr/bin/python3", "-c", "--cidr=127.30.255.0/24"]),  # not a kwok
        ("9", ["kwok", "--cidr=127.31.255.0/24"]),
    ):
        (tmp_path / "proc" / pid).mkdir(parents=True)
        (tmp_path / "proc" / pid / "cmdline").write_bytes("\0".join(argv).encode() + b"\0")
    assert KWOKS(tmp_path / "proc") == {10, 31}


def test_the_nodes_and_kwok_use_the_clusters_range(tmp_path: Path) -> None:
    layout = Layout(tmp_path, tmp_path / "bin", Ports(*range(1, 10)), pod_range=23)
    nodes = components.nodes_manifest(layout, 2).read_text()
    assert "podCIDR: 127.23.0.0/24" in nodes and "podCIDR: 127.23.1.0/24" in nodes
    assert "127.10." not in nodes


def test_a_cluster_saved_before_claims_is_on_127_10_and_a_new_one_saves_its_range(
    tmp_path: Path,
) -> None:
    from e2e.cluster import harness

    saved = {
        "bin_dir": str(tmp_path / "bin"),
        "nodes": 2,
        "ports": dict.fromkeys(Ports.__dataclass_fields__, 1),
    }
    (tmp_path / "cluster.json").write_text(json.dumps(saved))
    old = harness._load(tmp_path)
    assert old is not None and old.layout.pod_prefix == "127.10"
    harness._save(harness._local(Layout(tmp_path, tmp_path / "bin", old.layout.ports, 42), 2))
    new = harness._load(tmp_path)
    assert new is not None and new.layout.pod_range == 42
