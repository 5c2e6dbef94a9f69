"""One tick of the guard: what it knows (`Situation`) and the evaluation in progress (`Tick`),
which each concern (blindness, probation, kill switch, rate limit) takes in turn."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

from specfleet.api.status import (
    DecisionReason,
    Evidence,
    GuardStatus,
    KillSwitchStatus,
    RevisionRecord,
    RolloutStatus,
)
from specfleet.guard import evidence as accumulated
from specfleet.guard.actions import ACTING, COUNTED, Action, ActionKind
from specfleet.guard.policy import Policy
from specfleet.guard.verdict import ClassVerdict, Evaluation
from specfleet.telemetry.model import Observation


@dataclass(frozen=True)
class Situation:
    """Everything the guard knows at one tick."""

    policy: Policy
    guard: GuardStatus
    kill_switch: KillSwitchStatus
    revision: RevisionRecord
    """The active revision."""
    has_last_good: bool
    """A rollback target exists: a good revision, or one that served clean
    (`tick.plan.rollback_target`)."""
    speculation: bool
    """Whether the running pods use speculation."""
    settled: bool
    """Rollout complete and every pod in the window runs the current plan."""
    observation: Observation | None
    now: datetime
    canary: Observation | None = None
    """The canary over the window, once it has served long enough to be judged: a trial's, or
    a rollout's (the new revision beside the control)."""
    rollback_target: int | None = None
    """The revision a rollback serves, named in the decision."""
    rollout: RolloutStatus | None = None
    """A canary rollout in progress (the fleet serves its control)."""
    rollout_stalled: str | None = None
    """Why the rollout's canary pods cannot become available (its Deployment's progress
    deadline passed: a crash loop, an unschedulable pod, a flag the engine refuses)."""
    routed: frozenset[str] = frozenset()
    """The classes the plain pool serves as status last said (not those waiting for it)."""


class QuietJudgement(NamedTuple):
    """The classes a window left unjudged, judged on a quiet fleet's evidence (`guard.quiet`)."""

    evidence: Observation
    """The evidence as one long window: its seconds, its summed counts."""
    classes: dict[str, ClassVerdict]


@dataclass
class Tick:
    """The evaluation in progress: the state it may change, and what it did. Status objects
    are shallow copies or shared: their fields are replaced, never mutated in place."""

    situation: Situation
    stamp: str
    """`situation.now` as status fields record it."""
    guard: GuardStatus
    kill_switch: KillSwitchStatus
    verdict: str
    """The active revision's verdict."""
    silent_since: datetime
    """When the guard last had data before this tick (now, at first sight): what no window
    covers since is no evidence (`blindness`, `resumed`)."""
    actions: list[Action] = field(default_factory=list)
    observation: Observation | None = None
    evaluation: Evaluation | None = None
    """The window last judged and its evaluation: a trial's canary once it is judged."""
    quiet: QuietJudgement | None = None
    """The classes the fleet's window left unjudged, judged on its evidence instead."""
    routed: frozenset[str] = frozenset()
    """The classes judged on what the plain pool served them."""
    served_clean: bool = False
    """The active revision has served N windows in a row judged good: a rollback target."""
    revision_suspect: bool = False
    """The revision on probation breached this window and can be rolled back: a rollback, not
    the kill switch, answers it."""

    @classmethod
    def start(cls, situation: Situation) -> Tick:
        stamp = accumulated.stamp(situation.now)
        guard = situation.guard.model_copy(update={"last_evaluation": stamp})
        if guard.last_data is None:
            guard.last_data = stamp  # the blind clock starts at first sight
        silent_since = datetime.fromisoformat(guard.last_data)
        verdict = situation.revision.verdict
        return cls(situation, stamp, guard, situation.kill_switch, verdict, silent_since)

    def act(
        self, action: ActionKind, reason: DecisionReason, message: str, evidence: dict[str, Any]
    ) -> bool:
        """Records an action; returns whether it may change what runs."""
        dry = self.situation.policy.guard.dry_run and action in ACTING
        if dry:
            message = f"dry run: would have {message[0].lower()}{message[1:]}"
        window = {"windowSeconds": self.situation.policy.guard.window_seconds}
        self.actions.append(
            Action(
                action=action,
                reason=reason,
                message=message,
                evidence={**evidence, **window},
                dry_run=dry,
            )
        )
        if action in COUNTED and not dry:
            self.guard.action_times = [*self.guard.action_times, self.stamp]
        return not dry

    def resumed(self, evidence: Evidence) -> Evidence:
        """A pending judgement's evidence, its deadline moved back by what the guard had no data
        of since it last counted (`evidence.resumed`)."""
        window = self.situation.policy.guard.window_seconds
        return accumulated.resumed(evidence, self.situation.now, self.silent_since, window)
