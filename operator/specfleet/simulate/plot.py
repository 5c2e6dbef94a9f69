"""timeline.png: one picture of a replay that explains itself.

From the top: what the guard did (every decision a labelled marker, labels staggered so none
overlaps, and the scenario's Git changes), then what it saw against the truth, per class:
acceptance, speedup, p95 TPOT and validity, each with its floor or SLO; the fleet's readings as
solid lines, its canary's (a trial's or a canary rollout's pods) as circles, the plain pool's
p95 TPOT as squares; a line never crosses a window without samples. Shaded bands: the kill
switch engaged (red), a trial's canary (orange), a canary rollout's canary (blue). At the
bottom, lanes: the fleet's revision, the canary and its revision, speculation on or off, and
the plain pool, when there is one. The x axis is the scenario's own time.

matplotlib is imported here, lazily: the operator image ships without it.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specfleet.api.status import KillSwitchState
from specfleet.guard.actions import ActionKind
from specfleet.signals import ACCEPTANCE_RATE, LABELS, QUALITY
from specfleet.simulate.replay import Seen, Tick
from specfleet.simulate.simulation import Result
from specfleet.simulate.truth import Truth

ACTION_STYLES: dict[str, tuple[str, str]] = {
    ActionKind.KILL_SWITCH_ENGAGED: ("tab:red", "-"),
    ActionKind.TRIAL_STARTED: ("tab:orange", ":"),
    ActionKind.TRIAL_FAILED: ("darkred", "--"),
    ActionKind.KILL_SWITCH_RELEASED: ("tab:green", "-"),
    ActionKind.ROLLED_BACK: ("tab:purple", "-"),
    ActionKind.REVISION_PROMOTED: ("tab:blue", ":"),
    ActionKind.CLASS_BREACH: ("tab:pink", ":"),
    ActionKind.CLASS_RECOVERED: ("tab:olive", ":"),
    ActionKind.ROLLOUT_ABORTED: ("crimson", "-"),
    ActionKind.ROLLOUT_STEP_PASSED: ("steelblue", "--"),
    ActionKind.ROLLOUT_PROMOTED: ("navy", "-"),
    ActionKind.QUALITY_BREACH: ("tab:purple", "--"),
    ActionKind.CLASS_SPECULATION_OFF: ("darkviolet", "-"),
    ActionKind.CLASS_TRIAL_STARTED: ("tab:pink", ":"),
    ActionKind.CLASS_TRIAL_FAILED: ("darkmagenta", "--"),
    ActionKind.CLASS_SPECULATION_ON: ("tab:green", "--"),
}
"""Colour and line style of each decision's marker and line."""
CLASS_SWITCH_WORDS = {
    ActionKind.CLASS_TRIAL_STARTED: "class trial",
    ActionKind.CLASS_TRIAL_FAILED: "class trial failed",
    ActionKind.CLASS_SPECULATION_ON: "back on speculation",
}
"""A class switch's decisions that need no more words than its class."""
BANDS: dict[str, tuple[str, float, str]] = {
    KillSwitchState.ENGAGED: ("tab:red", 0.08, "kill switch engaged"),
    KillSwitchState.TRIAL: ("tab:orange", 0.18, "trial canary"),
    "rollout": ("tab:blue", 0.12, "rollout canary"),
}
SIGNALS = {
    **LABELS,
    "acceptance": LABELS[ACCEPTANCE_RATE],  # a speculation breach's words: `acceptance 0.41 < ...`
    **{s.name: s.plot for s in QUALITY},
}
"""Signals in the labels' words."""
MAX_POINTS = 720
"""Longer runs draw block means (see `Points`)."""
DPI = 72
WIDTH_INCHES = 12.0
LEFT, RIGHT = 0.085, 0.845
LABEL_POINTS = 7.5
ROW_INCHES = 0.2


def draw_timeline(result: Result, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    duration = result.world.scenario.duration_s
    scale, unit = (3600.0, "hours") if duration > 3 * 3600 else (60.0, "minutes")
    stride = max(1, len(result.run.ticks) // MAX_POINTS)
    view = Points(result.run.ticks, result.truths, scale, stride)
    xlim = (-0.01 * duration / scale, 1.01 * duration / scale)
    labels = _labels(result, scale)
    rows = label_rows(labels, xlim)
    quality = any(
        v is not None
        for t in result.run.ticks
        for seen in (t.fleet, t.canary)
        if seen is not None
        for v in seen.validity.values()
    )
    panels: list[tuple[float, Callable[[Any], None]]] = [
        (
            0.35 + ROW_INCHES * max(rows.values(), default=0),
            lambda a: draw_decision_lane(a, labels, rows),
        ),
        (2.2, lambda a: _acceptance(a, result, view)),
        (1.6, lambda a: _speedup(a, view)),
        (1.8, lambda a: _tpot(a, result, view)),
    ]
    if quality:
        panels.append((1.6, lambda a: _validity(a, result, view)))
    panels.append((1.0, lambda a: _lanes(a, result, scale)))
    heights = [h for h, _ in panels]
    total = sum(heights) + 1.6
    figure, axes = plt.subplots(
        len(panels),
        1,
        figsize=(WIDTH_INCHES, total),
        sharex=True,
        gridspec_kw={"height_ratios": heights, "hspace": 0.12},
    )
    figure.subplots_adjust(left=LEFT, right=RIGHT, top=1 - 0.45 / total, bottom=0.9 / total)
    for axis, (_, draw) in zip(axes, panels, strict=True):
        axis.set_xlim(*xlim)
        draw(axis)
        axis.set_xlim(*xlim)
    for axis in axes[1:-1]:
        _bands(axis, result, scale)
        _decision_lines(axis, result, scale)
        axis.grid(axis="y", lw=0.3, alpha=0.5)
    axes[-1].set_xlabel(f"{unit} from the scenario's start")
    specmodel = result.world.changes[0].specmodel.metadata.name
    axes[0].set_title(
        f"{specmodel}: guard replay of {result.world.scenario.duration_s / scale:g} {unit}, "
        f"seed {result.seed}",
        fontsize=10,
    )
    _save(figure, path)
    plt.close(figure)


def _save(figure: Any, path: Path) -> None:
    """A palette PNG: a line chart needs few colours, and the file is about half the size."""
    from PIL import Image

    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=DPI)
    image = Image.open(buffer).convert("RGB").quantize(colors=128)
    image.save(path, format="PNG", optimize=True)


@dataclass(frozen=True)
class Points:
    """The ticks and their truths, drawn one point per tick or, for a long run, one per block
    of `stride` ticks (the block's mean: bands and decision markers stay exact)."""

    ticks: list[Tick]
    truths: list[Truth]
    scale: float
    stride: int = 1

    @property
    def times(self) -> list[float]:
        return [tick.t / self.scale for tick in self.ticks[:: self.stride]]

    def line(self, values: Sequence[float | None]) -> list[float]:
        """Block means; NaN (a gap in the line) where a block has no sample."""
        out = []
        for start in range(0, len(values), self.stride):
            known = [v for v in values[start : start + self.stride] if v is not None]
            out.append(sum(known) / len(known) if known else float("nan"))
        return out

    def seen(self, side: str, field: str, name: str, factor: float = 1.0) -> list[float]:
        """A class's reading on one side (`fleet`, `canary` or `plain`) per point."""
        values = []
        for tick in self.ticks:
            seen: Seen | None = getattr(tick, side)
            value = getattr(seen, field).get(name) if seen is not None else None
            values.append(value * factor if value is not None else None)
        return self.line(values)


# -- what the guard did ------------------------------------------------------------------------


@dataclass(frozen=True)
class Label:
    x: float
    text: str
    color: str
    style: str
    width: float
    """In x-axis units."""


def _labels(result: Result, scale: float) -> list[Label]:
    """One per decision and per Git change of the scenario, in time order."""
    duration = result.world.scenario.duration_s / scale

    def width(text: str) -> float:
        return label_width(text, duration, WIDTH_INCHES * (RIGHT - LEFT))

    found = []
    for change in result.world.changes[1:]:
        number = result.world.revisions[change.config].number
        text = f"Git: spec → rev {number}"
        found.append(Label(change.t / scale, text, "dimgray", "--", width(text)))
    for decision in result.run.decisions:
        color, style = ACTION_STYLES.get(decision["action"], ("gray", "-"))
        text = describe(decision)
        found.append(Label(decision["t"] / scale, text, color, style, width(text)))
    return sorted(found, key=lambda label: label.x)


def label_width(text: str, span: float, axis_inches: float) -> float:
    """How much of an axis `span` wide and `axis_inches` long a decision's label takes."""
    from matplotlib.textpath import TextPath

    points = TextPath((0, 0), text, size=LABEL_POINTS).get_extents().width + 14
    return points / (axis_inches * DPI) * span * 1.02


def describe(decision: dict[str, Any]) -> str:
    """A decision in a few words: what it did, to which revision or class, and why."""
    action, evidence = decision["action"], decision.get("evidence") or {}
    why = _signals(evidence.get("breaches") or [])
    because = f": {why}" if why else ""
    revision = evidence.get("revision", decision.get("revision"))
    rev = (
        f"rev {revision} " if revision is not None else "revision "
    )  # a status decision may not say
    if action == ActionKind.KILL_SWITCH_ENGAGED:
        return f"kill switch engaged{because}"
    if action == ActionKind.TRIAL_STARTED:
        return "trial"
    if action == ActionKind.TRIAL_FAILED:
        return "trial failed"
    if action == ActionKind.KILL_SWITCH_RELEASED:
        return "kill switch released"
    if action == ActionKind.ROLLED_BACK:
        return f"{rev}rolled back to {evidence.get('rollbackTo')}{because}"
    if action == ActionKind.REVISION_PROMOTED:
        return f"{rev}passed probation"
    if action == ActionKind.ROLLOUT_ABORTED:
        return f"{rev}canary aborted{because}"
    if action == ActionKind.ROLLOUT_STEP_PASSED:
        return f"{rev}canary step {evidence.get('step')}/{evidence.get('steps')} passed"
    if action == ActionKind.ROLLOUT_PROMOTED:
        return f"{rev}canary promoted"
    klass = evidence.get("class")
    if action == ActionKind.CLASS_SPECULATION_OFF:
        signals = ", ".join(SIGNALS.get(s, s) for s in evidence.get("signals") or [])
        return f"{klass} routed to the plain pool" + (f": {signals}" if signals else "")
    if action in CLASS_SWITCH_WORDS:
        return f"{klass} {CLASS_SWITCH_WORDS[action]}"
    if action in (ActionKind.CLASS_BREACH, ActionKind.CLASS_RECOVERED):
        signal = SIGNALS.get(evidence.get("signal", ""), evidence.get("signal", ""))
        state = "breach" if action == ActionKind.CLASS_BREACH else "recovered"
        return f"{klass} {state} ({signal})"
    return f"{action.replace('_', ' ')}{because}"


def _signals(breaches: list[Any]) -> str:
    """The breached signals, each named once, with the classes: `p95 TTFT, p95 TPOT (code,
    chat)`."""
    signals: dict[str, None] = {}
    classes: dict[str, None] = {}
    for breach in breaches:
        if isinstance(breach, dict):
            klass, signal = breach.get("class"), str(breach.get("signal", ""))
        else:
            klass, _, rest = str(breach).partition(": ")
            signal = rest.split(" ")[0]
        signals[SIGNALS.get(signal, signal)] = None
        if klass:
            classes[klass] = None
    named = ", ".join(signals)
    return f"{named} ({', '.join(classes)})" if classes else named


def label_rows(labels: list[Label], xlim: tuple[float, float]) -> dict[int, int]:
    """Label index -> row (from 0, top), the first row where it overlaps no label before it.
    A label that would run past the right edge is drawn to the left of its marker."""
    ends: list[float] = []
    rows = {}
    for index, label in enumerate(labels):
        left, right = _extent(label, xlim)
        row = next((r for r, end in enumerate(ends) if end < left), len(ends))
        if row == len(ends):
            ends.append(right)
        ends[row] = right
        rows[index] = row
    return {i: r + 1 for i, r in rows.items()}


def _extent(label: Label, xlim: tuple[float, float]) -> tuple[float, float]:
    if label.x + label.width > xlim[1]:
        return label.x - label.width, label.x
    return label.x, label.x + label.width


def draw_decision_lane(axis: Any, labels: list[Label], rows: dict[int, int]) -> None:
    count = max(rows.values(), default=0)
    xlim = axis.get_xlim()
    for index, label in enumerate(labels):
        row = rows[index]
        axis.plot([label.x, label.x], [row, count + 0.6], color=label.color, ls=label.style, lw=0.8)
        axis.plot([label.x], [row], marker="v", color=label.color, ms=5)
        right_aligned = label.x + label.width > xlim[1]
        axis.text(
            label.x + (-0.004 if right_aligned else 0.004) * (xlim[1] - xlim[0]),
            row,
            f" {label.text} " if not right_aligned else f"{label.text} ",
            ha="right" if right_aligned else "left",
            va="center",
            fontsize=LABEL_POINTS,
            color=label.color,
            style="italic" if label.color == "dimgray" else "normal",
            bbox={"facecolor": "white", "edgecolor": "none", "pad": 0.5},
            zorder=3,
        )
    axis.set_ylim(count + 0.6, 0.4)
    axis.set_yticks([])
    axis.set_ylabel("decisions", fontsize=8)
    for side in ("top", "right", "left"):
        axis.spines[side].set_visible(False)
    if not labels:
        axis.text(0.5, 0.5, "no decision", transform=axis.transAxes, ha="center", fontsize=8)


def _decision_lines(axis: Any, result: Result, scale: float) -> None:
    for decision in result.run.decisions:
        color, style = ACTION_STYLES.get(decision["action"], ("gray", "-"))
        axis.axvline(decision["t"] / scale, color=color, ls=style, lw=0.8, alpha=0.7)
    for change in result.world.changes[1:]:
        axis.axvline(change.t / scale, color="dimgray", lw=0.8, ls="--", alpha=0.7)


# -- what it saw ---------------------------------------------------------------------------------


def broken_line(axis: Any, times: list[float], values: list[float], **style: Any) -> None:
    """A line broken wherever there is no sample; a sample with none beside it is a dot (a
    line of one point would not show)."""
    axis.plot(times, values, **style)
    alone = [
        i
        for i, v in enumerate(values)
        if not math.isnan(v)
        and (i == 0 or math.isnan(values[i - 1]))
        and (i == len(values) - 1 or math.isnan(values[i + 1]))
    ]
    if alone:
        dot = {k: v for k, v in style.items() if k in ("color", "alpha")}
        axis.plot([times[i] for i in alone], [values[i] for i in alone], ".", ms=4, **dot)


def _width(index: int) -> float:
    """The first class's line the widest: where two classes read the same (plain decoding's
    TPOT), the one below still shows either side of the one above."""
    return max(2.2 - 0.6 * index, 0.8)


def _canary(axis: Any, times: list[float], values: list[float], color: str) -> None:
    axis.plot(times, values, "o", ms=3.5, mfc="white", mec=color, mew=1)


def _legend(axis: Any, result: Result, styles: list[tuple[str, dict[str, Any]]], **kw: Any) -> None:
    from matplotlib.lines import Line2D

    classes = [
        Line2D([], [], color=f"C{i}", lw=2, label=name)
        for i, name in enumerate(result.world.scenario.classes)
    ]
    extra = [Line2D([], [], color="dimgray", label=label, **style) for label, style in styles]
    axis.legend(
        handles=classes + extra,
        loc=kw.pop("loc", "upper left"),
        bbox_to_anchor=(1.0, 1.0),
        fontsize=7,
        frameon=False,
        **kw,
    )


FLEET = ("fleet", {"lw": 1.2})
CANARY = ("canary pods", {"ls": "", "marker": "o", "ms": 4, "mfc": "white"})
PLAIN = ("plain pool", {"ls": "", "marker": "s", "ms": 3})
TRUE = ("true", {"ls": "--", "lw": 1})
FLOOR = ("floor / SLO", {"ls": ":", "lw": 1.2})


def _acceptance(axis: Any, result: Result, view: Points) -> None:
    times = view.times
    floors = {
        c.name: c.slo.min_acceptance_rate
        for c in result.world.changes[0].specmodel.spec.classes
        if c.slo and c.slo.min_acceptance_rate is not None
    }
    for index, name in enumerate(result.world.scenario.classes):
        color = f"C{index}"
        broken_line(axis, times, view.seen("fleet", "rates", name), color=color, lw=_width(index))
        _canary(axis, times, view.seen("canary", "rates", name), color)
        truth = view.line([truth.rates.get(name) for truth in view.truths])
        axis.plot(times, truth, color=color, lw=1, ls="--", alpha=0.6)
        if name in floors:
            axis.axhline(floors[name], color=color, ls=":", lw=1.2)
            axis.annotate(
                f"{name} floor",
                (1.0, floors[name]),
                xycoords=("axes fraction", "data"),
                xytext=(-2, 2),
                textcoords="offset points",
                ha="right",
                fontsize=7,
                color=color,
            )
    axis.set_ylabel("acceptance rate\n(accepted / drafted)", fontsize=8)
    axis.set_ylim(0, 1)
    _legend(axis, result, [FLEET, CANARY, TRUE, FLOOR])


def _speedup(axis: Any, view: Points) -> None:
    ticks, truths, times = view.ticks, view.truths, view.times
    broken_line(axis, times, view.line([t.speedup for t in ticks]), color="k", lw=1.2)
    axis.plot(times, view.line([t.speedup for t in truths]), "k--", lw=1, alpha=0.6)
    axis.plot(times, view.line([t.tpot_speedup for t in truths]), color="tab:brown", lw=1, ls=":")
    axis.step(times, view.line([t.threshold for t in ticks]), "r", lw=1, where="post")
    from matplotlib.lines import Line2D

    handles = [
        Line2D([], [], color="k", lw=1.2, label="guard's estimate"),
        Line2D([], [], color="k", ls="--", lw=1, label="its model at\ntrue α and load"),
        Line2D([], [], color="tab:brown", ls=":", lw=1, label="true TPOT speedup"),
        Line2D([], [], color="r", lw=1, label="needed (minSpeedup,\n+ margin in a trial)"),
    ]
    axis.legend(
        handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7, frameon=False
    )
    axis.set_ylabel("speedup\n(plain TPOT / spec TPOT)", fontsize=8)
    axis.set_ylim(bottom=0)


def _tpot(axis: Any, result: Result, view: Points) -> None:
    times = view.times
    slos = {
        c.name: c.slo.max_p95_tpot_seconds
        for c in result.world.changes[0].specmodel.spec.classes
        if c.slo and c.slo.max_p95_tpot_seconds is not None
    }
    top = 0.0
    for index, name in enumerate(result.world.scenario.classes):
        color = f"C{index}"
        fleet = view.seen("fleet", "p95_tpot", name, 1000)
        canary = view.seen("canary", "p95_tpot", name, 1000)
        plain = view.seen("plain", "p95_tpot", name, 1000)
        broken_line(axis, times, fleet, color=color, lw=_width(index))
        _canary(axis, times, canary, color)
        axis.plot(times, plain, color=color, **PLAIN[1])
        top = max([top, *(v for v in fleet + canary + plain if not math.isnan(v))])
        if name in slos:
            axis.axhline(slos[name] * 1000, color=color, ls=":", lw=1.2)
            top = max(top, slos[name] * 1000)
    axis.set_ylabel("p95 TPOT (ms)", fontsize=8)
    axis.set_ylim(0, top * 1.1 or 1)
    pooled = [PLAIN] if any(t.plain for t in view.ticks) else []
    _legend(axis, result, [FLEET, CANARY, *pooled, ("p95 TPOT SLO", FLOOR[1])])


def _validity(axis: Any, result: Result, view: Points) -> None:
    times = view.times
    floors = {
        c.name: min(
            f
            for f in (c.slo.min_tool_call_validity, c.slo.min_structured_output_validity)
            if f is not None
        )
        for c in result.world.changes[0].specmodel.spec.classes
        if c.slo and (c.slo.min_tool_call_validity or c.slo.min_structured_output_validity)
    }
    bottom = 1.0
    for index, name in enumerate(result.world.scenario.classes):
        fleet = view.seen("fleet", "validity", name)
        canary = view.seen("canary", "validity", name)
        if all(math.isnan(v) for v in fleet + canary):
            continue
        color = f"C{index}"
        broken_line(axis, times, fleet, color=color, lw=_width(index))
        _canary(axis, times, canary, color)
        bottom = min([bottom, *(v for v in fleet + canary if not math.isnan(v))])
        if name in floors:
            axis.axhline(floors[name], color=color, ls=":", lw=1.2)
            bottom = min(bottom, floors[name])
    axis.set_ylabel("valid share of tool\ncalls / JSON answers", fontsize=8)
    axis.set_ylim(max(bottom - 0.02, 0), 1.005)
    _legend(axis, result, [FLEET, CANARY, FLOOR])


# -- what ran ------------------------------------------------------------------------------------


def _lanes(axis: Any, result: Result, scale: float) -> None:
    from matplotlib.patches import Patch

    width = result.base.slice_seconds / scale
    world = result.world

    def bar(start: int, end: int, lane: float, color: str, text: str, alpha: float = 1.0) -> None:
        span = (start * width, (end - start) * width)
        axis.broken_barh([span], (lane - 0.35, 0.7), color=color, alpha=alpha, lw=0)
        if text:
            axis.text(span[0] + span[1] / 2, lane, text, ha="center", va="center", fontsize=7)

    numbers = [world.revisions[s.config].number for s in result.run.serving]
    for start, end, number in _segments(numbers):
        bar(start, end, 2, _revision_color(number), f"rev {number}")
    canaries = [_canary_lane(result, i) for i in range(len(result.run.serving))]
    for start, end, (kind, number) in _segments(canaries):
        if kind == "trial":
            bar(start, end, 1, BANDS[KillSwitchState.TRIAL][0], "", 0.8)
        elif kind == "rollout":
            bar(start, end, 1, _revision_color(number), f"rev {number}")
    flags = [s.speculation for s in result.run.serving]
    for start, end, on in _segments(flags):
        bar(start, end, 0, "tab:green" if on else "lightgray", "on" if on else "off")
    lanes = ["speculation", "canary", "fleet revision"]
    if any(result.run.pools):
        lanes.insert(0, "plain pool")
        axis.set_ylim(-1.5, 2.5)
        wide = 0.05 * len(result.run.pools)  # shorter spans go unlabelled: no overlap
        for start, end, pool in _segments(result.run.pools):
            if pool is not None:
                routed = ", ".join(pool.routed) if pool.ready else "starting"
                text = f"{pool.pods} pods: {routed or 'none'}" if end - start >= wide else ""
                bar(start, end, -1, "lightsteelblue", text)
    else:
        axis.set_ylim(-0.5, 2.5)
    axis.set_yticks(range(3 - len(lanes), 3), lanes, fontsize=7)
    handles = [
        Patch(color=color, alpha=min(alpha * 4, 1), label=text)
        for color, alpha, text in BANDS.values()
    ]
    axis.legend(
        handles=handles,
        loc="upper left",
        bbox_to_anchor=(1.0, 1.1),
        fontsize=7,
        frameon=False,
        title="bands above",
        title_fontsize=7,
        alignment="left",
    )


def _canary_lane(result: Result, index: int) -> tuple[str, int]:
    """What served beside the fleet in slice `index`: a trial's canary, a canary rollout's
    pods (and their revision), or nothing."""
    rollout = result.run.rollout[index]
    if rollout is not None:
        return "rollout", result.world.revisions[rollout[0].config].number
    if result.run.canary[index] is not None:
        return "trial", result.world.revisions[result.run.serving[index].config].number
    return "", 0


def _revision_color(number: int) -> str:
    """Pale, and none the orange or blue of the canary bands."""
    return ["#c5b0d5", "#9edae5", "#dbdb8d", "#f7b6d2", "#c49c94", "#c7c7c7"][(number - 1) % 6]


def _bands(axis: Any, result: Result, scale: float) -> None:
    ticks = result.run.ticks
    duration = result.world.scenario.duration_s
    states = [tick.kill_switch for tick in ticks]
    for start, end, state in _segments(states):
        if state in BANDS:
            left = ticks[start].t / scale
            right = (ticks[end].t if end < len(ticks) else duration) / scale
            color, alpha, _ = BANDS[state]
            axis.axvspan(left, right, color=color, alpha=alpha, lw=0)
    width = result.base.slice_seconds / scale
    rolled = [r is not None for r in result.run.rollout]
    color, alpha, _ = BANDS["rollout"]
    for start, end, on in _segments(rolled):
        if on:
            axis.axvspan(start * width, end * width, color=color, alpha=alpha, lw=0)


def _segments(values: Sequence[Any]) -> Iterator[tuple[int, int, Any]]:
    """(start, end, value) runs of equal consecutive values."""
    start = 0
    for index in range(1, len(values) + 1):
        if index == len(values) or values[index] != values[start]:
            yield start, index, values[start]
            start = index
