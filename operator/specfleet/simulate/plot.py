"""timeline.png: what the guard saw against the truth, what it did, and what the fleet served.

matplotlib is imported here, lazily: the operator image ships without it.
"""

from __future__ import annotations

import io
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specfleet.api.status import KillSwitchState
from specfleet.guard.actions import ActionKind
from specfleet.simulate.replay import Tick
from specfleet.simulate.simulation import Result
from specfleet.simulate.truth import Truth

ACTION_COLORS: dict[str, str] = {
    ActionKind.KILL_SWITCH_ENGAGED: "tab:red",
    ActionKind.TRIAL_STARTED: "tab:orange",
    ActionKind.TRIAL_FAILED: "darkred",
    ActionKind.KILL_SWITCH_RELEASED: "tab:green",
    ActionKind.ROLLED_BACK: "tab:purple",
    ActionKind.REVISION_PROMOTED: "tab:blue",
    ActionKind.CLASS_BREACH: "tab:pink",
    ActionKind.CLASS_RECOVERED: "tab:olive",
}
STATE_COLORS: dict[str, str] = {
    KillSwitchState.ENGAGED: "tab:red",
    KillSwitchState.TRIAL: "tab:orange",
}
MAX_POINTS = 720
"""Longer runs draw block means (see `Points`)."""


def draw_timeline(result: Result, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scale, unit = (3600.0, "h") if result.world.scenario.duration_s > 3 * 3600 else (60.0, "min")
    quality = any(v is not None for t in result.run.ticks for v in t.observed_validity.values())
    ratios = [3, 3, 2, 2, 1.4] if quality else [3, 3, 2, 1.4]
    figure, axes = plt.subplots(
        len(ratios),
        1,
        figsize=(11, 8.5 + 1.5 * quality),
        sharex=True,
        gridspec_kw={"height_ratios": ratios},
    )
    stride = max(1, len(result.run.ticks) // MAX_POINTS)
    view = Points(result.run.ticks, result.truths, scale, stride)
    _acceptance(axes[0], result, view)
    _speedup(axes[1], view)
    _tpot(axes[2], result, view)
    if quality:
        _validity(axes[3], result, view)
    _serving(axes[-1], result, scale)
    for axis in axes[:-1]:
        _kill_switch_bands(axis, result, scale)
        _action_markers(axis, result, scale)
    axes[-1].set_xlabel(f"scenario time ({unit})")
    axes[0].set_title(
        f"{result.world.changes[0].specmodel.metadata.name}: guard replay, seed {result.seed}"
    )
    figure.tight_layout()
    _save(figure, path)
    plt.close(figure)


def _save(figure: Any, path: Path) -> None:
    """A palette PNG: a line chart needs few colours, and the file is about half the size."""
    from PIL import Image

    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=72)
    image = Image.open(buffer).convert("RGB").quantize(colors=128)
    image.save(path, format="PNG", optimize=True)


@dataclass(frozen=True)
class Points:
    """The ticks and their truths, drawn one point per tick or, for a long run, one per block
    of `stride` ticks (the block's mean: bands and action markers stay exact)."""

    ticks: list[Tick]
    truths: list[Truth]
    scale: float
    stride: int = 1

    @property
    def times(self) -> list[float]:
        return [tick.t / self.scale for tick in self.ticks[:: self.stride]]

    def line(self, values: Sequence[float | None]) -> list[float]:
        out = []
        for start in range(0, len(values), self.stride):
            known = [v for v in values[start : start + self.stride] if v is not None]
            out.append(sum(known) / len(known) if known else float("nan"))
        return out


def _acceptance(axis: Any, result: Result, view: Points) -> None:
    times = view.times
    floors = {
        c.name: c.slo.min_acceptance_rate
        for c in result.world.changes[0].specmodel.spec.classes
        if c.slo and c.slo.min_acceptance_rate is not None
    }
    for index, name in enumerate(result.world.scenario.classes):
        color = f"C{index}"
        observed = [tick.observed_rates.get(name) for tick in view.ticks]
        axis.plot(times, view.line(observed), color=color, lw=1, label=f"{name} observed")
        truth = [truth.rates.get(name) for truth in view.truths]
        axis.plot(
            times, view.line(truth), color=color, lw=1, ls="--", alpha=0.7, label=f"{name} true"
        )
        if name in floors:
            axis.axhline(floors[name], color=color, ls=":", lw=1, label=f"{name} floor")
    axis.set_ylabel("acceptance rate\n(accepted / drafted)")
    axis.set_ylim(0, 1)
    axis.legend(loc="upper right", fontsize=7, ncol=3)


def _speedup(axis: Any, view: Points) -> None:
    ticks, truths, times = view.ticks, view.truths, view.times
    axis.plot(
        times, view.line([t.speedup for t in ticks]), color="k", lw=1, label="guard's speedup"
    )
    axis.plot(
        times, view.line([t.speedup for t in truths]), "k--", lw=1, label="model at true α and load"
    )
    axis.plot(
        times,
        view.line([t.tpot_speedup for t in truths]),
        color="tab:brown",
        lw=1,
        ls=":",
        label="true TPOT speedup (load)",
    )
    axis.step(
        times, view.line([t.threshold for t in ticks]), "r", lw=1, where="post", label="threshold"
    )
    axis.set_ylabel("speedup")
    axis.set_ylim(bottom=0)
    axis.legend(loc="upper right", fontsize=7, ncol=2)


def _tpot(axis: Any, result: Result, view: Points) -> None:
    times = view.times
    for index, name in enumerate(result.world.scenario.classes):
        tpot = [tick.observed_tpot.get(name) for tick in view.ticks]
        ms = [v * 1000 if v is not None else None for v in tpot]
        axis.plot(times, view.line(ms), color=f"C{index}", lw=1, label=f"{name} mean TPOT")
    axis.set_ylabel("TPOT (ms)")
    axis.set_ylim(bottom=0)
    axis.legend(loc="upper right", fontsize=7)


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
    for index, name in enumerate(result.world.scenario.classes):
        values = [tick.observed_validity.get(name) for tick in view.ticks]
        if all(v is None for v in values):
            continue
        axis.plot(times, view.line(values), color=f"C{index}", lw=1, label=f"{name} valid share")
        if name in floors:
            axis.axhline(floors[name], color=f"C{index}", ls=":", lw=1, label=f"{name} floor")
    axis.set_ylabel("tool-call / JSON\nvalidity")
    axis.legend(loc="lower right", fontsize=7, ncol=2)


def _serving(axis: Any, result: Result, scale: float) -> None:
    width = result.base.slice_seconds / scale
    numbers = [result.world.revisions[s.config].number for s in result.run.serving]
    for start, end, number in _segments(numbers):
        span = (start * width, (end - start) * width)
        axis.broken_barh([span], (0.5, 0.4), color=f"C{(number + 3) % 10}")
        axis.text(span[0] + span[1] / 2, 0.7, f"rev {number}", ha="center", va="center", fontsize=7)
    flags = [s.speculation for s in result.run.serving]
    for start, end, on in _segments(flags):
        span = (start * width, (end - start) * width)
        axis.broken_barh([span], (0.0, 0.4), color="tab:green" if on else "lightgray")
    canary = [served is not None for served in result.run.canary]
    for start, end, on in _segments(canary):
        if on:
            span = (start * width, (end - start) * width)
            axis.broken_barh([span], (-0.5, 0.4), color=STATE_COLORS[KillSwitchState.TRIAL])
    axis.set_yticks([-0.3, 0.2, 0.7], ["canary", "speculation", "revision"], fontsize=7)
    axis.set_ylim(-0.5, 1)
    _action_legend(axis, result)


def _action_legend(axis: Any, result: Result) -> None:
    from matplotlib.lines import Line2D

    seen = dict.fromkeys(d["action"] for d in result.run.decisions)
    handles = [Line2D([], [], color=ACTION_COLORS.get(a, "gray"), label=a) for a in seen]
    if result.world.scenario.rollouts:
        handles.append(Line2D([], [], color="gray", ls="--", label="spec rollout"))
    if handles:
        axis.legend(
            handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.55), ncol=4, fontsize=7
        )


def _kill_switch_bands(axis: Any, result: Result, scale: float) -> None:
    ticks = result.run.ticks
    states = [tick.kill_switch for tick in ticks]
    for start, end, state in _segments(states):
        if state in STATE_COLORS:
            left = ticks[start].t / scale
            right = (ticks[end].t if end < len(ticks) else result.world.scenario.duration_s) / scale
            axis.axvspan(left, right, color=STATE_COLORS[state], alpha=0.1, lw=0)


def _action_markers(axis: Any, result: Result, scale: float) -> None:
    for decision in result.run.decisions:
        color = ACTION_COLORS.get(decision["action"], "gray")
        axis.axvline(decision["t"] / scale, color=color, lw=1, alpha=0.8)
    for rollout in result.world.scenario.rollouts:
        axis.axvline(rollout.t / scale, color="gray", lw=1, ls="--")


def _segments(values: Sequence[Any]) -> Iterator[tuple[int, int, Any]]:
    """(start, end, value) runs of equal consecutive values."""
    start = 0
    for index in range(1, len(values) + 1):
        if index == len(values) or values[index] != values[start]:
            yield start, index, values[start]
            start = index
