"""The operator's half of the loop, on the same path the controller takes: `controller.plan`
from spec + status, `controller.status.next_status` for the bookkeeping, `guard.decide` on a
`Situation`, and the decision written back into status (guard memory, kill switch, the active
revision's verdict) for the next plan to act on.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime

from specfleet.api import SpecModel, SpecModelStatus
from specfleet.api.status import GuardStatus, KillSwitchStatus
from specfleet.controller.plan import GOOD, Plan, plan
from specfleet.controller.status import Observed, next_status
from specfleet.guard import Decision, Policy, Situation, decide
from specfleet.simulate.world import Setting
from specfleet.telemetry.model import Observation

OVERRIDE_SOURCES = ("annotation", "spec")


@dataclass(frozen=True)
class Operator:
    specmodel: SpecModel
    status: SpecModelStatus

    @classmethod
    def start(cls, specmodel: SpecModel, now: datetime) -> Operator:
        return cls(specmodel, SpecModelStatus()).reconciled(now)

    def plan(self, now: datetime) -> Plan:
        return plan(self.specmodel, self.status, now)

    def target(self, now: datetime) -> Setting:
        """The serving plan as a fleet setting."""
        the_plan = self.plan(now)
        return Setting(the_plan.active.hash, the_plan.speculation)

    def with_spec(self, specmodel: SpecModel, now: datetime) -> Operator:
        """Git changed the spec: the controller reconciles at once."""
        return replace(self, specmodel=specmodel).reconciled(now)

    def reconciled(self, now: datetime) -> Operator:
        the_plan = self.plan(now)
        status = next_status(self.specmodel, the_plan, Observed(), self.status, now)
        return replace(self, status=status)

    def situation(
        self, observation: Observation, speculation: bool, settled: bool, now: datetime
    ) -> Situation:
        the_plan = self.plan(now)
        source = the_plan.speculation_source
        return Situation(
            policy=Policy.of(self.specmodel, source if source in OVERRIDE_SOURCES else None),
            guard=self.status.guard or GuardStatus(),
            kill_switch=self.status.kill_switch or KillSwitchStatus(),
            revision=the_plan.active,
            has_last_good=any(
                r.verdict == GOOD and r.number != the_plan.active.number for r in the_plan.revisions
            ),
            speculation=speculation,
            settled=settled,
            observation=observation,
            now=now,
        )

    def decided(self, situation: Situation) -> tuple[Operator, Decision]:
        """The guard's decision, recorded in status, and the operator reconciled on it."""
        decision = decide(situation)
        active = situation.revision.number
        revisions = [
            r.model_copy(update={"verdict": decision.verdict}) if r.number == active else r
            for r in self.status.revisions
        ]
        status = self.status.model_copy(
            update={
                "guard": decision.guard,
                "kill_switch": decision.kill_switch,
                "revisions": revisions,
                "classes": decision.classes,
                "acceptance": decision.acceptance,
            }
        )
        return replace(self, status=status).reconciled(situation.now), decision
