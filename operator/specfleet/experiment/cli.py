"""`specfleet experiment`: the four arms' verdict, offline (simulated) and as a report."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from specfleet.api.spec import ClassSlo
from specfleet.api.verdict import ExperimentVerdict
from specfleet.refusal import refuse
from specfleet.yamlio import InputError

EXIT_FAILED = 1
VERDICT = "verdict.json"
OFFLINE = "--verdict FILE (a verdict or a saved SpecExperiment) needs none"
API_TIMEOUT = (10, 60)
"""Seconds to connect to the API server and to read its answer: an unreachable one is named."""


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
    from specfleet.experiment.report import load_verdict, verdict_of

    if (name is None) == (verdict_path is None):
        raise click.UsageError("give the SpecExperiment's NAME or --verdict FILE, one of them")
    try:
        if verdict_path is not None:
            verdict = load_verdict(verdict_path)
        else:
            verdict = verdict_of(_read_experiment(namespace, str(name)), f"{namespace}/{name}")
    except InputError as exc:
        refuse(exc.source, "holds no valid experiment verdict", exc.problems)
    _write_report(verdict, out)


def _read_experiment(namespace: str, name: str) -> object:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    from specfleet.api import GROUP, VERSION
    from specfleet.api.experiment import EXPERIMENT_PLURAL
    from specfleet.cluster_access import NOT_ALLOWED, cluster_needed
    from specfleet.controller.kube import api_client

    with cluster_needed("specfleet experiment report NAME", offline=OFFLINE):
        api = client.CustomObjectsApi(api_client())
        try:
            return api.get_namespaced_custom_object(
                GROUP, VERSION, namespace, EXPERIMENT_PLURAL, name, _request_timeout=API_TIMEOUT
            )
        except ApiException as exc:
            if exc.status in NOT_ALLOWED:
                raise  # the kubeconfig's user, not this experiment: cluster_needed says so
            refuse(f"specexperiments/{name} in {namespace}", "cannot be read", [str(exc.reason)])


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
@click.option(
    "--unquantized-source",
    help="The checkpoint the arms without quantization serve when the SpecModel's is "
    "pre-quantized: a SpecExperiment's spec.unquantizedSource.",
)
def simulate_command(
    specmodel_path: Path,
    scenario_path: Path,
    out: Path,
    seed: int | None,
    unquantized_source: str | None,
) -> None:
    """Simulate the four arms on the same traffic; write OUT/verdict.json, report.md and
    report.png. An arm the operator would refuse is refused here, with its message."""
    from specfleet.experiment.simulation import load_experiment, run

    try:
        experiment = load_experiment(specmodel_path, scenario_path, unquantized_source)
    except InputError as exc:
        refuse(exc.source, "cannot be simulated", exc.problems)
    verdict = run(experiment, seed)
    out.mkdir(parents=True, exist_ok=True)
    (out / VERDICT).write_text(verdict_json(verdict))
    _write_report(verdict, out)


@experiment.command("capacity")
@click.option("--url", required=True, help="The arm's OpenAI-compatible base URL.")
@click.option(
    "--requests",
    "requests_path",
    type=click.Path(path_type=Path),
    required=True,
    help="JSONL of chat or completion request bodies, each with its `class`.",
)
@click.option(
    "--slo",
    "slo_json",
    required=True,
    help="Each class's SLO as the SpecModel gives it, as JSON: "
    '\'{"chat": {"maxP95TtftSeconds": 1, "maxP95TpotSeconds": 0.05}}\'.',
)
@click.option("--max-concurrency", type=click.IntRange(min=1), required=True)
@click.option("--steps", type=click.IntRange(min=1), default=8, show_default=True)
@click.option(
    "--step-seconds",
    type=click.FloatRange(min=1),
    default=300.0,
    show_default=True,
    help="A step that takes longer ends there.",
)
@click.option(
    "--guidellm",
    envvar="SPECFLEET_GUIDELLM",
    default="guidellm",
    show_default=True,
    help="The guidellm command (hack/guidellm.sh builds one).",
)
@click.option(
    "--result-file",
    type=click.Path(path_type=Path),
    help="Also write the compact result (no steps) here, e.g. /dev/termination-log.",
)
@click.option(
    "--report", "report_path", type=click.Path(path_type=Path), help="Keep guidellm's report."
)
def capacity_command(
    url: str,
    requests_path: Path,
    slo_json: str,
    max_concurrency: int,
    steps: int,
    step_seconds: float,
    guidellm: str,
    result_file: Path | None,
    report_path: Path | None,
) -> None:
    """Replay the requests against one arm at rising concurrency (guidellm) and print its
    throughput at SLO with each step's per-class p95s, as JSON."""
    import shutil
    import subprocess
    import tempfile

    from specfleet.experiment import guidellm as tool
    from specfleet.experiment.capacity import capacity, concurrency_steps, termination_message
    from specfleet.experiment.replay import load_requests

    try:
        requests = load_requests(requests_path)
    except InputError as exc:
        refuse(exc.source, "cannot be replayed", exc.problems)
    slos = _slos(slo_json, {r.class_name for r in requests})
    with tempfile.TemporaryDirectory(prefix="specfleet-capacity-") as workdir:
        try:
            report = tool.run(
                guidellm,
                url,
                requests,
                concurrency_steps(max_concurrency, steps),
                Path(workdir),
                step_seconds,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            click.echo(f"error: guidellm failed: {exc}", err=True)
            sys.exit(EXIT_FAILED)
        if report_path:
            shutil.copyfile(Path(workdir) / "report.json", report_path)
    try:
        result = capacity(tool.steps(report, requests), slos)
    except tool.ReportError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_FAILED)
    if result_file:
        result_file.write_text(termination_message(result))
    click.echo(result.model_dump_json(by_alias=True, indent=2))


def _slos(slo_json: str, classes: set[str]) -> dict[str, ClassSlo]:
    from pydantic import TypeAdapter, ValidationError

    try:
        slos = TypeAdapter(dict[str, ClassSlo]).validate_json(slo_json)
    except ValidationError as exc:
        refuse("--slo", "is not a class → SLO map", [str(e["msg"]) for e in exc.errors()])
    unmeasured = sorted(set(slos) - classes)
    if unmeasured:
        refuse("--slo", "names classes the requests lack", unmeasured)
    return slos


def verdict_json(verdict: ExperimentVerdict) -> str:
    return verdict.model_dump_json(by_alias=True, indent=2) + "\n"


def _write_report(verdict: ExperimentVerdict, out: Path) -> None:
    from specfleet.experiment.report import draw, markdown

    out.mkdir(parents=True, exist_ok=True)
    (out / "report.md").write_text(markdown(verdict))
    draw(verdict, out / "report.png")
    click.echo(f"{verdict.outcome}: {verdict.recommendation or 'none'}. {verdict.reason}")
    click.echo(f"wrote {out}/")
