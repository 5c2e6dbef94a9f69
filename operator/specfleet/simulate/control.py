"""The operator's half of the loop, on the path `controller.reconcile` takes: on a guard tick
`controller.guarding.situation` -> `guard.decide` -> `controller.guarding.apply_decision`, then
`controller.plan` and `controller.status.next_status` over the Deployment as the controller's
watch sees it (synthesized from the simulated fleet). So the guard judges a window only when the
operator would: rollout complete and Ready for a whole window.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from specfleet.api import SpecModel, SpecModelStatus
from specfleet.controller import guarding
from specfleet.controller.plan import Plan, plan
from specfleet.controller.status import Observed, next_status, rollout
from specfleet.guard import Decision, Situation, decide
from specfleet.render.workload import SPECULATION_LABEL
from specfleet.simulate.fleet import Fleet
from specfleet.simulate.world import Setting
from specfleet.telemetry.model import Observation

Body = dict[str, Any]


@dataclass(frozen=True)
class Operator:
    specmodel: SpecModel
    status: SpecModelStatus

    @classmethod
    def start(cls, specmodel: SpecModel, fleet: Fleet, now: datetime) -> Operator:
        return cls(specmodel, SpecModelStatus()).reconciled(fleet, now)

    def plan(self, now: datetime) -> Plan:
        return plan(self.specmodel, self.status, now)

    def target(self, now: datetime) -> Setting:
        """The serving plan as a fleet setting."""
        the_plan = self.plan(now)
        return Setting(the_plan.active.hash, the_plan.speculation)

    def canary(self, now: datetime) -> Setting | None:
        """The serving plan's canary (the active revision with speculation), if a trial runs."""
        the_plan = self.plan(now)
        return Setting(the_plan.active.hash, True) if the_plan.canary else None

    def with_spec(self, specmodel: SpecModel, fleet: Fleet, now: datetime) -> Operator:
        """Git changed the spec: the controller reconciles at once."""
        return replace(self, specmodel=specmodel).reconciled(fleet, now)

    def reconciled(self, fleet: Fleet, now: datetime) -> Operator:
        """Status after a reconcile that sees the fleet's Deployment as it is now."""
        observed = Observed(
            deployment=deployment(fleet, self.specmodel.spec.pod.replicas),
            canary=canary_deployment(fleet),
        )
        status = next_status(self.specmodel, self.plan(now), observed, self.status, now)
        return replace(self, status=status)

    def situation(self, observation: Observation, fleet: Fleet, now: datetime) -> Situation:
        body = deployment(fleet, self.specmodel.spec.pod.replicas)
        return guarding.situation(
            self.specmodel, self.status, self.plan(now), rollout(body), observation, now
        )

    def decided(self, situation: Situation, fleet: Fleet) -> tuple[Operator, Decision]:
        """The guard's decision folded into status, then the reconcile that follows it."""
        decision = decide(situation)
        status = guarding.apply_decision(
            self.status, self.plan(situation.now), decision, situation.now
        )
        return replace(self, status=status).reconciled(fleet, situation.now), decision


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
