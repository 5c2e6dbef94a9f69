"""The operator's half of the loop: the production tick (`tick.step`) over the Deployments as
the controller's watch would see them (`tick.observed`, from the simulated fleet). So the guard
judges a window only when the operator would: rollout complete and Ready for a whole window.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime

from specfleet.api import EngineConfig, SpecModel, SpecModelStatus
from specfleet.api.status import ReplicaStatus
from specfleet.render import revision_hash
from specfleet.simulate.fleet import Fleet
from specfleet.simulate.world import Setting
from specfleet.telemetry.model import Observation
from specfleet.tick.observed import Observed, Rollout
from specfleet.tick.plan import Plan, plan
from specfleet.tick.pools import Pools
from specfleet.tick.step import GuardTick, Step, step


@dataclass(frozen=True)
class Operator:
    specmodel: SpecModel
    status: SpecModelStatus
    plan: Plan
    """The last step's serving plan."""
    configs: dict[str, EngineConfig]
    """Every engine config Git has declared, by revision hash: what a rollback may serve."""
    pools: Pools = field(default_factory=lambda: Pools(None, []))
    """The last step's plain pool and what serves each class."""

    @classmethod
    def start(cls, specmodel: SpecModel, fleet: Fleet, now: datetime) -> Operator:
        status = SpecModelStatus()
        operator = cls(specmodel, status, plan(specmodel, status, now), _config_of(specmodel))
        return operator.reconciled(fleet, now)

    @property
    def target(self) -> Setting:
        """The serving plan as a fleet setting."""
        return Setting(self.plan.active.hash, self.plan.speculation)

    @property
    def canary(self) -> Setting | None:
        """The serving plan's canary (the active revision with speculation), if a trial runs."""
        return Setting(self.plan.active.hash, True) if self.plan.canary else None

    @property
    def rollout_canary(self) -> tuple[Setting, int] | None:
        """The canary rollout's step: the desired revision, with the fleet's speculation, on
        so many pods."""
        pods = self.plan.rollout_pods
        return (Setting(self.plan.desired.hash, self.plan.speculation), pods) if pods else None

    def with_spec(self, specmodel: SpecModel, fleet: Fleet, now: datetime) -> Operator:
        """Git changed the spec: the controller reconciles at once."""
        configs = {**self.configs, **_config_of(specmodel)}
        return replace(self, specmodel=specmodel, configs=configs).reconciled(fleet, now)

    def reconciled(self, fleet: Fleet, now: datetime) -> Operator:
        """Status after a reconcile that sees the fleet's Deployment as it is now."""
        return self._stepped(fleet, None, now)[0]

    def ticked(
        self, observation: Observation, fleet: Fleet, now: datetime
    ) -> tuple[Operator, Step]:
        """A guard tick: the guard's decision folded into status, and the plan that follows."""
        return self._stepped(fleet, GuardTick(observation), now)

    def _stepped(
        self, fleet: Fleet, tick: GuardTick | None, now: datetime
    ) -> tuple[Operator, Step]:
        observed = Observed(
            fleet=_fleet_seen(fleet, self.specmodel.spec.pod.replicas),
            canary=_canary_seen(fleet),
            rollout=_rollout_seen(fleet),
            plain=_plain_seen(fleet),
        )
        the_step = step(self.specmodel, self.status, observed, tick, self.configs, now)
        stepped = replace(self, status=the_step.status, plan=the_step.plan, pools=the_step.pools)
        return stepped, the_step


def initial_setting(specmodel: SpecModel, now: datetime) -> Setting:
    """What a fleet runs before the operator first reconciles it."""
    the_plan = plan(specmodel, SpecModelStatus(), now)
    return Setting(the_plan.active.hash, the_plan.speculation)


def _config_of(specmodel: SpecModel) -> dict[str, EngineConfig]:
    config = specmodel.engine_config()
    return {revision_hash(config): config}


def _fleet_seen(fleet: Fleet, replicas: int) -> Rollout:
    """The engine Deployment as the controller's watch sees it: every replica stays available
    while the fleet rolls to a new plan, updated and complete once it has."""
    updated = replicas if fleet.settled else 0
    return _seen(replicas, fleet.target.speculation, updated, replicas)


def _canary_seen(fleet: Fleet) -> Rollout:
    """The canary's Deployment: one pod, complete once it is ready; not seen without one."""
    if fleet.canary is None:
        return Rollout()
    return _seen(1, True, 1, 1 if fleet.canary.ready else 0)


def _rollout_seen(fleet: Fleet) -> Rollout:
    """The canary rollout's Deployment: complete once the step's pods are ready."""
    step = fleet.rollout_canary
    if step is None:
        return Rollout()
    ready = step.pods if step.serving == step.pods else 0
    return _seen(step.pods, step.setting.speculation, step.pods, ready)


def _plain_seen(fleet: Fleet) -> Rollout:
    """The plain pool's Deployment: complete once its pods are ready; not seen without one."""
    pool = fleet.plain
    if pool is None:
        return Rollout()
    return _seen(pool.pods, False, pool.pods, pool.ready)


def _seen(replicas: int, speculation: bool, updated: int, available: int) -> Rollout:
    """A Deployment at its current generation, none of its replicas left on an old template."""
    counts = ReplicaStatus(desired=replicas, updated=updated, ready=available, available=available)
    complete = updated == replicas and available == replicas
    return Rollout(counts, complete, speculation_running=speculation)
