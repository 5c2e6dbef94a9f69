"""The stand-in kubelet's pod lifecycle, with real processes."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

from specfleet.sim.pods import PodProcesses

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


def test_a_pod_starts_only_once_the_last_holder_of_its_ip_has_stopped(tmp_path: Path) -> None:
    old = PodProcesses("ns/old", "127.0.0.9", pre_stop_seconds=0.5)
    assert old.launch([(SLEEPER, tmp_path / "old.log")])
    stopping = threading.Thread(target=old.stop, args=(5.0,))
    stopping.start()
    new = PodProcesses("ns/new", "127.0.0.9")

    assert new.launch([(SLEEPER, tmp_path / "new.log")], after=stopping)

    assert old.processes[0].poll() is not None, "the old pod's process still holds the IP"
    assert new.alive()
    new.stop(5.0, pre_stop=False)
    assert not new.alive()


def test_a_pod_stopped_before_it_launched_starts_nothing(tmp_path: Path) -> None:
    pod = PodProcesses("ns/gone", "127.0.0.9")
    pod.stop(1.0)

    assert not pod.launch([(SLEEPER, tmp_path / "gone.log")])

    assert pod.processes == [] and not pod.alive()
