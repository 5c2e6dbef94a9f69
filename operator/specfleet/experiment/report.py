"""An experiment's verdict for a design review: what it stands on (where each throughput came
from, the price and its currency, what the cost's interval covers, the SLOs), the
recommendation and the rule that chose it, a Markdown table per class and overall, every
exclusion with its reason, and a PNG of the same (cost per accepted answer, p95 TTFT and TPOT
against their SLO lines, the exclusions written out).

matplotlib is imported lazily, as in `simulate.plot`: the operator image ships without it."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from specfleet.api.experiment import EXPERIMENT_KIND
from specfleet.api.verdict import (
    NO_THROUGHPUT,
    ArmName,
    ArmRow,
    Exclusion,
    ExperimentVerdict,
    Latency,
    Outcome,
)
from specfleet.experiment.basis import INTERVAL_WORDS, SOURCE_WORDS, Basis, unknown
from specfleet.experiment.verdict import BOTH_MARGIN, OVERALL, PER, cost_bounds, interval_words
from specfleet.signals import GREEDY_AGREEMENT, LABELS, P95_TPOT, P95_TTFT, QUALITY
from specfleet.yamlio import InputError

SIGNALS = {**LABELS, **{s.name: s.report for s in QUALITY}}
"""Exclusion signals in words."""
LOWER_IS_WORSE = {GREEDY_AGREEMENT, *(s.name for s in QUALITY if s.higher_is_better)}


def columns(basis: Basis) -> list[str]:
    return [
        "arm",
        "requests",
        "TTFT p50/p95/p99 (s)",
        "TPOT p50/p95/p99 (ms)",
        "acceptance",
        *(s.column for s in QUALITY),
        "greedy agreement",
        "req/s per replica at SLO",
        "accepted",
        f"cost per {PER} accepted ({basis.money()})",
        "KV-cache headroom",
    ]


def load_verdict(path: Path) -> ExperimentVerdict:
    """A verdict saved as JSON, or a SpecExperiment saved with its status (`kubectl get
    specexperiment NAME -o yaml`, or `-o json`)."""
    return verdict_of(load_document(path), str(path))


def load_document(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise InputError(str(path), [str(exc)]) from None


def is_specexperiment(data: Any) -> bool:
    return isinstance(data, dict) and data.get("kind") == EXPERIMENT_KIND


def verdict_of(data: Any, source: str) -> ExperimentVerdict:
    """The verdict in `data`: a verdict, or a SpecExperiment whose status holds one."""
    if is_specexperiment(data):
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


# -- words --


def why(verdict: ExperimentVerdict, basis: Basis) -> str:
    """One sentence: the rule that chose the recommended arm, and what put the others out (or
    why no arm was chosen)."""
    rows = {str(row.arm): row for row in verdict.overall}
    excluded = _excluded_arms(verdict)
    left = {
        arm: row.cost_per_accepted_answer * PER
        for arm, row in rows.items()
        if arm not in excluded and row.cost_per_accepted_answer
    }
    rule = (
        "the rule serves the cheapest arm per accepted answer among those that meet every "
        "class's p95 latency SLOs and are not confidently worse than the baseline"
    )
    chosen = verdict.recommendation
    if verdict.outcome == Outcome.INCONCLUSIVE:
        return f"No arm is recommended: {verdict.reason}, and {rule} only on enough requests."
    if verdict.outcome == Outcome.NO_ARM or chosen is None:
        return f"No arm is recommended: {rule}, and none does ({_reasons(verdict, excluded)})."
    cost = f"{left[chosen]:.3f} {basis.money()} per {PER} accepted answers"
    cheaper = [
        a for a in excluded if (rows[a].cost_per_accepted_answer or 1e99) * PER < left[chosen]
    ]
    out = f": {_reasons(verdict, excluded, cheaper)}" if excluded else ""
    if len(left) == 1:
        return f"{chosen} is recommended because {rule}, and only {chosen} does ({cost}){out}."
    others = ", ".join(f"{a} {left[a]:.3f}" for a in sorted(left, key=left.__getitem__))
    cheapest = min(left, key=left.__getitem__)
    if cheapest == ArmName.BOTH and chosen != ArmName.BOTH:
        return (
            f"{chosen} is recommended because {rule}, and `both`, though cheapest, must beat "
            f"each single technique by {BOTH_MARGIN:.0%} bound against bound and does not, so "
            f"the cheapest of the rest serves ({others} {basis.money()} per {PER}){out}."
        )
    return (
        f"{chosen} is recommended because {rule}, and it is the cheapest of those "
        f"({others} {basis.money()} per {PER}){out}."
    )


def _excluded_arms(verdict: ExperimentVerdict) -> list[str]:
    seen = {str(e.arm) for e in verdict.exclusions}
    return [str(arm) for arm in ArmName if str(arm) in seen]


def _reasons(verdict: ExperimentVerdict, excluded: list[str], cheaper: Sequence[str] = ()) -> str:
    """What put each excluded arm out, arms with the same reasons together: `quantized and
    both, though cheaper, fail tool-call validity (tools)`."""
    said: dict[str, list[str]] = {}
    for arm in excluded:
        said.setdefault(arm_reasons(verdict, arm), []).append(arm)
    parts = []
    for reasons, arms in said.items():
        though = ", though cheaper," if all(a in cheaper for a in arms) else ""
        parts.append(
            f"{' and '.join(arms)}{though} {'fail' if len(arms) > 1 else 'fails'} {reasons}"
        )
    return "; ".join(parts)


def arm_reasons(verdict: ExperimentVerdict, arm: str) -> str:
    """`p95 TPOT (code, chat)`: the signals that excluded the arm, with their classes. An arm
    out on latency has no throughput at SLO either: that is said only when it is all."""
    signals: dict[str, list[str]] = {}
    for e in verdict.exclusions:
        if str(e.arm) == arm and e.signal != NO_THROUGHPUT:
            signals.setdefault(SIGNALS.get(e.signal, e.signal), []).append(e.class_name)
    if not signals:
        return "every latency SLO at any load"
    return " and ".join(f"{s} ({', '.join(c)})" for s, c in signals.items())


def exclusion_words(e: Exclusion) -> str:
    """One exclusion, its value against its limit, in words a reader without the code gets."""
    if e.signal == NO_THROUGHPUT:
        return (
            f"{e.arm}: at no load does every class keep its p95 latency inside its SLO, so it "
            "serves no accepted answer at SLO (throughput 0)"
        )
    name = SIGNALS.get(e.signal, e.signal)
    counts = f"n={e.samples:.0f}" + (
        "" if e.baseline_samples is None else f" vs {e.baseline_samples:.0f}"
    )
    if e.signal in (P95_TTFT, P95_TPOT):
        return (
            f"{e.arm}, {e.class_name}: {name} {e.value * 1000:.1f} ms over its SLO "
            f"{e.limit * 1000:.1f} ms ({counts})"
        )
    side = "under" if e.signal in LOWER_IS_WORSE else "over"
    versus = "" if e.baseline is None else f" vs the baseline's {e.baseline:.3f}"
    return (
        f"{e.arm}, {e.class_name}: {name} {e.value:.3f}{versus}, {side} the limit "
        f"{e.limit:.3f} ({counts})"
    )


def basis_lines(verdict: ExperimentVerdict, basis: Basis) -> list[str]:
    """What the numbers stand on, one item each."""
    sources = basis.sources()
    if len(sources) == 1:
        [source] = sources
        details = sorted({t.detail for t in basis.throughput.values() if t.detail})
        more = f" ({'; '.join(details)})" if details else ""
        throughput = f"Throughput at SLO (every arm's): {SOURCE_WORDS[source]}{more}."
    else:
        each = "; ".join(
            f"{arm}: {t.source}{f' ({t.detail})' if t.detail else ''}"
            for arm, t in basis.throughput.items()
        )
        words = " ".join(f"{s.capitalize()}: {SOURCE_WORDS[s]}." for s in sorted(sources))
        throughput = f"Throughput at SLO: {each}. {words}"
    money = f"{verdict.gpu_hour_price:g} {basis.currency or ''}".rstrip()
    price = f"Price: {money} per GPU hour ({basis.price_source})."
    if basis.currency is None:
        price += " It names no currency: costs are in the price's own units."
    uncertain = "; ".join(INTERVAL_WORDS[s] for s in sorted(sources))
    return [
        throughput,
        price,
        f"Cost interval (95%): Wilson's over the arm's requests, for the accepted share only "
        f"({_intervals(verdict)}); thousands of requests make it narrow, and the throughput's "
        f"uncertainty is not in it ({uncertain}).",
        f"Samples: at least {verdict.min_samples} requests per arm and class. An accepted "
        "answer finished (no error, not cut off), is valid where validity applies and met its "
        "class's latency SLOs.",
        f"SLOs: {slo_words(basis)}.",
    ]


def _intervals(verdict: ExperimentVerdict) -> str:
    said = []
    for row in verdict.overall:
        bounds = cost_bounds(row)
        if bounds is None:
            said.append(f"{row.arm}: none, no cost")
        else:
            low, high = bounds[0] * PER, bounds[1] * PER
            said.append(f"{row.arm} {interval_words(low, high, what='', only=False)}")
    return f"overall, per {PER}: " + "; ".join(said)


def slo_words(basis: Basis) -> str:
    if not basis.slos:
        return "not known here (they are the SpecModel's; the limits an exclusion names are)"
    parts = []
    for name, slo in basis.slos.items():
        limits = [
            f"{label} <= {value * 1000:g} ms"
            for label, value in (
                (LABELS[P95_TTFT], slo.max_p95_ttft_seconds),
                (LABELS[P95_TPOT], slo.max_p95_tpot_seconds),
            )
            if value is not None
        ]
        limits += [
            f"{s.report} {'>=' if s.higher_is_better else '<='} {bound:g}"
            for s in QUALITY
            if (bound := s.slo(slo)) is not None
        ]
        parts.append(f"{name} {', '.join(limits) or 'none'}")
    return "; ".join(parts)


# -- Markdown --


def markdown(verdict: ExperimentVerdict, basis: Basis | None = None) -> str:
    basis = basis or unknown()
    chosen = verdict.recommendation or "none"
    lines = [
        "# Experiment: four arms on the same traffic",
        "",
        f"**{verdict.outcome}: {chosen}.** {why(verdict, basis)}",
        "",
        f"The verdict's words: {verdict.reason}.",
        "",
        "## Basis",
        "",
        *(f"- {line}" for line in basis_lines(verdict, basis)),
        "",
    ]
    if verdict.exclusions:
        lines += ["## Excluded", ""]
        lines += [f"- {exclusion_words(e)} (`{e.signal}`)" for e in verdict.exclusions]
        lines.append("")
    lines += _table("Overall", verdict.overall, basis)
    for table in verdict.classes:
        lines += _table(f"Class `{table.name}`", table.rows, basis)
    return "\n".join(lines)


def _table(title: str, rows: list[ArmRow], basis: Basis) -> list[str]:
    heads = columns(basis)
    return [
        f"## {title}",
        "",
        "| " + " | ".join(heads) + " |",
        "|" + " --- |" * len(heads),
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
        *(_share(getattr(row, s.arm_field)) for s in QUALITY),
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


# -- the picture --

WRAP = 140


def draw(verdict: ExperimentVerdict, path: Path, basis: Basis | None = None) -> None:
    """The picture as a palette PNG (bars and text need few colours: under half the size)."""
    import io

    import matplotlib.pyplot as plt
    from PIL import Image

    drawn = figure_of(verdict, basis)
    buffer = io.BytesIO()
    drawn.savefig(buffer, format="png", dpi=100)
    plt.close(drawn)
    Image.open(buffer).convert("RGB").quantize(colors=256).save(path, format="PNG", optimize=True)


def figure_of(verdict: ExperimentVerdict, basis: Basis | None = None) -> Any:
    """Bars per class (and overall), one per arm: cost per accepted answer, p95 TTFT and p95
    TPOT with each class's SLO as a dashed line (a value over it in red). Excluded arms are
    hatched and pale, the recommended one outlined; the title says why it was chosen, the
    legend what put each other arm out, the foot every exclusion and what the numbers stand
    on."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    basis = basis or unknown()
    groups = [(OVERALL, verdict.overall), *((t.name, t.rows) for t in verdict.classes)]
    arms = [str(row.arm) for row in verdict.overall]
    excluded = set(_excluded_arms(verdict))
    colours = {arm: f"C{i}" for i, arm in enumerate(arms)}
    foot = _foot(verdict, basis)
    said = textwrap.wrap(why(verdict, basis), WRAP)
    head = 0.22 * len(said) + 0.7
    figure = plt.figure(figsize=(12, 9 + 0.13 * len(foot) + head), layout="constrained")
    grid = figure.add_gridspec(5, 1, height_ratios=[head, 3, 2, 2, 0.17 * len(foot)])
    header, costs, ttfts, tpots, words = (figure.add_subplot(grid[i]) for i in range(5))
    width = 0.8 / len(arms)
    names = [name for name, _ in groups]
    classes = names[1:]

    def bars(
        axes: Any,
        xs: list[float],
        values: list[float | None],
        arm: str,
        limits: list[float | None] | None = None,
    ) -> None:
        chosen = arm == verdict.recommendation
        kept = [i for i, v in enumerate(values) if v is not None]
        drawn = axes.bar(
            [xs[i] for i in kept],
            [values[i] for i in kept],
            width=width,
            color=colours[arm],
            alpha=0.45 if arm in excluded else 1.0,
            hatch="//" if arm in excluded else None,
            edgecolor="black" if chosen else "white",
            linewidth=2.5 if chosen else 0.5,
        )
        labels = axes.bar_label(drawn, fmt="%.3g", fontsize=7, padding=1)
        for i, label in zip(kept, labels, strict=True):
            limit = (limits or [None] * len(values))[i]
            if limit is not None and (values[i] or 0.0) > limit:
                label.set(color="red", fontweight="bold")

    def limits(attribute: str) -> list[float | None]:
        found = [getattr(basis.slos[c], attribute) if c in basis.slos else None for c in classes]
        return [None if f is None else f * 1000 for f in found]

    for i, arm in enumerate(arms):
        xs = [g + (i - (len(arms) - 1) / 2) * width for g in range(len(groups))]
        rows = [next(r for r in rows if str(r.arm) == arm) for _, rows in groups]
        cost = [
            None if r.cost_per_accepted_answer is None else r.cost_per_accepted_answer * PER
            for r in rows
        ]
        bars(costs, xs, cost, arm)
        for x, value in zip(xs, cost, strict=True):
            if value is None:
                costs.text(
                    x,
                    0,
                    "no load\nwithin SLO",
                    ha="center",
                    va="bottom",
                    fontsize=7,
                    rotation=90,
                    color=colours[arm],
                )
        # overall has no percentiles: the latency panels start at the first class
        ttft = [r.ttft.p95_seconds * 1000 if r.ttft else None for r in rows[1:]]
        tpot = [r.tpot.p95_seconds * 1000 if r.tpot else None for r in rows[1:]]
        bars(ttfts, xs[1:], ttft, arm, limits("max_p95_ttft_seconds"))
        bars(tpots, xs[1:], tpot, arm, limits("max_p95_tpot_seconds"))
    for axes, attribute, label in (
        (ttfts, "max_p95_ttft_seconds", "TTFT"),
        (tpots, "max_p95_tpot_seconds", "TPOT"),
    ):
        _slo_lines(axes, classes, basis, attribute, label)
        axes.set_xticks(range(1, len(groups)), classes)
        axes.set_xlim(0.5, len(groups) - 0.5)
        axes.set_ylabel(f"p95 {label} (ms)")
        axes.margins(y=0.15)
    costs.set_xticks(range(len(groups)), names)
    costs.set_ylabel(f"{basis.money()} per {PER}\naccepted answers")
    costs.margins(y=0.12)
    costs.set_title(
        "Cost per accepted answer (GPU-hour price × GPUs ÷ accepted answers an hour at the "
        "throughput at SLO)",
        fontsize=9,
        loc="left",
    )
    ttfts.set_title(
        "p95 latency per class; dashed: the class's SLO, a value over it in red",
        fontsize=9,
        loc="left",
    )
    outcome = "Recommended" if verdict.outcome == Outcome.RECOMMENDED else str(verdict.outcome)
    figure.suptitle(
        f"{outcome}: {verdict.recommendation or 'none'}", fontsize=15, fontweight="bold"
    )
    header.axis("off")
    header.text(
        0.5, 1, "\n".join(said), va="top", ha="center", fontsize=9.5, transform=header.transAxes
    )
    words.axis("off")
    words.text(0, 1, "\n".join(foot), va="top", ha="left", fontsize=8, transform=words.transAxes)
    handles: list[Any] = [
        Patch(facecolor=colours[arm], label=_arm_label(verdict, arm)) for arm in arms
    ]
    handles += [
        Patch(facecolor="white", edgecolor="grey", hatch="//", label="hatched: excluded"),
        Patch(facecolor="white", edgecolor="black", linewidth=2.5, label="outlined: recommended"),
        Line2D([], [], color="black", linestyle="--", label="dashed: SLO (p95 limit)"),
    ]
    header.legend(handles=handles, loc="lower center", fontsize=8, ncols=3)
    return figure


def _arm_label(verdict: ExperimentVerdict, arm: str) -> str:
    if arm == verdict.recommendation:
        return f"{arm}: recommended"
    if arm in _excluded_arms(verdict):
        return f"{arm}: out on {arm_reasons(verdict, arm)}"
    rows = {str(row.arm): row for row in verdict.overall}
    chosen = rows.get(str(verdict.recommendation))
    cost, best = rows[arm].cost_per_accepted_answer, chosen and chosen.cost_per_accepted_answer
    if arm == ArmName.BOTH and cost and best and cost < best:
        return f"{arm}: cheaper, not by the {BOTH_MARGIN:.0%} margin past the bounds"
    return f"{arm}: passes, costs more" if chosen else f"{arm}: passes"


def _slo_lines(axes: Any, classes: list[str], basis: Basis, attribute: str, name: str) -> None:
    for g, klass in enumerate(classes, start=1):
        slo = basis.slos.get(klass)
        limit = getattr(slo, attribute) if slo else None
        if limit is None:
            said = f"no {name} SLO" if slo else "SLO not known"
            axes.text(
                g,
                0.97,
                said,
                transform=axes.get_xaxis_transform(),
                ha="center",
                va="top",
                fontsize=8,
                color="grey",
            )
            continue
        axes.hlines(limit * 1000, g - 0.45, g + 0.45, colors="black", linestyles="--")
        axes.text(
            g + 0.45,
            limit * 1000,
            f"SLO {limit * 1000:g} ms",
            ha="right",
            va="bottom",
            fontsize=8,
        )


def _foot(verdict: ExperimentVerdict, basis: Basis) -> list[str]:
    lines = ["Excluded:" if verdict.exclusions else "Excluded: none"]
    lines += [f"  - {exclusion_words(e)}" for e in verdict.exclusions]
    lines.append("Basis:")
    for line in basis_lines(verdict, basis):
        wrapped = textwrap.wrap(line, WRAP + 30)
        lines += [f"  - {wrapped[0]}", *(f"    {rest}" for rest in wrapped[1:])]
    return lines
