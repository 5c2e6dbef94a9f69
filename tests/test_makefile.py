"""`make help`: every target of the Makefile and what it includes, one line each, nothing built."""

from __future__ import annotations

import re
import shutil
import subprocess
import time

import pytest

from conftest import ROOT

MAKEFILES = [ROOT / "Makefile", ROOT / "e2e/cluster/cluster.mk"]
RULE = re.compile(r"^([A-Za-z0-9_.-]+(?: [A-Za-z0-9_.-]+)*):(?!=)")


def _targets() -> dict[str, str]:
    """Each named target (not a file like `$(VENV)/.installed`) → its rule line."""
    rules: dict[str, str] = {}
    for makefile in MAKEFILES:
        for line in makefile.read_text().splitlines():
            match = RULE.match(line)
            if match and not line.startswith((".PHONY", ".DEFAULT_GOAL")):
                for target in match.group(1).split():
                    rules[target] = line
    return rules


def test_every_target_says_what_it_does() -> None:
    silent = [target for target, line in _targets().items() if "## " not in line]
    assert not silent, f"give these targets a `## what it does` comment: {silent}"


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_make_help_lists_every_target_without_building_anything() -> None:
    started = time.monotonic()
    out = subprocess.run(
        ["make", "--no-print-directory", "-C", str(ROOT), "help", "VENV=/nonexistent-venv"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert time.monotonic() - started < 5
    listed = [line.split()[0] for line in out.splitlines()]
    assert sorted(listed) == sorted(_targets())
    assert all(len(line.split(maxsplit=1)) == 2 for line in out.splitlines())
