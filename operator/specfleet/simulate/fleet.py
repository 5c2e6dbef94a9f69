"""The fleet's rollouts: a plan change takes `rollout_seconds` to reach every pod.

Until then the old setting serves and the guard sees `settled=False`. Telemetry filters series
by the pods' revision and speculation labels, so after a switch the guard's window holds only
what the new setting served (a partial window, with fewer samples, right after the switch).
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
        if target == self.serving:
            return replace(self, pending=None, ready_at=None)
        return replace(self, pending=target, ready_at=now + rollout_seconds)

    def advance(self, now: float) -> Fleet:
        if self.pending is None or self.ready_at is None or now < self.ready_at:
            return self
        return Fleet(serving=self.pending, switched_at=self.ready_at)
