"""`specfleet gateway`: the sidecar in every engine pod."""

from __future__ import annotations

import logging
from pathlib import Path

import click
import uvloop

from specfleet.gateway.config import ConfigError, load_gateway_config, load_specmodel_config
from specfleet.gateway.proxy import ProxySettings
from specfleet.gateway.server import Address, GatewayServer, Watch, run


def _address(ctx: click.Context, param: click.Parameter, value: str) -> Address:
    try:
        return Address.parse(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


@click.command()
@click.option("--upstream", required=True, help="Engine base URL, e.g. http://127.0.0.1:8000.")
@click.option("--listen", default="0.0.0.0:8080", show_default=True, callback=_address)
@click.option("--metrics-listen", default="0.0.0.0:9090", show_default=True, callback=_address)
@click.option(
    "--config",
    "config_file",
    type=click.Path(path_type=Path, dir_okay=False),
    help="GatewayConfig YAML (the rendered ConfigMap); reloaded when it changes.",
)
@click.option(
    "--specmodel",
    "specmodel_file",
    type=click.Path(path_type=Path, dir_okay=False),
    help="SpecModel YAML to derive the configuration from (outside Kubernetes).",
)
@click.option("--reload-interval", default=2.0, show_default=True, help="Seconds between polls.")
@click.option("--connect-timeout", default=1.5, show_default=True, help="Seconds; then 502.")
@click.option(
    "--upstream-timeout",
    default=600.0,
    show_default=True,
    help="Longest silence from the engine, seconds; then 504.",
)
@click.option(
    "--client-timeout",
    default=60.0,
    show_default=True,
    help="Longest a client may take to send its body or take a chunk, seconds.",
)
@click.option(
    "--stream-deadline",
    default=3600.0,
    show_default=True,
    help="Longest a streamed answer may take from the request's arrival, seconds; then it is cut.",
)
@click.option(
    "--shutdown-grace",
    default=30.0,
    show_default=True,
    help="On SIGTERM, seconds in-flight requests may take to finish.",
)
@click.option("--log-level", default="INFO", show_default=True)
def gateway(
    upstream: str,
    listen: Address,
    metrics_listen: Address,
    config_file: Path | None,
    specmodel_file: Path | None,
    reload_interval: float,
    connect_timeout: float,
    upstream_timeout: float,
    client_timeout: float,
    stream_deadline: float,
    shutdown_grace: float,
    log_level: str,
) -> None:
    """Streaming reverse proxy that measures acceptance, latency and output quality per class."""
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if (config_file is None) == (specmodel_file is None):
        raise click.UsageError("give exactly one of --config or --specmodel")
    path = config_file or specmodel_file
    assert path is not None
    loader = load_gateway_config if config_file else load_specmodel_config
    try:
        config = loader(path)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    settings = ProxySettings(
        upstream=upstream,
        connect_timeout=connect_timeout,
        upstream_timeout=upstream_timeout,
        client_timeout=client_timeout,
        stream_deadline=stream_deadline,
    )
    server = GatewayServer(
        config,
        settings,
        listen,
        metrics_listen,
        watch=Watch(path, loader, reload_interval),
        shutdown_grace=shutdown_grace,
    )
    uvloop.run(run(server))
