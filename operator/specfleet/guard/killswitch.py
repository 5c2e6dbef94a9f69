"""Why is speculation off? One of these, first that holds:

1. The spec declares no speculative decoding (source `config`).
2. The kill-switch annotation says `engage` (`release` forces it on) (source `annotation`).
3. spec.guard.mode says `off` (`on` forces it on) (source `spec`).
4. The guard's kill switch is engaged, or in a trial: the fleet runs without speculation while
   one canary pod runs it (source `guard`).

An override (2, 3) decides and the guard only alerts: its kill switch is discarded while the
override holds, and an override that ends hands the switch back to the guard, released.
"""

from __future__ import annotations

from datetime import datetime

from specfleet.api import KILL_SWITCH_ANNOTATION, SpecModel
from specfleet.api.spec import GuardSpec
from specfleet.api.status import KillSwitchState, KillSwitchStatus, SpeculationSource

ANNOTATION_SPECULATION = {"engage": False, "release": True}
"""What the kill-switch annotation's values force speculation to."""
OVERRIDES = (SpeculationSource.ANNOTATION, SpeculationSource.SPEC)


def speculation(
    specmodel: SpecModel, kill_switch: KillSwitchStatus | None
) -> tuple[bool, SpeculationSource]:
    """Whether the fleet runs speculation, and who decided it."""
    if specmodel.spec.speculative is None:
        return False, SpeculationSource.CONFIG
    annotation = specmodel.metadata.annotations.get(KILL_SWITCH_ANNOTATION, "auto")
    if annotation in ANNOTATION_SPECULATION:
        return ANNOTATION_SPECULATION[annotation], SpeculationSource.ANNOTATION
    mode = specmodel.spec.guard.mode
    if mode != "auto":
        return mode == "on", SpeculationSource.SPEC
    kill_switch = kill_switch or KillSwitchStatus()
    return not _guard_engaged(kill_switch), SpeculationSource.GUARD


def _guard_engaged(kill_switch: KillSwitchStatus) -> bool:
    return (
        kill_switch.state != KillSwitchState.RELEASED
        and kill_switch.source == SpeculationSource.GUARD
    )


def override(source: str) -> SpeculationSource | None:
    """The override that decides speculation, or None when the guard (or the config) does."""
    return SpeculationSource(source) if source in OVERRIDES else None


def runs_canary(source: str, kill_switch: KillSwitchStatus | None) -> bool:
    """A trial: the guard decides and its kill switch tries speculation on one canary pod."""
    state = (kill_switch or KillSwitchStatus()).state
    return source == SpeculationSource.GUARD and state == KillSwitchState.TRIAL


def after_decision(
    source: str, previous: KillSwitchStatus | None, decided: KillSwitchStatus
) -> KillSwitchStatus:
    """The kill switch once the guard has decided: its own, unless an override decides (then
    the guard's is discarded and the override's stays)."""
    if source in OVERRIDES:
        return previous or KillSwitchStatus()
    return decided


def after_plan(
    source: str, on: bool, previous: KillSwitchStatus | None, now: datetime
) -> KillSwitchStatus:
    """The kill switch once the plan is made: an override sets it (kept while unchanged); an
    override that ended hands it back to the guard, released."""
    old = previous or KillSwitchStatus()
    if source not in OVERRIDES:
        return old if old.source in (SpeculationSource.GUARD, "") else KillSwitchStatus()
    state = KillSwitchState.RELEASED if on else KillSwitchState.ENGAGED
    if old.state == state and old.source == source:
        return old
    return KillSwitchStatus(
        state=state, source=source, since=now.isoformat(), reason=f"set by the {source}"
    )


def canary_judged(ready_since: str, guard: GuardSpec, now: datetime) -> bool:
    """Whether a trial's canary has served long enough to be judged: one interval (its series
    are new, the last speculating pods stopped a cooldown ago, so the window holds nothing
    else, and a failing trial costs less the sooner it is judged); a cooldown shorter than a
    window waits a window."""
    needed = guard.interval_seconds
    if guard.cooldown_seconds < guard.window_seconds:
        needed = guard.window_seconds
    return (now - datetime.fromisoformat(ready_since)).total_seconds() >= needed
