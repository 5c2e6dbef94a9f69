"""`make demo` in its short form, as CI runs it: the newcomer's path must keep working."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from e2e.cluster.harness import LocalCluster

ROOT = Path(__file__).resolve().parent.parent


def test_demo_short(local_cluster: LocalCluster) -> None:
    env = {**os.environ, "KUBECONFIG": str(local_cluster.kubeconfig)}
    done = subprocess.run(
        [sys.executable, "-m", "e2e.demo", "--short"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Kill switch engaged" in done.stdout and "Rolled back" in done.stdout
    timeline = ROOT / "out/demo/timeline.png"
    assert timeline.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and timeline.stat().st_size > 20_000
    alerts = json.loads((ROOT / "out/demo/alerts.json").read_text())
    names = {a["labels"]["alertname"] for a in alerts}
    assert {"SpecfleetKillSwitchEngaged", "SpecfleetRolledBack"} & names, names
