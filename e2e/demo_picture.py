"""out/demo/timeline.png: the demo's story in one picture, read from the cluster's Prometheus
and the SpecModels' status.

Per SpecModel, the real engine's first: its decisions as labelled markers (staggered so none
overlaps), then its per-class acceptance against each class's floor. For the simulated fleet
also p95 TPOT per class against its SLO and tool-call validity per revision, where the AWQ
canary's broken tool calls show, and its engine pods: the fleet's and the plain pool's. A line
never crosses a stretch without samples; shaded bands: the kill switch engaged (red), a trial's
canary (orange), a class routed to the plain pool (purple) and its class trial (pink), a
rollout's canary (blue). The x axis is the story's own time: seconds since its SpecModels were
applied.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from specfleet.guard.actions import ActionKind
from specfleet.simulate import plot

STEP_S = 5.0
"""The query_range step: two steps without a sample is a gap."""
WIDTH_INCHES = 12.0
LEFT, RIGHT = 0.07, 0.86


@dataclass(frozen=True)
class Band:
    """What a decision starts: shaded until one of `ends` (of the same class, if it names one)."""

    color: str
    alpha: float
    ends: frozenset[str]
    name: str
    """The legend's words; `{klass}`: the decision's class."""


BANDS = {
    ActionKind.KILL_SWITCH_ENGAGED: Band(
        "tab:red", 0.1, frozenset({ActionKind.KILL_SWITCH_RELEASED}), "kill switch engaged"
    ),
    ActionKind.TRIAL_STARTED: Band(
        "tab:orange",
        0.2,
        frozenset({ActionKind.TRIAL_FAILED, ActionKind.KILL_SWITCH_RELEASED}),
        "trial canary",
    ),
    ActionKind.CLASS_SPECULATION_OFF: Band(
        "tab:purple", 0.12, frozenset({ActionKind.CLASS_SPECULATION_ON}), "{klass} on plain pool"
    ),
    ActionKind.CLASS_TRIAL_STARTED: Band(
        "tab:pink",
        0.3,
        frozenset({ActionKind.CLASS_SPECULATION_ON, ActionKind.CLASS_TRIAL_FAILED}),
        "{klass} class trial",
    ),
}
ROLLOUT = Band(
    "tab:blue",
    0.12,
    frozenset({ActionKind.ROLLOUT_ABORTED, ActionKind.ROLLOUT_PROMOTED}),
    "rollout canary",
)
COLORS = {"code": "tab:blue", "tools": "tab:orange", "json": "tab:purple", "chat": "tab:green"}
POOLS = {"fleet": "dimgray", "plain pool": "tab:purple"}

Points = list[tuple[float, float]]
"""(seconds since the story began, value)."""


@dataclass(frozen=True)
class Story:
    """One SpecModel's part: what it saw and what its guard did."""

    title: str
    decisions: list[dict[str, Any]]
    """Its status decisions, each with `t`: seconds since the story began."""
    acceptance: dict[str, Points]
    floors: dict[str, float]
    changes: list[GitChange] = field(default_factory=list)
    tpot: dict[str, Points] = field(default_factory=dict)
    tpot_slos: dict[str, float] = field(default_factory=dict)
    validity: dict[str, Points] = field(default_factory=dict)
    """Tool-call validity per revision."""
    validity_floor: float | None = None
    pods: dict[str, Points] = field(default_factory=dict)
    """Engine pods up, the fleet's (with its canaries) and the plain pool's."""


class GitChange(NamedTuple):
    t: float
    text: str
    rollout: bool
    """A new revision: its canary starts (shaded until it ends)."""


class Span(NamedTuple):
    start: float
    stop: float
    color: str
    alpha: float
    name: str


def draw(stories: list[Story], end: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xlim = (-0.01 * end, 1.01 * end)
    panels = list(_panels(stories, xlim))
    heights = [panel.height for panel in panels]
    total = sum(heights) * 1.3 + 1.0
    figure, axes = plt.subplots(
        len(panels),
        1,
        figsize=(WIDTH_INCHES, total),
        sharex=True,
        gridspec_kw={"height_ratios": heights, "hspace": 0.3},
    )
    figure.subplots_adjust(left=LEFT, right=RIGHT, top=1 - 0.3 / total, bottom=0.6 / total)
    for axis, panel in zip(axes, panels, strict=True):
        axis.set_xlim(*xlim)
        panel.paint(axis)
        axis.set_xlim(*xlim)
        if not panel.lane:
            _bands(axis, panel.story, end)
            _decision_lines(axis, panel.story)
            axis.grid(axis="y", lw=0.3, alpha=0.5)
    axes[-1].set_xlabel("seconds since the SpecModels were applied")
    figure.savefig(path, dpi=80)
    plt.close(figure)


@dataclass(frozen=True)
class Panel:
    height: float
    story: Story
    paint: Callable[[Any], None]
    lane: bool = False
    """The decisions' lane: no bands or lines across it."""


def _panels(stories: list[Story], xlim: tuple[float, float]) -> Iterator[Panel]:
    for story in stories:
        labels = _labels(story, xlim)
        rows = plot.label_rows(labels, xlim)

        def lane(axis: Any, story: Story = story, labels: Any = labels, rows: Any = rows) -> None:
            plot.draw_decision_lane(axis, labels, rows)
            axis.set_title(story.title, fontsize=10, loc="left", fontweight="bold")

        yield Panel(0.5 + plot.ROW_INCHES * max(rows.values(), default=0), story, lane, lane=True)
        yield Panel(1.9, story, lambda axis, story=story: _acceptance(axis, story))
        if story.tpot:
            yield Panel(1.5, story, lambda axis, story=story: _tpot(axis, story))
        if story.validity:
            yield Panel(1.4, story, lambda axis, story=story: _validity(axis, story))
        if story.pods:
            yield Panel(1.1, story, lambda axis, story=story: _pods(axis, story))


def _labels(story: Story, xlim: tuple[float, float]) -> list[plot.Label]:
    span = xlim[1] - xlim[0]
    axis_inches = WIDTH_INCHES * (RIGHT - LEFT)
    found = []
    for t, text, _ in story.changes:
        width = plot.label_width(f"Git: {text}", span, axis_inches)
        found.append(plot.Label(t, f"Git: {text}", "dimgray", "--", width))
    for decision in story.decisions:
        color, style = plot.ACTION_STYLES.get(decision["action"], ("gray", "-"))
        text = plot.describe(decision)
        width = plot.label_width(text, span, axis_inches)
        found.append(plot.Label(decision["t"], text, color, style, width))
    return sorted(found, key=lambda label: label.x)


def _acceptance(axis: Any, story: Story) -> None:
    for name, points in story.acceptance.items():
        _line(axis, points, color=COLORS.get(name), label=name, lw=1.6)
        if name in story.floors:
            axis.axhline(story.floors[name], color=COLORS.get(name), ls=":", lw=1.2)
    if story.floors:
        axis.plot([], [], color="gray", ls=":", label="floor (SLO)")
    for name, color in dict.fromkeys((span.name, span.color) for span in spans(story, math.inf)):
        axis.fill_between([], [], color=color, alpha=0.3, lw=0, label=name)
    axis.set_ylim(0, 1.05)
    axis.set_ylabel("acceptance rate\n(accepted / drafted)", fontsize=8)
    _legend(axis, "no drafted tokens yet")


def _tpot(axis: Any, story: Story) -> None:
    for name, points in story.tpot.items():
        _line(axis, [(t, v * 1000) for t, v in points], color=COLORS.get(name), label=name, lw=1.2)
        if name in story.tpot_slos:
            axis.axhline(story.tpot_slos[name] * 1000, color=COLORS.get(name), ls=":", lw=1.2)
    if story.tpot_slos:
        axis.plot([], [], color="gray", ls=":", label="p95 TPOT SLO")
    axis.set_ylim(bottom=0)
    axis.set_ylabel("p95 TPOT (ms)", fontsize=8)
    _legend(axis, "no streams")


def _validity(axis: Any, story: Story) -> None:
    for index, (revision, points) in enumerate(sorted(story.validity.items())):
        style = {"lw": 1.6} if index == 0 else {"ls": "", "marker": "o", "ms": 4, "mfc": "white"}
        _line(axis, points, color=f"C{index + 4}", label=f"revision {revision}", **style)
    if story.validity_floor is not None:
        axis.axhline(story.validity_floor, color="gray", ls=":", lw=1.2, label="tools floor (SLO)")
    lowest = min((v for p in story.validity.values() for _, v in p), default=0.9)
    axis.set_ylim(min(lowest, story.validity_floor or 1) - 0.03, 1.02)
    axis.set_ylabel("valid share of\ntool calls", fontsize=8)
    _legend(axis, "no tool calls")


def _pods(axis: Any, story: Story) -> None:
    for pool, points in story.pods.items():
        if any(count for _, count in points):  # a plain pool that never ran is left out
            _line(axis, points, color=POOLS[pool], label=pool, lw=1.6, drawstyle="steps-post")
    axis.set_ylim(0, max((v for p in story.pods.values() for _, v in p), default=1) + 1)
    axis.yaxis.get_major_locator().set_params(integer=True)
    axis.set_ylabel("engine pods\nup", fontsize=8)
    _legend(axis, "no engine pods")


def _line(axis: Any, points: Points, **style: Any) -> None:
    """A series without a sample (a class nothing drafted for) draws nothing, not even in the
    legend."""
    if points:
        plot.broken_line(axis, *_broken(points), **style)


def _broken(points: Points) -> tuple[list[float], list[float]]:
    """The points with a NaN wherever two samples are more than two steps apart, so the line
    breaks there instead of crossing time without data."""
    times: list[float] = []
    values: list[float] = []
    for t, v in sorted(points):
        if times and t - times[-1] > 2 * STEP_S:
            times.append((t + times[-1]) / 2)
            values.append(math.nan)
        times.append(t)
        values.append(v)
    return times, values


def _legend(axis: Any, empty: str) -> None:
    if axis.get_legend_handles_labels()[0]:
        axis.legend(loc="upper left", bbox_to_anchor=(1.005, 1), fontsize=7, frameon=False)
    else:
        axis.text(0.5, 0.5, empty, transform=axis.transAxes, ha="center", fontsize=8)


def _bands(axis: Any, story: Story, end: float) -> None:
    for span in spans(story, end):
        axis.axvspan(span.start, span.stop, color=span.color, alpha=span.alpha, lw=0)


def spans(story: Story, end: float) -> list[Span]:
    """Each kill switch, trial canary, class on the plain pool, class trial and rollout canary,
    until the decision that ended it (or `end`)."""
    found = []
    ordered = sorted(story.decisions, key=lambda d: d["t"])
    for index, decision in enumerate(ordered):
        band = BANDS.get(decision["action"])
        if band is not None:
            klass = _klass(decision)
            later = ordered[index + 1 :]
            ending = (d["t"] for d in later if d["action"] in band.ends and _klass(d) == klass)
            name = band.name.format(klass=klass)
            found.append(Span(decision["t"], next(ending, end), band.color, band.alpha, name))
    for start in (change.t for change in story.changes if change.rollout):
        later = (d["t"] for d in ordered if d["t"] >= start and d["action"] in ROLLOUT.ends)
        found.append(Span(start, next(later, end), ROLLOUT.color, ROLLOUT.alpha, ROLLOUT.name))
    return found


def _klass(decision: dict[str, Any]) -> str | None:
    """The class a class switch's decision is about (None for the fleet's)."""
    klass: str | None = (decision.get("evidence") or {}).get("class")
    return klass


def _decision_lines(axis: Any, story: Story) -> None:
    for decision in story.decisions:
        color, style = plot.ACTION_STYLES.get(decision["action"], ("gray", "-"))
        axis.axvline(decision["t"], color=color, ls=style, lw=0.8, alpha=0.7)
    for change in story.changes:
        axis.axvline(change.t, color="dimgray", ls="--", lw=0.8, alpha=0.7)
