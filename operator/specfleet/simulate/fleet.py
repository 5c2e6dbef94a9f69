"""The fleet's rollouts: a plan change takes `rollout_seconds` to reach every pod.

Until then the old setting serves and the Deployment is not complete. Telemetry filters series
by the pods' revision and speculation labels, so after a switch the guard's window holds only
what the new setting served; the operator judges it only after a whole window of Ready.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from specfleet.simulate.world import Setting


@dataclass(frozen=True)
class Fleet:
    serving: Setting
    switched_at: float = 0.0
    pending: Setting | None = None
    ready_at: float | None = None
    generation: int = 1
    """The Deployment's generation: one more for every plan change the operator applies."""

    @property
    def settled(self) -> bool:
        return self.pending is None

    @property
    def target(self) -> Setting:
        return self.pending or self.serving

    def request(self, target: Setting, now: float, rollout_seconds: float) -> Fleet:
        """Roll out `target` (a new target restarts the rollout; the current one cancels it)."""
        if target == self.target:
            return self
        generation = self.generation + 1
        if target == self.serving:
            return replace(self, pending=None, ready_at=None, generation=generation)
        return replace(self, pending=target, ready_at=now + rollout_seconds, generation=generation)

    def advance(self, now: float) -> Fleet:
        if self.pending is None or self.ready_at is None or now < self.ready_at:
            return self
        return Fleet(serving=self.pending, switched_at=self.ready_at, generation=self.generation)
