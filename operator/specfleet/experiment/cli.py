"""`specfleet experiment`: the four arms' verdict, offline (simulated) and as a report."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import NoReturn

import click

from specfleet.experiment.verdict import ExperimentVerdict

EXIT_INVALID = 2
VERDICT = "verdict.json"


@click.group("experiment")
def experiment() -> None:
    """Baseline, quantized, speculative and both on the same traffic: which one to serve."""


@experiment.command("report")
@click.argument("name", required=False)
@click.option("-n", "--namespace", default="default", show_default=True)
@click.option(
    "--verdict",
    "verdict_path",
    type=click.Path(path_type=Path),
    help="Offline: a verdict (JSON) or a saved SpecExperiment (`kubectl get specexperiment NAME "
    "-o yaml`) instead of NAME.",
)
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Output directory.")
def report_command(name: str | None, namespace: str, verdict_path: Path | None, out: Path) -> None:
    """Write OUT/report.md and OUT/report.png from the SpecExperiment NAME's verdict (read from
    the cluster, $KUBECONFIG) or from --verdict."""
    from specfleet.experiment.report import VerdictInputError, load_verdict, verdict_of

    if (name is None) == (verdict_path is None):
        raise click.UsageError("give the SpecExperiment's NAME or --verdict FILE, one of them")
    try:
        if verdict_path is not None:
            verdict = load_verdict(verdict_path)
        else:
            verdict = verdict_of(_read_experiment(namespace, str(name)), f"{namespace}/{name}")
    except VerdictInputError as exc:
        _refuse(exc.source, "holds no valid experiment verdict", exc.problems)
    _write_report(verdict, out)


def _read_experiment(namespace: str, name: str) -> object:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    from specfleet.api import GROUP, VERSION
    from specfleet.api.experiment import EXPERIMENT_PLURAL
    from specfleet.controller.kube import api_client

    api = client.CustomObjectsApi(api_client())
    try:
        return api.get_namespaced_custom_object(GROUP, VERSION, namespace, EXPERIMENT_PLURAL, name)
    except ApiException as exc:
        _refuse(f"specexperiments/{name} in {namespace}", "cannot be read", [str(exc.reason)])


@experiment.command("simulate")
@click.option("--specmodel", "specmodel_path", type=click.Path(path_type=Path), required=True)
@click.option(
    "--scenario",
    "scenario_path",
    type=click.Path(path_type=Path),
    required=True,
    help="Scenario YAML with an `arms:` section (each arm's effects).",
)
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Output directory.")
@click.option("--seed", type=int, default=None, help="Default: the scenario's seed.")
def simulate_command(
    specmodel_path: Path, scenario_path: Path, out: Path, seed: int | None
) -> None:
    """Simulate the four arms on the same traffic; write OUT/verdict.json, report.md and
    report.png."""
    from specfleet.experiment.simulation import load_experiment, run
    from specfleet.simulate.inputs import SimulationInputError

    try:
        experiment = load_experiment(specmodel_path, scenario_path)
    except SimulationInputError as exc:
        _refuse(exc.source, "cannot be simulated", exc.problems)
    verdict = run(experiment, seed)
    out.mkdir(parents=True, exist_ok=True)
    (out / VERDICT).write_text(verdict_json(verdict))
    _write_report(verdict, out)


def verdict_json(verdict: ExperimentVerdict) -> str:
    return verdict.model_dump_json(by_alias=True, indent=2) + "\n"


def _write_report(verdict: ExperimentVerdict, out: Path) -> None:
    from specfleet.experiment.report import draw, markdown

    out.mkdir(parents=True, exist_ok=True)
    (out / "report.md").write_text(markdown(verdict))
    draw(verdict, out / "report.png")
    click.echo(f"{verdict.outcome}: {verdict.recommendation or 'none'}. {verdict.reason}")
    click.echo(f"wrote {out}/")


def _refuse(source: str, what: str, problems: list[str]) -> NoReturn:
    click.echo(f"error: {source} {what}:", err=True)
    for problem in problems:
        click.echo(f"  {problem}", err=True)
    sys.exit(EXIT_INVALID)
