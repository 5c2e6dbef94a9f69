"""An experiment's verdict for a design review: a Markdown table per class and overall, the
recommendation and why, and a PNG (cost per accepted answer and p95 TPOT per arm and class).

matplotlib is imported lazily, as in `simulate.plot`: the operator image ships without it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from specfleet.api.experiment import EXPERIMENT_KIND
from specfleet.api.verdict import ArmRow, ExperimentVerdict, Latency
from specfleet.experiment.verdict import OVERALL, PER
from specfleet.yamlio import InputError

COLUMNS = [
    "arm",
    "requests",
    "TTFT p50/p95/p99 (s)",
    "TPOT p50/p95/p99 (ms)",
    "acceptance",
    "tool calls valid",
    "JSON valid",
    "truncated",
    "errors",
    "greedy agreement",
    "req/s per replica at SLO",
    "accepted",
    f"cost per {PER} accepted",
    "KV-cache headroom",
]


def load_verdict(path: Path) -> ExperimentVerdict:
    """A verdict saved as JSON, or a SpecExperiment saved with its status (`kubectl get
    specexperiment NAME -o yaml`, or `-o json`)."""
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise InputError(str(path), [str(exc)]) from None
    return verdict_of(data, str(path))


def verdict_of(data: Any, source: str) -> ExperimentVerdict:
    """The verdict in `data`: a verdict, or a SpecExperiment whose status holds one."""
    if isinstance(data, dict) and data.get("kind") == EXPERIMENT_KIND:
        status = data.get("status") or {}
        if status.get("verdict") is None:
            phase = status.get("phase", "Pending")
            problem = f"status.verdict: none yet (phase {phase}): wait until its arms are measured"
            raise InputError(source, [problem])
        data = status["verdict"]
    try:
        return ExperimentVerdict.model_validate(data)
    except ValidationError as exc:
        problems = [
            f"{'.'.join(str(part) for part in e['loc']) or '<root>'}: {e['msg']}"
            for e in exc.errors()
        ]
        raise InputError(source, problems) from None


def markdown(verdict: ExperimentVerdict) -> str:
    chosen = verdict.recommendation or "none"
    lines = [
        "# Experiment: four arms on the same traffic",
        "",
        f"**{verdict.outcome}: {chosen}.** {verdict.reason}.",
        "",
        f"GPU-hour price {verdict.gpu_hour_price:g}; at least {verdict.min_samples} requests "
        "per arm and class. An accepted answer finished (no error, not cut off), is valid where "
        "validity applies and met its class's latency SLOs.",
        "",
        *_table("Overall", verdict.overall),
    ]
    for table in verdict.classes:
        lines += _table(f"Class `{table.name}`", table.rows)
    if verdict.exclusions:
        lines += ["## Excluded", ""]
        lines += [f"- {exclusion.words()}" for exclusion in verdict.exclusions]
        lines.append("")
    return "\n".join(lines)


def _table(title: str, rows: list[ArmRow]) -> list[str]:
    return [
        f"## {title}",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + " --- |" * len(COLUMNS),
        *("| " + " | ".join(_cells(row)) + " |" for row in rows),
        "",
    ]


def _cells(row: ArmRow) -> list[str]:
    cost = row.cost_per_accepted_answer
    return [
        str(row.arm),
        str(row.requests),
        _percentiles(row.ttft, 1.0, "{:.2f}"),
        _percentiles(row.tpot, 1000.0, "{:.1f}"),
        _share(row.acceptance_rate),
        _share(row.tool_call_validity),
        _share(row.structured_output_validity),
        _share(row.truncation_rate),
        _share(row.error_rate),
        _share(row.greedy_agreement),
        f"{row.throughput_at_slo:.2f}",
        _share(row.accepted_share),
        "-" if cost is None else f"{cost * PER:.3f}",
        _share(row.kv_cache_headroom),
    ]


def _percentiles(latency: Latency | None, scale: float, style: str) -> str:
    if latency is None:
        return "-"
    values = (latency.p50_seconds, latency.p95_seconds, latency.p99_seconds)
    return " / ".join(style.format(v * scale) for v in values)


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def draw(verdict: ExperimentVerdict, path: Path) -> None:
    """Two panels of bars per class (and overall), one bar per arm: cost per accepted answer
    and p95 TPOT. Excluded arms are hatched, the recommendation outlined."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = [(OVERALL, verdict.overall), *((t.name, t.rows) for t in verdict.classes)]
    arms = [str(row.arm) for row in verdict.overall]
    excluded = {str(e.arm) for e in verdict.exclusions}
    figure, (costs, tpots) = plt.subplots(2, 1, figsize=(10, 7), layout="constrained")
    width = 0.8 / len(arms)
    for i, arm in enumerate(arms):
        xs = [g + (i - (len(arms) - 1) / 2) * width for g in range(len(groups))]
        rows = [next(r for r in rows if str(r.arm) == arm) for _, rows in groups]
        style = {
            "width": width,
            "label": arm,
            "hatch": "//" if arm in excluded else None,
            "edgecolor": "black" if arm == verdict.recommendation else "white",
            "linewidth": 2 if arm == verdict.recommendation else 0.5,
        }
        costs.bar(xs, [(r.cost_per_accepted_answer or 0.0) * PER for r in rows], **style)
        # overall has no percentiles: the TPOT panel starts at the first class
        tpots.bar(xs[1:], [r.tpot.p95_seconds * 1000 for r in rows[1:] if r.tpot], **style)
    names = [name for name, _ in groups]
    costs.set_xticks(range(len(groups)), names)
    tpots.set_xticks(range(1, len(groups)), names[1:])
    costs.set_ylabel(f"cost per {PER} accepted answers")
    tpots.set_ylabel("p95 TPOT (ms)")
    handles, labels = costs.get_legend_handles_labels()
    figure.legend(
        handles,
        labels,
        loc="outside lower center",
        ncols=len(arms),
        title="arm (hatched: excluded, outlined: recommended)",
    )
    costs.set_title(f"{verdict.outcome}: {verdict.recommendation or 'none'}")
    figure.savefig(path, dpi=100)
    plt.close(figure)
