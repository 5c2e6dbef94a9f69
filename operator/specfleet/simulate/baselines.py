"""The policies the guard is compared with: always on, always off (both follow Git's revision
with the same rollout time as the guarded fleet) and an oracle that switches at once to the
setting with the best expected goodput among those that meet every class's quality SLO (and
every critical class's acceptance floor: the SpecModel says speculation must not serve it below
that), over every revision that exists by then (if none meets them, the best of all). Each
chooses for what the fleet serves (`load`: without what the gateways route to the plain pool)."""

from __future__ import annotations

from collections.abc import Callable

from specfleet.simulate import physics
from specfleet.simulate.world import ClassConditions, Conditions, Load, Setting, World

Policy = Callable[[float, Load], Setting]


def always(world: World, speculation: bool) -> Policy:
    def choose(t: float, load: Load) -> Setting:
        return Setting(world.change_at(t).config, speculation)

    return choose


def oracle(world: World) -> Policy:
    def choose(t: float, load: Load) -> Setting:
        candidates = [
            Setting(r.config, speculation)
            for r in world.revisions.values()
            if r.since <= t
            for speculation in ((True, False) if r.k else (False,))
        ]
        conditions = {s: world.conditions(t, s, load) for s in candidates}
        compliant = [s for s in candidates if _meets_slos(conditions[s])]
        return max(compliant or candidates, key=lambda s: expected_goodput(conditions[s]))

    return choose


def expected_goodput(conditions: Conditions) -> float:
    """Valid output tokens per decode-second in expectation (see the package docstring)."""
    valid = seconds = 0.0
    for c in conditions.classes:
        tokens = c.rate * c.output_tokens
        invalid = c.tool_call_rate * (1.0 - c.validity) + (
            1.0 - c.validity if c.structured else 0.0
        )
        broken = invalid + c.truncation_rate
        if c.meets_slo:
            valid += tokens * (1.0 - c.error_rate) * max(1.0 - broken, 0.0)
        seconds += (
            tokens
            * conditions.step_seconds
            / physics.tokens_per_step(c.alpha, conditions.k, c.decay, c.match_rate)
        )
    return valid / seconds if seconds else 0.0


def _meets_slos(conditions: Conditions) -> bool:
    return all(
        c.meets_slo and _above_floor(c, conditions.k) for c in conditions.classes if c.rate > 0
    )


def _above_floor(c: ClassConditions, k: int) -> bool:
    """Served without speculation, or drafting at its floor or over it."""
    if not k or c.acceptance_floor is None:
        return True
    return physics.engine_acceptance_rate(c.alpha, k, c.decay, c.match_rate) >= c.acceptance_floor
