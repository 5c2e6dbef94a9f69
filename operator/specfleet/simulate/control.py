"""The operator's half of the loop: the production tick (`tick.step`) over the Deployment
as the controller's watch would see it (synthesized from the simulated fleet). So the guard
judges a window only when the operator would: rollout complete and Ready for a whole window.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from specfleet.api import EngineConfig, SpecModel, SpecModelStatus
from specfleet.render import revision_hash
from specfleet.render.workload import SPECULATION_LABEL
from specfleet.simulate.fleet import Fleet
from specfleet.simulate.world import Setting
from specfleet.telemetry.model import Observation
from specfleet.tick.plan import Plan, plan
from specfleet.tick.status import Observed
from specfleet.tick.step import GuardTick, Step, step

Body = dict[str, Any]


@dataclass(frozen=True)
class Operator:
    specmodel: SpecModel
    status: SpecModelStatus
    plan: Plan
    """The last step's serving plan."""
    configs: dict[str, EngineConfig]
    """Every engine config Git has declared, by revision hash: what a rollback may serve."""

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
            deployment=deployment(fleet, self.specmodel.spec.pod.replicas),
            canary=canary_deployment(fleet),
            rollout=rollout_deployment(fleet),
        )
        the_step = step(self.specmodel, self.status, observed, tick, self.configs, now)
        return replace(self, status=the_step.status, plan=the_step.plan), the_step


def initial_setting(specmodel: SpecModel, now: datetime) -> Setting:
    """What a fleet runs before the operator first reconciles it."""
    the_plan = plan(specmodel, SpecModelStatus(), now)
    return Setting(the_plan.active.hash, the_plan.speculation)


def _config_of(specmodel: SpecModel) -> dict[str, EngineConfig]:
    config = specmodel.engine_config()
    return {revision_hash(config): config}


def deployment(fleet: Fleet, replicas: int) -> Body:
    """The engine Deployment as the controller's watch sees it: every plan change is a new
    generation, complete once the fleet's rollout is."""
    updated = replicas if fleet.settled else 0
    return _deployment(fleet.generation, replicas, fleet.target.speculation, updated, replicas)


def canary_deployment(fleet: Fleet) -> Body | None:
    """The canary's Deployment: one pod, complete once it is ready."""
    if fleet.canary is None:
        return None
    ready = 1 if fleet.canary.ready else 0
    return _deployment(1, 1, True, 1, ready)


def rollout_deployment(fleet: Fleet) -> Body | None:
    """The canary rollout's Deployment: complete once the step's pods are ready."""
    step = fleet.rollout_canary
    if step is None:
        return None
    ready = step.pods if step.serving == step.pods else 0
    return _deployment(1, step.pods, step.setting.speculation, step.pods, ready)


def _deployment(
    generation: int, replicas: int, speculation: bool, updated: int, available: int
) -> Body:
    labels = {SPECULATION_LABEL: "on" if speculation else "off"}
    return {
        "metadata": {"generation": generation},
        "spec": {"replicas": replicas, "template": {"metadata": {"labels": labels}}},
        "status": {
            "observedGeneration": generation,
            "replicas": replicas,
            "updatedReplicas": updated,
            "readyReplicas": available,
            "availableReplicas": available,
        },
    }
