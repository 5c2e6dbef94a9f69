"""How every `specfleet` command refuses an input it cannot use, or to run without something it
needs (a cluster): what and why on stderr, exit 2."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path
from typing import NoReturn

import click

EXIT_INVALID = 2


def refuse(source: str | Path, what: str, problems: Iterable[str]) -> NoReturn:
    """`error: SOURCE WHAT:`, then each problem on a line of its own."""
    click.echo(f"error: {source} {what}:", err=True)
    for problem in problems:
        click.echo(f"  {problem}", err=True)
    sys.exit(EXIT_INVALID)


def refuse_without(command: str, needs: str, problem: str) -> NoReturn:
    """`error: COMMAND needs NEEDS: PROBLEM`, one line: what to provide, not a traceback."""
    click.echo(f"error: {command} needs {needs}: {problem}", err=True)
    sys.exit(EXIT_INVALID)
