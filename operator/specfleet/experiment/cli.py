"""`specfleet experiment`: the four arms' verdict, offline (simulated) and as a report."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from specfleet.api.spec import ClassSlo
from specfleet.api.verdict import ExperimentVerdict
from specfleet.experiment.basis import Basis
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
@click.option(
    "--specmodel",
    "specmodel_path",
    type=click.Path(path_type=Path),
    help="With a saved SpecExperiment: its SpecModel (YAML), for the SLOs the report draws "
    "(NAME reads it from the cluster).",
)
@click.option(
    "--currency",
    help="The GPU-hour price's currency, e.g. USD (a SpecExperiment's price names none).",
)
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Output directory.")
def report_command(
    name: str | None,
    namespace: str,
    verdict_path: Path | None,
    specmodel_path: Path | None,
    currency: str | None,
    out: Path,
) -> None:
    """Write OUT/report.md and OUT/report.png from the SpecExperiment NAME's verdict (read from
    the cluster, $KUBECONFIG) or from --verdict. A verdict file's basis (where its throughputs
    came from, the price's source and currency, the SLOs) is read from basis.json beside it,
    which `simulate` writes."""
    from specfleet.experiment import basis as bases
    from specfleet.experiment.report import is_specexperiment, load_document, verdict_of

    if (name is None) == (verdict_path is None):
        raise click.UsageError("give the SpecExperiment's NAME or --verdict FILE, one of them")
    slos = _specmodel_slos(specmodel_path) if specmodel_path else None
    try:
        if verdict_path is not None:
            data = load_document(verdict_path)
            source = str(verdict_path)
        else:
            data = _read_experiment(namespace, str(name))
            source = f"{namespace}/{name}"
            slos = _cluster_slos(namespace, data)
        verdict = verdict_of(data, source)
        if is_specexperiment(data):
            basis = bases.of_specexperiment(data, slos, currency)
        else:
            beside = (verdict_path or Path()).parent / bases.BASIS
            basis = bases.load_basis(beside) if beside.exists() else bases.unknown()
            update = {k: v for k, v in (("currency", currency), ("slos", slos)) if v}
            basis = basis.model_copy(update=update)
    except InputError as exc:
        refuse(exc.source, "holds no valid experiment verdict", exc.problems)
    _write_report(verdict, out, basis)


def _specmodel_slos(path: Path) -> dict[str, ClassSlo]:
    from specfleet.experiment.arms import class_slos
    from specfleet.simulate.inputs import load_specmodel_document, parse_document

    try:
        return class_slos(parse_document(load_specmodel_document(path), str(path)))
    except InputError as exc:
        refuse(exc.source, "is not a valid SpecModel", exc.problems)


def _cluster_slos(namespace: str, experiment: Any) -> dict[str, ClassSlo] | None:
    """The SLOs of the experiment's SpecModel; None when it cannot be read (the report then
    says they are not known)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    from specfleet.api import GROUP, PLURAL, VERSION, parse_specmodel
    from specfleet.cluster_access import api_client
    from specfleet.experiment.arms import class_slos

    try:
        ref = experiment["spec"]["specModelRef"]["name"]
        api = client.CustomObjectsApi(api_client())
        document = api.get_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, ref, _request_timeout=API_TIMEOUT
        )
        return class_slos(parse_specmodel(document)) if isinstance(document, dict) else None
    except (ApiException, KeyError, TypeError, ValueError):
        return None


def _read_experiment(namespace: str, name: str) -> object:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    from specfleet.api import GROUP, VERSION
    from specfleet.api.experiment import EXPERIMENT_PLURAL
    from specfleet.cluster_access import NOT_ALLOWED, api_client, cluster_needed

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
    """Simulate the four arms on the same traffic; write OUT/verdict.json, basis.json (what
    it stands on), report.md and report.png. An arm the operator would refuse is refused here,
    with its message."""
    from specfleet.experiment.basis import BASIS, basis_json
    from specfleet.experiment.simulation import basis, load_experiment, run

    try:
        experiment = load_experiment(specmodel_path, scenario_path, unquantized_source)
    except InputError as exc:
        refuse(exc.source, "cannot be simulated", exc.problems)
    verdict = run(experiment, seed)
    stands_on = basis(experiment)
    out.mkdir(parents=True, exist_ok=True)
    (out / VERDICT).write_text(verdict_json(verdict))
    (out / BASIS).write_text(basis_json(stands_on))
    _write_report(verdict, out, stands_on)


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


def _write_report(verdict: ExperimentVerdict, out: Path, basis: Basis) -> None:
    from specfleet.experiment.report import draw, markdown, why

    out.mkdir(parents=True, exist_ok=True)
    (out / "report.md").write_text(markdown(verdict, basis))
    draw(verdict, out / "report.png", basis)
    click.echo(f"{verdict.outcome}: {verdict.recommendation or 'none'}. {why(verdict, basis)}")
    click.echo(f"wrote {out}/")
