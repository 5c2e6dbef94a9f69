"""The fleet's rollouts: a plan change takes `rollout_seconds` to reach every pod; a trial's
canary is one pod, which takes `rollout_seconds / replicas` to start.

Until a rollout completes the old setting serves and the Deployment is not complete. A rolling
update with maxSurge 1 and maxUnavailable 0 starts the new pods one after another, so
`rollout_seconds` is `replicas` pod starts, and a canary, one pod of its own, needs one of them.
Telemetry filters series by the pods' revision and speculation labels, so after a switch the
guard's window holds only what the new setting served; the operator judges it only after a
whole window of Ready.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from specfleet.simulate.world import Setting


@dataclass(frozen=True)
class Canary:
    """A trial's canary: one extra pod with `setting`, taking traffic from `ready_at`."""

    setting: Setting
    ready_at: float
    ready: bool = False


@dataclass(frozen=True)
class Fleet:
    serving: Setting
    switched_at: float = 0.0
    pending: Setting | None = None
    ready_at: float | None = None
    generation: int = 1
    """The Deployment's generation: one more for every plan change the operator applies."""
    canary: Canary | None = None

    @property
    def settled(self) -> bool:
        return self.pending is None

    @property
    def target(self) -> Setting:
        return self.pending or self.serving

    @property
    def canary_serving(self) -> Setting | None:
        """The canary's setting while it takes traffic."""
        return self.canary.setting if self.canary and self.canary.ready else None

    def request(self, target: Setting, now: float, rollout_seconds: float) -> Fleet:
        """Roll out `target` (a new target restarts the rollout; the current one cancels it)."""
        if target == self.target:
            return self
        generation = self.generation + 1
        if target == self.serving:
            return replace(self, pending=None, ready_at=None, generation=generation)
        return replace(self, pending=target, ready_at=now + rollout_seconds, generation=generation)

    def request_canary(self, setting: Setting | None, now: float, start_seconds: float) -> Fleet:
        """Start a canary with `setting`, or remove the one running (at once) for None."""
        if setting is None:
            return replace(self, canary=None) if self.canary else self
        if self.canary and self.canary.setting == setting:
            return self
        return replace(self, canary=Canary(setting, now + start_seconds))

    def advance(self, now: float) -> Fleet:
        fleet = self
        if self.canary and not self.canary.ready and now >= self.canary.ready_at:
            fleet = replace(self, canary=replace(self.canary, ready=True))
        if fleet.pending is None or fleet.ready_at is None or now < fleet.ready_at:
            return fleet
        return Fleet(
            serving=fleet.pending,
            switched_at=fleet.ready_at,
            generation=fleet.generation,
            canary=fleet.canary,
        )
