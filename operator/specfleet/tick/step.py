"""One tick of one SpecModel, pure: what the controller does with what it has read.

    (spec, status, children seen, observation or none, engine configs, now)
        -> guard decision (on a guard tick) -> serving plan -> status, children, actions

`controller.reconcile` reads the cluster, runs `step` and applies what it returns;
`specfleet simulate` replays the same `step` over a simulated fleet, so the replay is the
production path. No I/O, the clock is an argument.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime

from specfleet.api import EngineConfig, SpecModel, SpecModelStatus
from specfleet.api.spec import SpeculativeSpec
from specfleet.api.status import RevisionRecord
from specfleet.guard import Action, Decision, Situation, decide
from specfleet.render import Manifest, RenderSettings, ServingPlan, render
from specfleet.render.plan import RolloutCanary
from specfleet.render.revision import controller_revision
from specfleet.telemetry.model import Observation
from specfleet.tick import children, guarding, rollouts
from specfleet.tick.next_tick import NextTick, next_tick
from specfleet.tick.observed import Observed
from specfleet.tick.plan import Plan, plan, replan
from specfleet.tick.pools import Pools, pools
from specfleet.tick.status import next_status

Configs = Mapping[str, EngineConfig]
"""Engine configs by revision hash: at least every revision the plan may serve (the spec's own
and the last good one)."""


@dataclass(frozen=True)
class GuardTick:
    """A guard evaluation is due; `observation` is None when telemetry had nothing at all."""

    observation: Observation | None


@dataclass(frozen=True)
class Step:
    plan: Plan
    status: SpecModelStatus
    """The status to write when every child applies."""
    actions: list[Action]
    situation: Situation | None
    """What the guard judged, on a guard tick."""
    decision: Decision | None
    specmodel: SpecModel
    configs: Configs = field(repr=False)
    observed: Observed = field(repr=False)
    guarded: SpecModelStatus = field(repr=False)
    """The previous status with the guard's decision folded in."""
    now: datetime = field(repr=False)

    @property
    def pools(self) -> Pools:
        """The plain pool and what serves each class, as the status written says."""
        guarded = self.guarded
        switches = guarded.guard.class_switches if guarded.guard else []
        return pools(self.specmodel, self.plan, self.observed.plain, guarded.classes, switches)

    @property
    def next_tick(self) -> NextTick:
        """What the next guard tick reads and when it is due, after this status (or the one
        `failed` writes: they plan, roll out and judge alike)."""
        return next_tick(self.specmodel, self.status)

    def revision(self) -> Manifest | None:
        """The ControllerRevision of a revision first seen now, kept for rollbacks."""
        if not self.plan.new_revision:
            return None
        return controller_revision(self.specmodel, self.plan.desired)

    def children(self, settings: RenderSettings) -> list[Manifest]:
        """The children that serve the plan, each carrying its applied hash. Raises ValueError
        when they cannot be rendered."""
        serving = ServingPlan(
            revision=self.plan.active.number,
            speculation=self.plan.speculation,
            canary=self.plan.canary,
            engine_config=self._config(self.plan.active),
            rollout=self._rollout_canary(),
            mirror=self.observed.mirror,
            plain=self.pools.plain,
        )
        return [children.with_applied_hash(m) for m in render(self.specmodel, serving, settings)]

    def failed(self, error: str) -> SpecModelStatus:
        """The status to write when rendering or applying the children failed."""
        observed = replace(self.observed, apply_error=error)
        return next_status(self.specmodel, self.plan, observed, self.guarded, self.now)

    def _config(self, revision: RevisionRecord) -> EngineConfig:
        config = self.configs.get(revision.hash)
        if config is None:
            raise ValueError(
                f"the engine config of revision {revision.number} "
                f"({revision.hash}) is unreadable; it is kept in its ControllerRevision"
            )
        return config

    def _rollout_canary(self) -> RolloutCanary | None:
        pods = self.plan.rollout_pods
        if not pods:
            return None
        desired = self.plan.desired
        return RolloutCanary(
            revision=desired.number, pods=pods, engine_config=self._config(desired)
        )


def step(
    specmodel: SpecModel,
    status: SpecModelStatus,
    observed: Observed,
    tick: GuardTick | None,
    configs: Configs,
    now: datetime,
    guard_on: bool = True,
) -> Step:
    """`guard_on`: a guard judges this SpecModel's windows (without one, no canary rollout)."""
    situation = decision = None
    the_plan = plan(specmodel, status, now, guard_on)
    overridden = rollouts.override_actions(the_plan.rollout, the_plan.overridden)
    guarded = guarding.recorded(status, overridden, now) if overridden else status
    if tick is not None:
        situation = guarding.situation(
            specmodel,
            guarded,
            the_plan,
            observed,
            tick.observation,
            now,
            _speculative(specmodel, the_plan, configs),
        )
        decision = decide(situation)
        guarded = guarding.apply_decision(guarded, the_plan, decision, now)
        the_plan = replan(specmodel, the_plan, guarded)
    return Step(
        plan=the_plan,
        status=next_status(specmodel, the_plan, observed, guarded, now),
        actions=overridden + (decision.actions if decision else []),
        situation=situation,
        decision=decision,
        specmodel=specmodel,
        configs=configs,
        observed=observed,
        guarded=guarded,
        now=now,
    )


def _speculative(specmodel: SpecModel, the_plan: Plan, configs: Configs) -> SpeculativeSpec | None:
    """The served revision's speculative config; the spec's when that revision's is unknown
    (judged with the spec's depth rather than not at all)."""
    config = configs.get(the_plan.active.hash)
    return config.speculative if config else specmodel.spec.speculative
