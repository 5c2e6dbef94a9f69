"""`specfleet gateway`: the sidecar in every engine pod."""

from __future__ import annotations

import click


@click.command()
def gateway() -> None:
    """Streaming reverse proxy that measures acceptance, latency and output quality per class."""
    raise click.ClickException("not implemented yet")
