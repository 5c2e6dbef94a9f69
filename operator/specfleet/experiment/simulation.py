"""The four arms offline: each arm's measurement of the same simulated traffic, with the replay's
physics and outcome code (`simulate.physics`, `simulate.outcome`) and its common random numbers
(`simulate.draws`): every arm serves the very same drawn requests.

The arms are overlays of the SpecModel's spec (`experiment.arms`), refused as the live operator
refuses them (`arms.arm_errors`). A scenario's `arms` section says what each does beyond the
physics (a quantized arm's broken tool calls, faster steps, lower acceptance; greedy answers
that no longer match the baseline's), as a rollout's `effects` do in `specfleet simulate`:

```yaml
arms:
  quantized: {tpot_factor: 0.6, tool_call_validity: 0.80, greedy_agreement: 0.9}
  speculative: {}
  both: {tpot_factor: 0.6, tool_call_validity: 0.80, acceptance_factor: 0.9}
gpu_hour_price: 4.0
greedy_share: 0.2
```
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from specfleet.api.spec import ClassSlo
from specfleet.api.verdict import ArmName, ExperimentVerdict, Latency
from specfleet.experiment.arms import (
    arm_document,
    arm_errors,
    class_slos,
    default_arms,
    gpus_per_replica,
)
from specfleet.experiment.basis import ArmThroughput, Basis, Source
from specfleet.experiment.verdict import ArmMeasurement, ClassMeasurement, judge, latency_misses
from specfleet.scenario import Effects, Scenario, ScenarioError, Schedule, load_scenario_as
from specfleet.simulate import physics
from specfleet.simulate.draws import ClassDraw, binomial, draw_slices
from specfleet.simulate.inputs import build_world, load_specmodel_document, parse_document
from specfleet.simulate.outcome import ClassSlice, realize, tpot_quantile_seconds, window
from specfleet.simulate.world import ClassConditions, Conditions, Setting, World
from specfleet.telemetry.model import GreedyComparison
from specfleet.yamlio import InputError

SLICE_SECONDS = 10.0
QUANTILES = {"p50_seconds": 0.0, "p95_seconds": physics.Z95, "p99_seconds": 2.326}
"""Standard normal quantiles of the percentiles measured."""
TTFT_WAITING_STEPS = {"p50_seconds": 1.0, "p95_seconds": 2.0, "p99_seconds": 3.0}
"""Running steps a new request waits out before its prefill: two at the p95 as in the replay;
one at the median and three at the p99 are rough (no queueing model)."""
MAX_RPS_PER_REPLICA = 2.0**20
BISECTIONS = 40


class ArmEffects(Effects):
    greedy_agreement: float = Field(
        default=1.0, ge=0.0, le=1.0, description="P(a greedy answer matches the baseline's)"
    )

    def physics(self) -> Effects:
        """What the simulated fleet applies; agreement is the experiment's alone."""
        return Effects.model_validate(
            self.model_dump(exclude={"greedy_agreement"}, exclude_unset=True)
        )


class Arms(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    quantized: ArmEffects = Field(default_factory=ArmEffects)
    speculative: ArmEffects = Field(default_factory=ArmEffects)
    both: ArmEffects = Field(default_factory=ArmEffects)


class ExperimentScenario(Scenario):
    """A scenario's traffic and classes, and what each arm does to them."""

    arms: Arms
    gpu_hour_price: float = Field(default=4.0, gt=0.0)
    currency: str | None = Field(
        default=None, min_length=1, description="the price's currency, e.g. USD; the report's"
    )
    greedy_share: float = Field(
        default=0.2, ge=0.0, le=1.0, description="requests decoded greedily (temperature 0)"
    )

    @field_validator("rollouts")
    @classmethod
    def _no_rollouts(cls, v: tuple[Any, ...]) -> tuple[Any, ...]:
        if v:
            raise ValueError("an experiment serves one traffic sample: declare effects in arms")
        return v

    def effects(self, arm: ArmName) -> ArmEffects:
        return ArmEffects() if arm == ArmName.BASELINE else getattr(self.arms, arm)


@dataclass(frozen=True)
class Experiment:
    specmodel: dict[str, Any]
    scenario: ExperimentScenario
    worlds: dict[ArmName, World]
    scenario_path: str = ""


def load_experiment(
    specmodel_path: Path, scenario_path: Path, unquantized_source: str | None = None
) -> Experiment:
    """The four default arms, each refused as the live operator would refuse it."""
    document = load_specmodel_document(specmodel_path)
    try:
        scenario = load_scenario_as(scenario_path, ExperimentScenario)
    except ScenarioError as exc:
        raise InputError(str(scenario_path), [str(exc)]) from None
    specmodel = parse_document(document, str(specmodel_path))
    arms = default_arms(unquantized_source)
    refused = [str(e) for arm in arms for e in arm_errors(specmodel, arm)]
    if refused:
        raise InputError(str(specmodel_path), refused)
    worlds = {
        arm.name: _arm_world(
            build_world(
                arm_document(document, arm), scenario, str(specmodel_path), str(scenario_path)
            ),
            scenario.effects(arm.name).physics(),
        )
        for arm in arms
    }
    return Experiment(document, scenario, worlds, str(scenario_path))


def _arm_world(world: World, effects: Effects) -> World:
    [revision] = world.revisions.values()
    return replace(world, revisions={revision.config: replace(revision, effects=effects)})


def run(experiment: Experiment, seed: int | None = None) -> ExperimentVerdict:
    scenario = experiment.scenario
    seed = scenario.seed if seed is None else seed
    count = max(round(scenario.duration_s / SLICE_SECONDS), 1)
    draws = draw_slices(scenario, seed, SLICE_SECONDS, count)
    greedy = _greedy_draws(scenario, seed, count)
    specmodel = experiment.worlds[ArmName.BASELINE].changes[0].specmodel
    slos = {c: slo for c, slo in class_slos(specmodel).items() if c in scenario.classes}
    arms = [measure(arm, experiment.worlds[arm], scenario, slos, draws, greedy) for arm in ArmName]
    return judge(arms, slos, scenario.gpu_hour_price, specmodel.spec.guard.min_requests)


def basis(experiment: Experiment) -> Basis:
    """What the simulated verdict stands on: every arm's throughput is the model's."""
    specmodel = experiment.worlds[ArmName.BASELINE].changes[0].specmodel
    classes = experiment.scenario.classes
    name = Path(experiment.scenario_path).name or "the scenario"
    return Basis(
        throughput={arm: ArmThroughput(source=Source.MODEL) for arm in ArmName},
        price_source=f"{name}, gpu_hour_price"
        if "gpu_hour_price" in experiment.scenario.model_fields_set
        else f"the simulator's default ({name} sets no gpu_hour_price)",
        currency=experiment.scenario.currency,
        slos={c: slo for c, slo in class_slos(specmodel).items() if c in classes},
    )


def _greedy_draws(
    scenario: ExperimentScenario, seed: int, count: int
) -> list[dict[str, tuple[float, float]]]:
    """Uniforms for the greedy requests compared and those that disagreed, a stream of their
    own so the replay's draws stay as they are."""
    rng = random.Random(f"greedy-{seed}")
    return [{name: (rng.random(), rng.random()) for name in scenario.classes} for _ in range(count)]


def measure(
    arm: ArmName,
    world: World,
    scenario: ExperimentScenario,
    slos: dict[str, ClassSlo],
    draws: list[dict[str, ClassDraw]],
    greedy: list[dict[str, tuple[float, float]]],
) -> ArmMeasurement:
    [revision] = world.revisions.values()
    setting = Setting(revision.config, speculation=revision.k > 0)
    agreement = scenario.effects(arm).greedy_agreement
    totals = {name: _Tally() for name in scenario.classes}
    for i, slice_draws in enumerate(draws):
        t = i * SLICE_SECONDS
        conditions = world.conditions(t, setting)
        ttft_factor = world.effects(t, revision.config).ttft_factor
        for klass in conditions.classes:
            outcome = realize(conditions, klass, slice_draws[klass.name])
            compared_u, disagreed_u = greedy[i][klass.name]
            compared = binomial(outcome.choices, scenario.greedy_share, compared_u)
            agreed = compared - binomial(compared, 1.0 - agreement, disagreed_u)
            totals[klass.name].add(
                outcome,
                _latencies(world, conditions, klass, ttft_factor),
                (agreed, compared) if arm != ArmName.BASELINE else (0, 0),
            )
    specmodel = world.changes[0].specmodel
    return ArmMeasurement(
        arm=arm,
        gpus_per_replica=gpus_per_replica(specmodel),
        throughput_at_slo=throughput_at_slo(world, setting, slos),
        classes={name: tally.measurement() for name, tally in totals.items()},
    )


def _latencies(
    world: World, conditions: Conditions, klass: ClassConditions, ttft_factor: float
) -> dict[str, tuple[float, float]]:
    """(TTFT, TPOT) per percentile of one class in one slice."""
    prompt = world.scenario.classes[klass.name].prompt_tokens
    return {
        name: (
            physics.ttft_seconds(
                world.timing, prompt, conditions.step_seconds, ttft_factor, TTFT_WAITING_STEPS[name]
            ),
            tpot_quantile_seconds(conditions, klass, klass.alpha, z),
        )
        for name, z in QUANTILES.items()
    }


@dataclass
class _Tally:
    """A class's slices summed; percentiles weighted by each slice's requests."""

    total: ClassSlice = field(default_factory=ClassSlice)
    weighted: dict[str, list[float]] | None = None
    greedy: tuple[int, int] = (0, 0)

    def add(
        self,
        outcome: ClassSlice,
        latencies: dict[str, tuple[float, float]],
        greedy: tuple[int, int],
    ) -> None:
        self.total += outcome
        weighted = self.weighted or {name: [0.0, 0.0] for name in latencies}
        for name, (ttft, tpot) in latencies.items():
            weighted[name][0] += ttft * outcome.requests
            weighted[name][1] += tpot * outcome.requests
        self.weighted = weighted
        self.greedy = (self.greedy[0] + greedy[0], self.greedy[1] + greedy[1])

    def measurement(self) -> ClassMeasurement:
        requests = max(self.total.requests, 1)
        weighted = self.weighted or {}

        def latency(which: int) -> Latency:
            return Latency(**{name: values[which] / requests for name, values in weighted.items()})

        ttft, tpot = latency(0), latency(1)
        counted = window([self.total], speculation=True, tool_calls=True)
        counted = replace(
            counted, p95_ttft_seconds=ttft.p95_seconds, p95_tpot_seconds=tpot.p95_seconds
        )
        compared, agreed = self.greedy[1], self.greedy[0]
        return ClassMeasurement(counted, ttft, tpot, GreedyComparison(compared, agreed))


def throughput_at_slo(world: World, setting: Setting, slos: dict[str, ClassSlo]) -> float:
    """Requests/s per replica of the scenario's class mix (at its start) at the highest load
    at which every class's p95 TTFT and TPOT stay inside their SLOs, short of the max batch."""
    replicas = max(world.changes[0].specmodel.spec.pod.replicas, 1)

    def inside(rps_per_replica: float) -> bool:
        traffic = Schedule(points=((0.0, rps_per_replica * replicas),))
        scenario = world.scenario.model_copy(update={"traffic_rps": traffic})
        conditions = replace(world, scenario=scenario, _cache={}).conditions(0.0, setting)
        if conditions.batch >= world.revisions[setting.config].max_batch:
            return False
        return all(_inside(conditions, klass, slos[klass.name]) for klass in conditions.classes)

    low, high = 0.0, 1.0
    while inside(high):
        low, high = high, high * 2
        if high > MAX_RPS_PER_REPLICA:
            return low
    for _ in range(BISECTIONS):
        middle = (low + high) / 2
        low, high = (middle, high) if inside(middle) else (low, middle)
    return low


def _inside(conditions: Conditions, klass: ClassConditions, slo: ClassSlo) -> bool:
    tpot = tpot_quantile_seconds(conditions, klass, klass.alpha, physics.Z95)
    return not latency_misses(klass.p95_ttft_seconds, tpot, slo)
