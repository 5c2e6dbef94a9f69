"""`specfleet simulate`: replay the guard in a closed loop against a simulated fleet."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click

from specfleet.refusal import refuse
from specfleet.simulate.inputs import load_world
from specfleet.simulate.simulation import Result, SimulationSettings, simulate
from specfleet.yamlio import InputError


@click.command("simulate")
@click.option(
    "--specmodel",
    "specmodel_path",
    type=click.Path(path_type=Path),
    required=True,
    help="The SpecModel YAML whose guard is replayed.",
)
@click.option(
    "--scenario",
    "scenario_path",
    type=click.Path(path_type=Path),
    required=True,
    help="Scenario YAML: traffic, per-class acceptance, rollouts and their effects.",
)
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Output directory.")
@click.option("--seed", type=int, default=None, help="Default: the scenario's seed.")
@click.option(
    "--tick",
    type=click.IntRange(min=1),
    default=None,
    help="Seconds between guard evaluations. Default: spec.guard.intervalSeconds.",
)
@click.option(
    "--rollout-seconds",
    type=click.FloatRange(min=0),
    default=60.0,
    show_default=True,
    help="How long a plan change takes to reach every pod.",
)
@click.option("--no-plot", is_flag=True, help="Skip timeline.png (no matplotlib needed).")
def simulate_command(
    specmodel_path: Path,
    scenario_path: Path,
    out: Path,
    seed: int | None,
    tick: int | None,
    rollout_seconds: float,
    no_plot: bool,
) -> None:
    """Replay the guard against a simulated fleet on a virtual clock; write
    OUT/decisions.json, OUT/summary.json and OUT/timeline.png."""
    from specfleet.simulate import report

    started = time.perf_counter()
    try:
        world = load_world(specmodel_path, scenario_path)
    except InputError as exc:
        refuse(exc.source, "cannot be simulated", exc.problems)
    settings = SimulationSettings(seed=seed, tick_seconds=tick, rollout_seconds=rollout_seconds)
    result = simulate(world, settings)
    report.write(result, out)
    click.echo(report.text(result))
    if not no_plot:
        _plot(result, out / "timeline.png")
    click.echo(f"wrote {out}/ in {time.perf_counter() - started:.1f}s wall time")


def _plot(result: Result, path: Path) -> None:
    try:
        from specfleet.simulate.plot import draw_timeline

        draw_timeline(result, path)
    except ImportError as exc:
        click.echo(
            f"error: timeline.png needs matplotlib ({exc}): pip install 'specfleet[simulate]'"
            " or pass --no-plot",
            err=True,
        )
        sys.exit(1)
