"""The plain pool and each class's speculation, pure: from the plan, the pool's Deployment as
watched, the guard's class switches and the last window's traffic.

A class off speculation (set off by an override, `guard.killswitch.classes_off`, or by the
guard, `guard.class_switch`) moves to the plain pool only once the pool has a pod available:
until then it stays on the speculative fleet and waits, and the pool is sized for it meanwhile,
from its share of the window's requests. Once routed, its requests are the plain pool's
(`Observation.plain`, which status.classes shows as `judgedOn: plainPool`), and the pool follows
their share; a window with none of them keeps the pods it has. With the
fleet's own speculation off every class already runs without, and nothing is routed. A class on
the guard's trial stays routed, and the gateways send its trial's share back to the fleet.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from specfleet.api import SpecModel
from specfleet.api.status import (
    ClassObservation,
    ClassSpeculation,
    ClassSpeculationState,
    ClassSwitch,
    ClassSwitchState,
    JudgedOn,
    SpeculationSource,
)
from specfleet.guard import killswitch
from specfleet.render import PlainPool
from specfleet.render.workload import plain_name
from specfleet.tick.observed import Rollout
from specfleet.tick.plan import Plan

SPECULATING, PLAIN, WAITING, TRIAL = (
    ClassSpeculationState.SPECULATING,
    ClassSpeculationState.PLAIN,
    ClassSpeculationState.WAITING,
    ClassSpeculationState.TRIAL,
)


@dataclass(frozen=True)
class Pools:
    """What serves each class."""

    plain: PlainPool | None
    """The plain pool to render; None at zero pods."""
    classes: list[ClassSpeculation]


def pools(
    specmodel: SpecModel,
    plan: Plan,
    pool: Rollout,
    traffic: list[ClassObservation],
    switches: list[ClassSwitch],
) -> Pools:
    """`switches`: the guard's (status.guard.classSwitches), which count while it decides."""
    names = [c.name for c in specmodel.spec.classes]
    if specmodel.spec.speculative is None or not plan.speculation:
        why = _fleet_off(specmodel, plan)
        return Pools(_sized(specmodel, [], traffic), [_state(n, PLAIN, why) for n in names])
    off = _off(specmodel, plan, switches)
    wanted = [n for n in names if n in off]
    ready = pool.replicas.available >= 1
    held = pool.replicas.desired if ready and not _seen(wanted, traffic) else 0
    plain = _sized(specmodel, wanted, traffic, held)
    if plain is not None and ready:
        share = specmodel.spec.guard.class_trial_share
        trial = {n: share for n in wanted if off[n].trial}
        plain = plain.model_copy(update={"routed": wanted, "trial": trial})
    states = [_class_state(n, off.get(n), ready, specmodel, pool) for n in names]
    return Pools(plain, states)


class Off(NamedTuple):
    why: str
    trial: bool = False
    """On the guard's trial: a share of it is served with speculation."""


def _off(specmodel: SpecModel, plan: Plan, switches: list[ClassSwitch]) -> dict[str, Off]:
    """The classes off speculation, each with who set it off: an override, else (while the
    guard decides) the guard."""
    names, source = killswitch.classes_off(specmodel)
    off = {n: Off(f"set off by the {source}") for n in names}
    if plan.speculation_source == SpeculationSource.GUARD and specmodel.spec.guard.route_classes:
        for found in switches:
            trial = found.state == ClassSwitchState.TRIAL
            off.setdefault(found.name, Off(f"set off by the guard: {found.reason}", trial))
    return off


def _sized(
    specmodel: SpecModel, routed: list[str], traffic: list[ClassObservation], held: int = 0
) -> PlainPool | None:
    spec = specmodel.spec
    share = _share(routed, traffic, len(spec.classes))
    replicas = spec.plain_pool.replicas(share, spec.pod.replicas, bool(routed), held)
    return PlainPool(replicas=replicas) if replicas else None


def _seen(routed: list[str], traffic: list[ClassObservation]) -> bool:
    """Whether the last window saw requests of a routed class, on either pool."""
    return any(_served(c) for c in traffic if c.name in routed)


def _served(found: ClassObservation) -> float:
    """The class's requests in the last window, on the fleet's engines and the plain pool: a
    class moving, or on trial, is served by both."""
    fleet = 0.0 if found.judged_on == JudgedOn.PLAIN_POOL else found.requests or 0.0
    return fleet + (found.plain_pool_requests or 0.0)


def _share(routed: list[str], traffic: list[ClassObservation], classes: int) -> float:
    """The routed classes' share of the last window's requests; without any, their share of
    the classes."""
    requests = {c.name: _served(c) for c in traffic}
    total = sum(requests.values())
    if total <= 0:
        return len(routed) / classes
    return sum(requests.get(n, 0.0) for n in routed) / total


def _class_state(
    name: str, off: Off | None, ready: bool, specmodel: SpecModel, pool: Rollout
) -> ClassSpeculation:
    if off is None:
        return _state(name, SPECULATING, "")
    pool_name = plain_name(specmodel.metadata.name)
    if ready:
        return _state(name, TRIAL if off.trial else PLAIN, f"{off.why}; served by {pool_name}")
    replicas = pool.replicas
    return _state(
        name,
        WAITING,
        f"{off.why}; served with speculation until {pool_name} is Ready "
        f"({replicas.available}/{replicas.desired} pods available)",
    )


def _fleet_off(specmodel: SpecModel, plan: Plan) -> str:
    if specmodel.spec.speculative is None:
        return "the spec declares no speculative decoding"
    return f"the fleet runs without speculation (set by the {plan.speculation_source})"


def _state(name: str, state: ClassSpeculationState, reason: str) -> ClassSpeculation:
    return ClassSpeculation(name=name, state=state, reason=reason)


def speculating(classes: list[ClassSpeculation]) -> str:
    """`3/4`: the classes served with speculation now (a waiting one still is, one on trial
    only in part), of all."""
    return f"{sum(c.state in (SPECULATING, WAITING) for c in classes)}/{len(classes)}"
