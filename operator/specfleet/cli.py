"""The one `specfleet` entry point (click). Each command is a thin shell over a module."""

from __future__ import annotations

import click

from specfleet.sim.cli import sim


@click.group()
@click.version_option(package_name="specfleet")
def main() -> None:
    """specfleet: guard speculative decoding and quantization in LLM inference fleets."""


main.add_command(sim)
