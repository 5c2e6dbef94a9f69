"""`specfleet sim ...` commands."""

from __future__ import annotations

import click


@click.group()
def sim() -> None:
    """Simulators for running specfleet without GPUs."""
