"""The closed loop on a virtual clock: the fleet serves slices, the guard decides every tick, the
operator plans, the fleet rolls the plan out; and the same scenario with the same draws under
fixed policies (always on, always off) and an oracle, for goodput comparisons.

Time advances in slices of gcd(tick, window) seconds. Each tick the guard sees the last window
of slices the current setting served (and a trial's canary, beside it), without what the plain
pool served; spec changes from the scenario's rollouts reach the operator at their time
(rounded up to a slice).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from specfleet.api.spec import GuardSpec
from specfleet.experiment.arms import gpus_per_replica
from specfleet.guard import Action, Decision
from specfleet.guard.evidence import past_deadline
from specfleet.guard.speedup import weighted
from specfleet.simulate.baselines import Policy
from specfleet.simulate.control import Operator, initial_setting
from specfleet.simulate.draws import ClassDraw
from specfleet.simulate.fleet import Fleet, PlainPool, fleet_load
from specfleet.simulate.outcome import ClassSlice, realize, window
from specfleet.simulate.world import Conditions, Setting, World
from specfleet.telemetry.model import ClassWindow, Observation
from specfleet.tick.plan import rollback_target

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
RUNNING_BEFORE = 3600.0
"""The fleet has served (Ready) for this long when the scenario starts: the guard may judge its
first full window at once. Its first revision still starts probation at the first evaluation."""


@dataclass(frozen=True)
class Clock:
    """Scenario seconds to the guard's wall-clock datetimes."""

    start: datetime = EPOCH

    def at(self, t: float) -> datetime:
        return self.start + timedelta(seconds=t)


@dataclass(frozen=True)
class Timebase:
    slice_seconds: int
    tick_slices: int
    window_slices: int
    count: int
    rollout_seconds: float

    @classmethod
    def of(cls, duration: float, tick: int, window: int, rollout_seconds: float) -> Timebase:
        size = math.gcd(tick, window)
        return cls(size, tick // size, window // size, math.ceil(duration / size), rollout_seconds)

    def time(self, index: int) -> float:
        return float(index * self.slice_seconds)

    def index(self, t: float) -> int:
        """The first slice starting at or after t."""
        return math.ceil(t / self.slice_seconds - 1e-9)


@dataclass(frozen=True)
class Goodput:
    valid_tokens: float = 0.0
    decode_seconds: float = 0.0
    slo_violation_seconds: float = 0.0
    """Scenario seconds in which a class with traffic was served below its quality SLO."""
    gpu_seconds: float = 0.0
    """GPUs held, over time: the cost."""

    @property
    def rate(self) -> float:
        return self.valid_tokens / self.decode_seconds if self.decode_seconds else 0.0

    def plus(self, served: Served, seconds: float) -> Goodput:
        total = served.total.values()
        return Goodput(
            self.valid_tokens + sum(s.valid_tokens for s in total),
            self.decode_seconds + sum(s.decode_seconds for s in total),
            self.slo_violation_seconds + (seconds if served.violating else 0.0),
            self.gpu_seconds + served.gpus * seconds,
        )


@dataclass(frozen=True)
class Seen:
    """One side's per-class readings over a window, for the timeline."""

    revision: int
    speculation: bool
    rates: dict[str, float | None]
    tpot: dict[str, float | None]
    """Mean TPOT."""
    p95_tpot: dict[str, float | None]
    validity: dict[str, float | None]
    """The lower of tool-call and structured-output validity."""

    @classmethod
    def of(cls, observation: Observation) -> Seen:
        classes = observation.classes
        return cls(
            revision=observation.revision,
            speculation=observation.speculation,
            rates={n: w.acceptance_rate for n, w in classes.items()},
            tpot={n: w.mean_tpot_seconds for n, w in classes.items()},
            p95_tpot={n: w.p95_tpot_seconds for n, w in classes.items()},
            validity={
                n: _validity(w.tool_call_validity, w.structured_output_validity)
                for n, w in classes.items()
            },
        )


@dataclass(frozen=True)
class Tick:
    """What the guard saw and did at one evaluation, for the timeline."""

    t: float
    serving: Setting
    settled: bool
    kill_switch: str
    observed_rates: dict[str, float | None]
    observed_tpot: dict[str, float | None]
    observed_validity: dict[str, float | None]
    speedup: float | None
    threshold: float
    fleet: Seen | None = None
    """The fleet's replicas alone (the observed_* fields are what the guard judged: a trial's
    canary once it is judged)."""
    canary: Seen | None = None
    """A trial's or a canary rollout's canary pods, when any served in the window."""
    plain: Seen | None = None
    """What the gateways sent the plain pool in the window (`Observation.plain`: its series
    carry pool="plain", apart from the fleet's), when they routed any class there."""
    past_deadline: tuple[str, ...] = ()
    """Judgements still pending a tick after their deadline (`guard.evidence.past_deadline`):
    none, as the guard promises."""


@dataclass
class GuardedRun:
    serving: list[Setting] = field(default_factory=list)
    slices: list[dict[str, ClassSlice]] = field(default_factory=list)
    """What the fleet's replicas served, per slice."""
    canary: list[dict[str, ClassSlice] | None] = field(default_factory=list)
    """What a trial's canary served, per slice (None: no canary took traffic)."""
    rollout: list[tuple[Setting, dict[str, ClassSlice]] | None] = field(default_factory=list)
    """What a canary rollout's pods served, per slice, and their setting."""
    plain: list[dict[str, ClassSlice] | None] = field(default_factory=list)
    """What the plain pool served, per slice (None: no class routed to a ready pod)."""
    pools: list[PlainPool | None] = field(default_factory=list)
    """The plain pool and the classes routed to it, per slice."""
    requests: list[dict[str, int]] = field(default_factory=list)
    """Requests per revision (engine-config hash), per slice."""
    ticks: list[Tick] = field(default_factory=list)
    decisions: list[dict[str, Any]] = field(default_factory=list)
    goodput: Goodput = Goodput()


def replay_guarded(
    world: World, draws: list[dict[str, ClassDraw]], base: Timebase, clock: Clock, spread: float
) -> GuardedRun:
    run = GuardedRun()
    start = world.changes[0].specmodel
    fleet = Fleet(serving=initial_setting(start, clock.at(0)))
    before = clock.at(-RUNNING_BEFORE)
    operator = Operator.start(start, fleet, before)
    # a plain pool the spec asks for from the start is ready, and routed, at the first slice
    operator, fleet = _follow(operator, fleet, -RUNNING_BEFORE, before, base.rollout_seconds)
    changes = list(world.changes[1:])
    counted = dict.fromkeys(world.scenario.classes, 0)
    """Requests per class before the current slice: the canary takes every n-th of them."""
    for i in range(base.count + 1):
        t, now = base.time(i), clock.at(base.time(i))
        advanced = fleet.advance(t)
        if advanced != fleet:  # pods got ready: the watch event makes a reconcile
            operator = operator.reconciled(advanced, now)
            operator, fleet = _follow(operator, advanced, t, now, base.rollout_seconds)
        if i and i % base.tick_slices == 0:
            operator, fleet = _tick(world, run, operator, fleet, base, clock, i)
        while changes and base.index(changes[0].t) <= i:
            operator = operator.with_spec(changes.pop(0).specmodel, fleet, now)
            operator, fleet = _follow(operator, fleet, t, now, base.rollout_seconds)
        if i < base.count:
            served = serve(world, fleet, t, draws[i], counted, spread)
            run.serving.append(fleet.serving)
            run.slices.append(served.fleet)
            run.canary.append(served.canary)
            run.rollout.append(served.rollout)
            run.plain.append(served.plain)
            run.pools.append(fleet.plain)
            run.requests.append(served.requests)
            run.goodput = run.goodput.plus(served, base.slice_seconds)
            _count(counted, draws[i])
    return run


@dataclass(frozen=True)
class Served:
    """One slice: what the pods serving the fleet's setting, those a rollout has moved to the
    pending one, a trial's canary, a canary rollout's pods and the plain pool served."""

    fleet: dict[str, ClassSlice]
    moved: dict[str, ClassSlice] | None
    canary: dict[str, ClassSlice] | None
    conditions: Conditions
    """The fleet's, per pod."""
    violating: bool
    """A class with traffic was served below its quality SLO by the fleet's or a canary
    rollout's pods."""
    rollout: tuple[Setting, dict[str, ClassSlice]] | None = None
    requests: dict[str, int] = field(default_factory=dict)
    """Requests per revision (engine-config hash)."""
    plain: dict[str, ClassSlice] | None = None
    gpus: int = 0
    """GPUs held over the slice."""

    @property
    def total(self) -> dict[str, ClassSlice]:
        parts = [p for p in (self.moved, self.canary, self.plain) if p is not None]
        if self.rollout is not None:
            parts.append(self.rollout[1])
        return {name: sum((p[name] for p in parts), part) for name, part in self.fleet.items()}


def serve(
    world: World,
    fleet: Fleet,
    t: float,
    draws: dict[str, ClassDraw],
    counted: dict[str, int],
    spread: float,
) -> Served:
    """The gateways send the plain pool's ready pods the requests of the classes routed to it;
    the rest go round robin over the fleet's Ready pods: the first `moved` run the pending
    setting, the last of the replicas a canary rollout's step (when its pods are ready), the
    rest the serving one, and a trial's canary, one more pod behind the Service, takes every
    (replicas + 1)-th request. Every pod runs at the load it has without the canary: the
    baselines have no extra pod, so the guarded run gets no credit for the canary's capacity
    (it would lower every pod's load by a third at two replicas)."""
    specmodel = world.specmodel_at(t)
    replicas = specmodel.spec.pod.replicas
    moved, canary = fleet.moved(t), fleet.canary_serving
    step = fleet.rollout_canary
    stepped = min(step.serving, replicas) if step else 0
    fleet_pods = replicas - stepped
    moved = min(moved, fleet_pods)
    pods = replicas + (canary is not None)
    pool = fleet.plain
    plain = {
        n: replace(d, requests=_part(counted[n], d.requests, pool.share(n) if pool else 0.0))
        for n, d in draws.items()
    }
    left = {n: d.requests - plain[n].requests for n, d in draws.items()}
    load = fleet_load(pool)

    def on(setting: Setting, first: int, last: int) -> tuple[dict[str, ClassSlice], Conditions]:
        conditions = world.conditions(t, setting, load)
        share = {
            n: replace(d, requests=_round_robin(counted[n], left[n], pods, first, last))
            for n, d in draws.items()
        }
        return realize_all(conditions, share, spread), conditions

    served, conditions = on(fleet.serving, moved, fleet_pods)
    requests = _requests({}, fleet.serving, served)
    violating = _violating(conditions)
    on_moved = on_rollout = on_plain = None
    if fleet.pending is not None and moved:
        on_moved, moved_conditions = on(fleet.pending, 0, moved)
        violating |= _violating(moved_conditions)
        requests = _requests(requests, fleet.pending, on_moved)
    if step is not None and stepped:
        rolled, rollout_conditions = on(step.setting, fleet_pods, replicas)
        violating |= _violating(rollout_conditions)
        on_rollout, requests = (step.setting, rolled), _requests(requests, step.setting, rolled)
    on_canary = on(canary, replicas, pods)[0] if canary else None
    if canary is not None and on_canary is not None:
        requests = _requests(requests, canary, on_canary)
    if pool is not None and pool.routed:
        setting = Setting(fleet.serving.config, False)
        plain_conditions = world.conditions(t, setting, pool.load(draws))
        on_plain = realize_all(plain_conditions, plain, spread)
        violating |= _violating(plain_conditions)
        requests = _requests(requests, setting, on_plain)
    gpus = gpus_per_replica(specmodel) * fleet.pods(replicas)
    return Served(
        served, on_moved, on_canary, conditions, violating, on_rollout, requests, on_plain, gpus
    )


def _part(counted: int, requests: int, share: float) -> int:
    """Of `requests` after the first `counted`, how many a `share` of them, evenly spread,
    takes."""
    return math.floor((counted + requests) * share + 1e-9) - math.floor(counted * share + 1e-9)


def _requests(
    counts: dict[str, int], setting: Setting, served: dict[str, ClassSlice]
) -> dict[str, int]:
    added = sum(part.requests for part in served.values())
    return {**counts, setting.config: counts.get(setting.config, 0) + added}


def _round_robin(counted: int, requests: int, pods: int, first: int, last: int) -> int:
    """Of `requests` after the first `counted`, how many round robin over `pods` sends to pods
    `first` to `last - 1`."""

    def before(n: int) -> int:
        return n // pods * (last - first) + min(max(n % pods - first, 0), last - first)

    return before(counted + requests) - before(counted)


def _violating(conditions: Conditions) -> bool:
    return any(not c.meets_slo and c.rate > 0 for c in conditions.classes)


def realize_all(
    conditions: Conditions, draws: dict[str, ClassDraw], spread: float
) -> dict[str, ClassSlice]:
    return {c.name: realize(conditions, c, draws[c.name], spread) for c in conditions.classes}


def _tick(
    world: World,
    run: GuardedRun,
    operator: Operator,
    fleet: Fleet,
    base: Timebase,
    clock: Clock,
    i: int,
) -> tuple[Operator, Fleet]:
    t, now = base.time(i), clock.at(base.time(i))
    observation = observe(world, run, i, fleet, base, now)
    target = _rollback_target(operator, operator.plan.active.number)
    operator, the_step = operator.ticked(observation, fleet, now)
    situation, decision = the_step.situation, the_step.decision
    assert situation is not None and decision is not None  # a guard tick always judges
    tick = _record(t, fleet, observation, decision, situation.policy.guard)
    late = past_deadline(operator.status, now, base.tick_slices * base.slice_seconds)
    plain = replace(observation, speculation=False, classes=observation.plain)
    seen = Seen.of(plain) if observation.plain else None
    run.ticks.append(replace(tick, past_deadline=tuple(late), plain=seen))
    context = {
        "revision": situation.revision.number,
        "speculation": fleet.serving.speculation,
        "rollbackTarget": target,
    }
    run.decisions += [_decision(t, now, action, context) for action in decision.actions]
    return _follow(operator, fleet, t, now, base.rollout_seconds)


def _follow(
    operator: Operator, fleet: Fleet, t: float, now: datetime, rollout_seconds: float
) -> tuple[Operator, Fleet]:
    """The operator applies its plan; if that changes what runs, a rollout starts (or a canary,
    one pod, starts or goes; or the plain pool grows, shrinks or routes other classes) and the
    watch event that follows shows it."""
    replicas = operator.specmodel.spec.pod.replicas
    moved = fleet.request(operator.target, t, rollout_seconds, replicas)
    moved = moved.request_canary(operator.canary, t, rollout_seconds, replicas)
    moved = moved.request_rollout_canary(operator.rollout_canary, t, rollout_seconds, replicas)
    moved = moved.request_plain(operator.pools.plain, t, rollout_seconds, replicas)
    if moved != fleet:
        operator = operator.reconciled(moved, now)
    return operator, moved


def _rollback_target(operator: Operator, active: int) -> int | None:
    """The revision a rollback would serve at this decision (`tick.plan.rollback_target`;
    None: there is none, as while the first revision is the only one)."""
    target = rollback_target(operator.status.revisions, active)
    return target.number if target else None


def _decision(t: float, now: datetime, action: Action, context: dict[str, Any]) -> dict[str, Any]:
    """One line of decisions.json."""
    return {
        "t": t,
        "time": now.isoformat(),
        "action": action.action,
        "reason": action.reason,
        "message": action.message,
        "evidence": action.evidence,
        "dryRun": action.dry_run,
        **context,
    }


def observe(
    world: World, run: GuardedRun, end: int, fleet: Fleet, base: Timebase, now: datetime
) -> Observation:
    """The last window as telemetry reports it: only slices the current setting served, and
    beside them a canary's (its series are new: only the slices it served) or a canary
    rollout's (the slices its revision served), and what the gateways sent the plain pool.
    Prometheus reports nothing it did not scrape: blind while it is down, and back, only the
    slices since."""
    start = _scraped(world, end, base)
    if start is None:
        blind = _window(world, [], fleet.serving, base, now)
        return replace(blind, classes={}, blind="Prometheus unreachable")
    first = max(start, base.index(fleet.switched_at))
    observation = _window(world, run.slices[first:end], fleet.serving, base, now)
    observation = replace(observation, plain=_plain(world, run, first, end))
    step = fleet.rollout_canary
    if step is not None:
        rolled = [r[1] for r in run.rollout[start:end] if r and r[0] == step.setting]
        canary = _window(world, rolled, step.setting, base, now) if rolled else None
        return replace(observation, canary=canary)
    if fleet.canary is None or not fleet.canary.ready:
        return observation
    first = max(start, base.index(fleet.canary.ready_at))
    served = [s for s in run.canary[first:end] if s is not None]
    canary = _window(world, served, fleet.canary.setting, base, now)
    return replace(observation, canary=canary if served else None)


def _scraped(world: World, end: int, base: Timebase) -> int | None:
    """The first slice of the window up to `end` that Prometheus scraped (None: it is down, or
    has scraped nothing since it came back)."""
    scraped = world.scenario.prometheus_since(base.time(end))
    if scraped is None or base.index(scraped) >= end:
        return None
    return max(end - base.window_slices, base.index(scraped))


def _plain(world: World, run: GuardedRun, first: int, end: int) -> dict[str, ClassWindow]:
    """What the gateways sent the plain pool, per class they routed there in the window, as
    their pool="plain" series report it: labelled with the fleet's revision and speculation, so
    over the slices the current setting served, as the fleet's own."""
    routed = {n for pool in run.pools[first:end] if pool for n in pool.routed}
    served = [s for s in run.plain[first:end] if s is not None]
    return _windows(world, served, False, [n for n in world.scenario.classes if n in routed])


def _window(
    world: World,
    slices: list[dict[str, ClassSlice]],
    setting: Setting,
    base: Timebase,
    now: datetime,
) -> Observation:
    return Observation(
        at=now,
        window_seconds=base.window_slices * base.slice_seconds,
        revision=world.revisions[setting.config].number,
        speculation=setting.speculation,
        classes=_windows(world, slices, setting.speculation, list(world.scenario.classes)),
    )


def _windows(
    world: World, slices: list[dict[str, ClassSlice]], speculation: bool, names: list[str]
) -> dict[str, ClassWindow]:
    """Each named class's counters summed over the slices."""
    profiles = world.scenario.classes
    return {
        n: window([s[n] for s in slices], speculation, profiles[n].tool_call_rate > 0)
        for n in names
    }


def _record(
    t: float, fleet: Fleet, observation: Observation, decision: Decision, guard: GuardSpec
) -> Tick:
    """What the guard judged: a trial's canary, once it is judged, else the fleet; and the
    fleet and its canary apart."""
    fleet_seen = observation
    observation = decision.observation or observation
    tokens = {n: w.output_tokens or 0.0 for n, w in observation.classes.items()}
    speedups = {c.name: c.expected_speedup for c in decision.classes if c.expected_speedup}
    trial = decision.kill_switch.trial
    return Tick(
        t=t,
        serving=fleet.serving,
        settled=fleet.settled,
        kill_switch=str(decision.kill_switch.state),
        observed_rates={n: w.acceptance_rate for n, w in observation.classes.items()},
        observed_tpot={n: w.mean_tpot_seconds for n, w in observation.classes.items()},
        observed_validity={
            n: _validity(w.tool_call_validity, w.structured_output_validity)
            for n, w in observation.classes.items()
        },
        speedup=weighted({n: s for n, s in speedups.items() if s is not None}, tokens),
        threshold=guard.min_speedup + (guard.release_margin if trial else 0.0),
        fleet=Seen.of(fleet_seen),
        canary=Seen.of(fleet_seen.canary) if fleet_seen.canary is not None else None,
    )


def _validity(tool_calls: float | None, structured: float | None) -> float | None:
    values = [v for v in (tool_calls, structured) if v is not None]
    return min(values) if values else None


def replay_fixed(
    world: World,
    draws: list[dict[str, ClassDraw]],
    base: Timebase,
    choose: Policy,
    spread: float,
    rollout_seconds: float | None = None,
    pools: list[PlainPool | None] | None = None,
) -> Goodput:
    """Goodput of a fixed policy: `choose(t, load)` is the setting wanted at t for what the
    fleet serves, rolled out in `rollout_seconds` (None: switched at once), beside `pools`, the
    plain pool per slice (a guarded run's: the policy is judged on the same pods and routing)."""
    goodput = Goodput()
    pools = pools or [None] * base.count
    fleet = Fleet(serving=choose(0.0, fleet_load(pools[0])))
    counted = dict.fromkeys(world.scenario.classes, 0)
    for i in range(base.count):
        t, pool = base.time(i), pools[i]
        wanted = choose(t, fleet_load(pool))
        if rollout_seconds is None:
            fleet = Fleet(serving=wanted, plain=pool)
        else:
            replicas = world.specmodel_at(t).spec.pod.replicas
            fleet = fleet.request(wanted, t, rollout_seconds, replicas).advance(t)
            fleet = replace(fleet, plain=pool)
        served = serve(world, fleet, t, draws[i], counted, spread)
        goodput = goodput.plus(served, base.slice_seconds)
        _count(counted, draws[i])
    return goodput


def _count(counted: dict[str, int], draws: dict[str, ClassDraw]) -> None:
    for name, draw in draws.items():
        counted[name] += draw.requests
