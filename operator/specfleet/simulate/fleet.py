"""The fleet's rollouts: a plan change takes `rollout_seconds` to reach every pod; a trial's
canary is one pod, which takes `rollout_seconds / replicas` to start; a canary rollout's pods
start together, as long as one pod (the fleet's give them their share of the traffic once they
are ready, so the pod count stays the replicas').

The engine Deployment rolls with maxSurge 1 and maxUnavailable 0 (`render.workload`), so its
pods move to the new setting one after another, `rollout_seconds / replicas` apart: each new
pod takes its share of the traffic once Ready, and the old pod it replaces stops taking any.
The Deployment is complete, and `serving` the new setting, once the last pod has moved.
Telemetry filters series by the pods' revision and speculation labels, so after a switch the
guard's window holds only what the new setting served; the operator judges it only after a
whole window of Ready.

The plain pool (`<name>-plain`) runs the fleet's revision without speculation: new pods start
together and take one pod start, as a canary does; fewer pods go at once. The gateways send the
classes the operator routes to its ready pods, but for a class on the guard's trial the share
they serve with speculation instead.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace

from specfleet import render
from specfleet.simulate.world import WHOLE, Load, Setting


@dataclass(frozen=True)
class Canary:
    """A trial's canary: one extra pod with `setting`, taking traffic from `ready_at`."""

    setting: Setting
    ready_at: float
    ready: bool = False


@dataclass(frozen=True)
class RolloutCanary:
    """A canary rollout's pods: `setting` on `pods` of the replicas from `ready_at`; until then
    the `serving` pods of the step before keep serving (none at the first step)."""

    setting: Setting
    pods: int
    ready_at: float
    serving: int = 0


@dataclass(frozen=True)
class PlainPool:
    """The plain pool and the gateways' route to it: `pods` pods, `ready` of them taking traffic
    (the others start together, ready at `ready_at`); the `routed` classes' requests go to it
    (the operator routes none before a pod is ready)."""

    pods: int
    ready_at: float
    ready: int = 0
    routed: tuple[str, ...] = ()
    trial: tuple[tuple[str, float], ...] = ()
    """Per routed class on the guard's trial, the share of it the fleet serves instead."""

    def share(self, name: str) -> float:
        """The share of a class's requests the pool serves."""
        return 1.0 - dict(self.trial).get(name, 0.0) if name in self.routed else 0.0

    def load(self, names: Iterable[str]) -> Load:
        """What its ready pods serve."""
        return Load.of({n: self.share(n) for n in names}, self.ready)


def fleet_load(pool: PlainPool | None) -> Load:
    """What the fleet's pods serve beside the plain pool: the rest of each class's requests."""
    return Load.of({n: 1.0 - pool.share(n) for n in pool.routed}) if pool else WHOLE


@dataclass(frozen=True)
class Rollout:
    """`pending` reaching the fleet's pods one at a time; `moved` of them had it at `started`."""

    pending: Setting
    started: float
    pod_seconds: float
    replicas: int
    moved: int = 0

    @property
    def ready_at(self) -> float:
        return self.started + (self.replicas - self.moved) * self.pod_seconds

    def moved_at(self, now: float) -> int:
        """Pods serving `pending` at `now`."""
        started = math.floor((now - self.started) / self.pod_seconds + 1e-9)
        return self.moved + min(max(started, 0), self.replicas - self.moved)


@dataclass(frozen=True)
class Fleet:
    serving: Setting
    switched_at: float = 0.0
    rollout: Rollout | None = None
    canary: Canary | None = None
    rollout_canary: RolloutCanary | None = None
    plain: PlainPool | None = None

    @property
    def settled(self) -> bool:
        return self.rollout is None

    @property
    def pending(self) -> Setting | None:
        return self.rollout.pending if self.rollout else None

    @property
    def target(self) -> Setting:
        return self.pending or self.serving

    @property
    def canary_serving(self) -> Setting | None:
        """The canary's setting while it takes traffic."""
        return self.canary.setting if self.canary and self.canary.ready else None

    def pods(self, replicas: int) -> int:
        """Pods holding GPUs from their start: the replicas (a canary rollout's among them), the
        one a rolling update surges (maxSurge 1), a trial's canary and the plain pool's."""
        plain = self.plain.pods if self.plain else 0
        return replicas + (self.rollout is not None) + (self.canary is not None) + plain

    def moved(self, now: float) -> int:
        """Pods already serving the pending setting."""
        return self.rollout.moved_at(now) if self.rollout else 0

    def request(self, target: Setting, now: float, rollout_seconds: float, replicas: int) -> Fleet:
        """Roll out `target`. A new target restarts the rollout; going back to what serves moves
        the pods that had moved back, one at a time (none moved: cancelled at once)."""
        if target == self.target:
            return self
        pod_seconds = pod_start_seconds(rollout_seconds, replicas)
        moved = self.moved(now)
        if target == self.serving and moved == 0:
            return replace(self, rollout=None)
        if target == self.serving and self.pending is not None:
            back = Rollout(target, now, pod_seconds, replicas, replicas - moved)
            return replace(self, serving=self.pending, rollout=back)
        rollout = Rollout(target, now, pod_seconds, replicas)
        return replace(self, rollout=rollout)

    def request_canary(
        self, setting: Setting | None, now: float, rollout_seconds: float, replicas: int
    ) -> Fleet:
        """Start a canary with `setting` (one pod start), or remove the one running (at once) for
        None."""
        if setting is None:
            return replace(self, canary=None) if self.canary else self
        if self.canary and self.canary.setting == setting:
            return self
        ready_at = now + pod_start_seconds(rollout_seconds, replicas)
        return replace(self, canary=Canary(setting, ready_at))

    def request_rollout_canary(
        self, step: tuple[Setting, int] | None, now: float, rollout_seconds: float, replicas: int
    ) -> Fleet:
        """Run a canary rollout's step (its setting on so many pods), or remove its pods (at
        once) for None. A step with more pods keeps the old ones serving while the new start."""
        old = self.rollout_canary
        if step is None:
            return replace(self, rollout_canary=None) if old else self
        setting, pods = step
        if old and (old.setting, old.pods) == (setting, pods):
            return self
        serving = old.serving if old and old.setting == setting else 0
        ready_at = now + pod_start_seconds(rollout_seconds, replicas)
        return replace(self, rollout_canary=RolloutCanary(setting, pods, ready_at, serving))

    def request_plain(
        self, plan: render.PlainPool | None, now: float, rollout_seconds: float, replicas: int
    ) -> Fleet:
        """Run the plain pool the plan renders (more pods: the new ones start, and any still
        starting with them; fewer: at once; none: removed) and route to it as it says."""
        old = self.plain
        if plan is None:
            return replace(self, plain=None) if old else self
        pods, routed, trial = plan.replicas, tuple(plan.routed), tuple(plan.trial.items())
        if old is None or pods > old.pods:
            ready_at = now + pod_start_seconds(rollout_seconds, replicas)
            pool = PlainPool(pods, ready_at, old.ready if old else 0, routed, trial)
        else:
            ready = min(old.ready, pods)
            pool = replace(old, pods=pods, ready=ready, routed=routed, trial=trial)
        return self if pool == old else replace(self, plain=pool)

    def advance(self, now: float) -> Fleet:
        fleet = self
        if self.canary and not self.canary.ready and now >= self.canary.ready_at:
            fleet = replace(self, canary=replace(self.canary, ready=True))
        step = fleet.rollout_canary
        if step and step.serving != step.pods and now >= step.ready_at:
            fleet = replace(fleet, rollout_canary=replace(step, serving=step.pods))
        pool = fleet.plain
        if pool and pool.ready != pool.pods and now >= pool.ready_at:
            fleet = replace(fleet, plain=replace(pool, ready=pool.pods))
        if fleet.rollout is None or now < fleet.rollout.ready_at:
            return fleet
        return replace(
            fleet,
            serving=fleet.rollout.pending,
            switched_at=fleet.rollout.ready_at,
            rollout=None,
        )


def pod_start_seconds(rollout_seconds: float, replicas: int) -> float:
    """A rollout starts the fleet's pods one after another: one pod start is a replica's part."""
    return rollout_seconds / max(replicas, 1)
