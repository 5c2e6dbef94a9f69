"""`simulate(world, settings) -> Result`: the guarded replay, the baselines on the same draws,
and the guard's decisions judged against the truth."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from specfleet.api.spec import GuardSpec
from specfleet.guard.actions import ActionKind
from specfleet.simulate import analysis, baselines
from specfleet.simulate.draws import draw_slices
from specfleet.simulate.outcome import ALPHA_SPREAD
from specfleet.simulate.replay import (
    Clock,
    Goodput,
    GuardedRun,
    Timebase,
    replay_fixed,
    replay_guarded,
)
from specfleet.simulate.truth import Truth
from specfleet.simulate.world import World


@dataclass(frozen=True)
class SimulationSettings:
    seed: int | None = None
    """Default: the scenario's seed."""
    tick_seconds: int | None = None
    """Guard evaluation interval. Default: the SpecModel's spec.guard.intervalSeconds."""
    rollout_seconds: float = 60.0
    """How long a plan change (kill switch, rollback, new revision) takes to reach every pod."""
    alpha_spread: float = ALPHA_SPREAD
    clock: Clock = field(default_factory=Clock)


@dataclass(frozen=True)
class Result:
    world: World
    settings: SimulationSettings
    seed: int
    base: Timebase
    guard: GuardSpec
    run: GuardedRun
    goodput: dict[str, Goodput]
    episodes: list[analysis.Episode]
    false_actions: list[dict[str, Any]]
    missed: list[dict[str, Any]]
    truths: list[Truth]
    """The truth at each tick (what the fleet served in the slice before it)."""

    @property
    def acting(self) -> list[dict[str, Any]]:
        return [d for d in self.run.decisions if d["action"] in ACTING]


ACTING = (
    ActionKind.KILL_SWITCH_ENGAGED,
    ActionKind.KILL_SWITCH_RELEASED,
    ActionKind.TRIAL_STARTED,
    ActionKind.TRIAL_FAILED,
    ActionKind.ROLLED_BACK,
    ActionKind.ROLLOUT_STEP_PASSED,
    ActionKind.ROLLOUT_PROMOTED,
    ActionKind.ROLLOUT_ABORTED,
    ActionKind.QUALITY_BREACH,
    ActionKind.ALERT,
    ActionKind.FLAPPING,
    ActionKind.METRICS_BLIND,
)


def simulate(world: World, settings: SimulationSettings | None = None) -> Result:
    settings = settings or SimulationSettings()
    guard = world.changes[0].specmodel.spec.guard
    tick = settings.tick_seconds or guard.interval_seconds
    guard = guard.model_copy(update={"interval_seconds": tick})
    base = Timebase.of(
        world.scenario.duration_s, tick, guard.window_seconds, settings.rollout_seconds
    )
    seed = world.scenario.seed if settings.seed is None else settings.seed
    draws = draw_slices(world.scenario, seed, base.slice_seconds, base.count)
    spread = settings.alpha_spread
    run = replay_guarded(world, draws, base, settings.clock, spread)
    rollout, pools = settings.rollout_seconds, run.pools
    on, off = baselines.always(world, True), baselines.always(world, False)
    oracle = baselines.oracle(world)
    goodput = {
        "guarded": run.goodput,
        "always_on": replay_fixed(world, draws, base, on, spread, rollout, pools),
        "always_off": replay_fixed(world, draws, base, off, spread, rollout, pools),
        "oracle": replay_fixed(world, draws, base, oracle, spread, None, pools),
        "oracle_rollout": replay_fixed(world, draws, base, oracle, spread, rollout, pools),
    }
    table = analysis.TruthTable(world, run, base)
    found = analysis.episodes(table, guard)
    return Result(
        world=world,
        settings=settings,
        seed=seed,
        base=base,
        guard=guard,
        run=run,
        goodput=goodput,
        episodes=found,
        false_actions=analysis.false_actions(table, guard),
        missed=analysis.missed(table, found),
        truths=[table.at_slice(base.index(tick.t) - 1) for tick in run.ticks],
    )
