"""The plain pool and each class's speculation, pure: from the plan, the pool's Deployment as
watched and the last window's traffic.

A class forced off speculation (`guard.killswitch.classes_off`) moves to the plain pool only
once the pool has a pod available: until then it stays on the speculative fleet and waits, and
the pool is sized for it meanwhile, from its share of the fleet's window. Once it is routed its
requests leave the fleet's windows (`telemetry.reader.FLEET`), so the pool keeps the pods it was
given while it serves. With the fleet's own speculation off every class already runs without,
and nothing is routed.
"""

from __future__ import annotations

from dataclasses import dataclass

from specfleet.api import SpecModel
from specfleet.api.status import ClassObservation, ClassSpeculation, ClassSpeculationState
from specfleet.guard import killswitch
from specfleet.render import PlainPool
from specfleet.render.workload import plain_name
from specfleet.tick.observed import Rollout
from specfleet.tick.plan import Plan

SPECULATING, PLAIN, WAITING = (
    ClassSpeculationState.SPECULATING,
    ClassSpeculationState.PLAIN,
    ClassSpeculationState.WAITING,
)


@dataclass(frozen=True)
class Pools:
    """What serves each class."""

    plain: PlainPool | None
    """The plain pool to render; None at zero pods."""
    classes: list[ClassSpeculation]


def pools(
    specmodel: SpecModel, plan: Plan, pool: Rollout, traffic: list[ClassObservation]
) -> Pools:
    names = [c.name for c in specmodel.spec.classes]
    if specmodel.spec.speculative is None or not plan.speculation:
        why = _fleet_off(specmodel, plan)
        return Pools(_sized(specmodel, [], traffic), [_state(n, PLAIN, why) for n in names])
    off, source = killswitch.classes_off(specmodel)
    wanted = [n for n in names if n in off]
    ready = pool.replicas.available >= 1
    plain = _sized(specmodel, wanted, traffic, pool.replicas.desired if ready else 0)
    if plain is not None and ready:
        plain = plain.model_copy(update={"routed": wanted})
    return Pools(plain, [_class_state(n, n in off, ready, source, specmodel, pool) for n in names])


def _sized(
    specmodel: SpecModel, routed: list[str], traffic: list[ClassObservation], held: int = 0
) -> PlainPool | None:
    spec = specmodel.spec
    share = _share(routed, traffic, len(spec.classes))
    replicas = spec.plain_pool.replicas(share, spec.pod.replicas, bool(routed), held)
    return PlainPool(replicas=replicas) if replicas else None


def _share(routed: list[str], traffic: list[ClassObservation], classes: int) -> float:
    """The routed classes' share of the last window's requests; without any, their share of
    the classes."""
    requests = {c.name: c.requests or 0.0 for c in traffic}
    total = sum(requests.values())
    if total <= 0:
        return len(routed) / classes
    return sum(requests.get(n, 0.0) for n in routed) / total


def _class_state(
    name: str, off: bool, ready: bool, source: str, specmodel: SpecModel, pool: Rollout
) -> ClassSpeculation:
    if not off:
        return _state(name, SPECULATING, "")
    pool_name = plain_name(specmodel.metadata.name)
    if ready:
        return _state(name, PLAIN, f"set off by the {source}; served by {pool_name}")
    replicas = pool.replicas
    return _state(
        name,
        WAITING,
        f"set off by the {source}; served with speculation until {pool_name} is Ready "
        f"({replicas.available}/{replicas.desired} pods available)",
    )


def _fleet_off(specmodel: SpecModel, plan: Plan) -> str:
    if specmodel.spec.speculative is None:
        return "the spec declares no speculative decoding"
    return f"the fleet runs without speculation (set by the {plan.speculation_source})"


def _state(name: str, state: ClassSpeculationState, reason: str) -> ClassSpeculation:
    return ClassSpeculation(name=name, state=state, reason=reason)


def speculating(classes: list[ClassSpeculation]) -> str:
    """`3/4`: the classes served with speculation now (a waiting one still is), of all."""
    return f"{sum(c.state != PLAIN for c in classes)}/{len(classes)}"
