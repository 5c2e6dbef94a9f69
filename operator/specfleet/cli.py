"""The one `specfleet` entry point (click). Each command is a thin shell over a module."""

from __future__ import annotations

from pathlib import Path

import click

from specfleet.api import InvalidSpecModel, SpecModel, parse_specmodel
from specfleet.api.crd import RESOURCES, crd_yaml
from specfleet.api.manifests import load_manifests
from specfleet.api.reference import markdown
from specfleet.experiment.cli import experiment
from specfleet.gateway.cli import gateway
from specfleet.refusal import refuse
from specfleet.render import ServingPlan, render
from specfleet.render.plan import DEFAULT_CAPACITY_IMAGE, DEFAULT_GATEWAY_IMAGE
from specfleet.render.plan_file import InvalidPlan, parse_plan
from specfleet.simulate.cli import simulate_command
from specfleet.yamlio import YamlError, dump_all

NOT_A_SPECMODEL = "is not a valid SpecModel"
NOT_A_PLAN = "is not a valid serving plan"


@click.group()
@click.version_option(package_name="specfleet")
def main() -> None:
    """specfleet: guard speculative decoding and quantization in LLM inference fleets."""


@main.command()
@click.option(
    "--kind", type=click.Choice(sorted(RESOURCES)), default="specmodel", show_default=True
)
def crd(kind: str) -> None:
    """Print a CRD (SpecModel or SpecExperiment) generated from the API models."""
    click.echo(crd_yaml(RESOURCES[kind]), nl=False)


@main.command()
def reference() -> None:
    """Print the SpecModel field reference (Markdown), generated from the API models."""
    click.echo(markdown(), nl=False)


@main.command("render")
@click.option("-f", "--filename", type=click.Path(path_type=Path), required=True)
@click.option("--plan", "plan_file", type=click.Path(path_type=Path), default=None)
def render_command(filename: Path, plan_file: Path | None) -> None:
    """Print the manifests the operator would apply for a SpecModel (and a serving plan)."""
    try:
        specmodels = [parse_specmodel(doc) for doc in load_manifests(filename)]
    except InvalidSpecModel as exc:
        refuse(filename, NOT_A_SPECMODEL, [str(error) for error in exc.errors])
    except (YamlError, ValueError) as exc:
        refuse(filename, NOT_A_SPECMODEL, [str(exc)])
    plan = _plan(plan_file, specmodels) if plan_file else None
    click.echo(dump_all(m for sm in specmodels for m in render(sm, plan)), nl=False)


def _plan(path: Path, specmodels: list[SpecModel]) -> ServingPlan:
    try:
        return parse_plan(load_manifests(path), specmodels)
    except InvalidPlan as exc:
        refuse(path, NOT_A_PLAN, [str(error) for error in exc.errors])
    except YamlError as exc:
        refuse(path, NOT_A_PLAN, [str(exc)])


@main.command("run")
@click.option("--namespace", "namespaces", multiple=True, help="Watch only these namespaces.")
@click.option("--metrics-port", type=int, default=9090, show_default=True)
@click.option("--health-port", type=int, default=8081, show_default=True)
@click.option("--log-format", type=click.Choice(["json", "text"]), default="text")
@click.option(
    "--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="info"
)
@click.option("--gateway-image", default=DEFAULT_GATEWAY_IMAGE, show_default=True)
@click.option(
    "--capacity-image",
    default=DEFAULT_CAPACITY_IMAGE,
    show_default=True,
    help="specfleet with guidellm (images/capacity): experiments' load tests.",
)
@click.option("--resync-seconds", type=float, default=300.0, show_default=True)
@click.option(
    "--prometheus-url", default=None, help="Prometheus the guard reads; no guard without."
)
@click.option("--alertmanager-url", default=None, help="Alertmanager for every SpecModel's alerts.")
@click.option("--guard-tick-seconds", type=float, default=5.0, show_default=True)
@click.option(
    "--bind-address",
    default="0.0.0.0",
    show_default=True,
    help="Address the metrics, health and webhook servers listen on.",
)
@click.option(
    "--webhook-port",
    type=int,
    default=None,
    help="Serve the SpecModel admission webhook (HTTPS) on this port.",
)
@click.option("--webhook-cert", default=None, help="The webhook's certificate (PEM file).")
@click.option("--webhook-key", default=None, help="The webhook's private key (PEM file).")
@click.option(
    "--leader-elect/--no-leader-elect",
    default=False,
    show_default=True,
    help="Act only while holding a coordination.k8s.io Lease (run two or more replicas).",
)
@click.option("--lease-name", default="specfleet-operator", show_default=True)
@click.option(
    "--lease-namespace",
    default=None,
    help="Default: $POD_NAMESPACE, else the ServiceAccount's namespace.",
)
@click.option("--lease-seconds", type=float, default=15.0, show_default=True)
@click.option(
    "--renew-deadline-seconds",
    type=float,
    default=10.0,
    show_default=True,
    help="The leader stops acting this long after its last renewal (below --lease-seconds).",
)
@click.option("--retry-seconds", type=float, default=2.0, show_default=True)
def run_command(namespaces: tuple[str, ...], **options: object) -> None:
    """Run the operator."""
    if options["webhook_port"] and not (options["webhook_cert"] and options["webhook_key"]):
        raise click.UsageError("--webhook-port needs --webhook-cert and --webhook-key")
    lease, deadline, retry = (
        options["lease_seconds"],
        options["renew_deadline_seconds"],
        options["retry_seconds"],
    )
    if not 0 < retry < deadline < lease:  # type: ignore[operator]
        raise click.UsageError(
            "leader election needs 0 < --retry-seconds < --renew-deadline-seconds < --lease-seconds"
        )
    from specfleet.controller.run import (  # kopf and the kubernetes client
        RunOptions,
        run,
        tune_collector,
    )

    tune_collector()
    run(RunOptions(namespaces=list(namespaces), **options))  # type: ignore[arg-type]


main.add_command(gateway)
main.add_command(simulate_command)
main.add_command(experiment)
