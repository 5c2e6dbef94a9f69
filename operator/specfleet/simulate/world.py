"""The simulated world: the scenario, the revisions its rollouts create, and the conditions a
group of pods serves under for a setting (revision, speculation on or off) and a load (its share
of each class's requests over its pods) at a time.

A rollout whose spec patch changes the engine config creates a revision; its `effects` belong
to that revision and apply only while the fleet serves it (a rollback ends them). A rollout
that leaves the engine config alone (an empty or guard-only patch) changes the environment:
its effects apply to every revision from its time on, and a rollback cannot undo them.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field, replace
from functools import cached_property

from specfleet.api import SpecModel
from specfleet.api.spec import ClassSlo
from specfleet.scenario import Effects, Scenario
from specfleet.scenario.drafting import PROMPT_LOOKUP
from specfleet.scenario.timing import TimingModel
from specfleet.simulate import physics


@dataclass(frozen=True)
class Setting:
    """What the fleet runs: a revision (by engine-config hash) with speculation on or off."""

    config: str
    speculation: bool


@dataclass(frozen=True)
class Load:
    """What a group of pods serves: `shares` of the named classes' requests (a class not named:
    all of them), spread over `pods` pods (None: the spec's replicas)."""

    shares: tuple[tuple[str, float], ...] = ()
    pods: int | None = None

    @classmethod
    def of(cls, shares: dict[str, float], pods: int | None = None) -> Load:
        return cls(tuple((n, s) for n, s in shares.items() if s != 1.0), pods)

    def share(self, name: str) -> float:
        return dict(self.shares).get(name, 1.0)


WHOLE = Load()
"""The fleet's replicas serving every request."""


@dataclass(frozen=True)
class Revision:
    config: str
    number: int
    """In order of first appearance, as `tick.plan` numbers them."""
    since: float
    """Scenario time the spec first asked for it."""
    k: int
    method: str | None
    max_batch: int
    effects: Effects


@dataclass(frozen=True)
class SpecChange:
    """The SpecModel as Git declares it from time `t` on."""

    t: float
    specmodel: SpecModel
    config: str


@dataclass(frozen=True)
class ClassConditions:
    name: str
    rate: float
    """Requests per second the pods serve."""
    alpha: float
    decay: float
    output_tokens: int
    tool_call_rate: float
    structured: bool
    validity: float
    error_rate: float
    p95_ttft_seconds: float
    mean_ttft_seconds: float = 0.0
    meets_slo: bool = True
    """The served validity meets the class's quality SLOs (minToolCallValidity for a class
    that calls tools, minStructuredOutputValidity for one that answers JSON), and its
    truncation rate its maxTruncationRate."""
    truncation_rate: float = 0.0
    """The share of answers cut off at max_tokens."""
    match_rate: float | None = None
    """A prompt-lookup drafter's share of decode steps that find a match and draft (the
    scenario's draft_match_rate); None: k drafts on every step."""
    acceptance_floor: float | None = None
    """A critical class's minAcceptanceRate: speculation that serves it with a lower
    acceptance rate (as engines report it) breaks its SLO (None: no such floor)."""


@dataclass(frozen=True)
class Conditions:
    """The fleet at one moment under one setting, in expectation."""

    classes: tuple[ClassConditions, ...]
    k: int
    """Draft tokens per step; 0 with speculation off."""
    step_seconds: float
    """One decode step at the current load, the revision's tpot_factor included."""
    batch: float
    drafts_per_step: float = 0.0
    """δ over the batch: draft tokens per decode step and request."""


@dataclass(frozen=True)
class World:
    scenario: Scenario
    timing: TimingModel
    changes: tuple[SpecChange, ...]
    revisions: dict[str, Revision]
    environment: tuple[tuple[float, Effects], ...] = ()
    structured: frozenset[str] = frozenset()
    """SpecModel classes that ask for JSON (`match.jsonResponse: true`): every answer is a
    structured output."""
    notes: tuple[str, ...] = ()
    _cache: dict[tuple[float, Setting, Load], Conditions] = field(
        default_factory=dict, compare=False
    )

    def change_at(self, t: float) -> SpecChange:
        return [c for c in self.changes if c.t <= t][-1]

    def specmodel_at(self, t: float) -> SpecModel:
        return self.change_at(t).specmodel

    def by_number(self, number: int) -> Revision:
        return next(r for r in self.revisions.values() if r.number == number)

    def effects(self, t: float, config: str) -> Effects:
        effects = Effects()
        for since, change in self.environment:
            if since <= t:
                effects = effects.merged(change)
        return effects.merged(self.revisions[config].effects)

    def conditions(self, t: float, setting: Setting, load: Load = WHOLE) -> Conditions:
        key = (self._segment(t), setting, load)
        if key not in self._cache:
            self._cache[key] = self._conditions(t, setting, load)
        return self._cache[key]

    def _segment(self, t: float) -> float:
        """The latest time at or before t at which anything in the world changes."""
        index = bisect.bisect_right(self._breakpoints, t) - 1
        return self._breakpoints[index] if index >= 0 else 0.0

    @cached_property
    def _breakpoints(self) -> list[float]:
        points = {c.t for c in self.changes} | {s for s, _ in self.environment}
        points |= {p[0] for p in self.scenario.traffic_rps.points}
        for profile in self.scenario.classes.values():
            points |= {p[0] for p in profile.acceptance.points + profile.output_tokens.points}
        return sorted(points)

    def _conditions(self, t: float, setting: Setting, load: Load) -> Conditions:
        revision = self.revisions[setting.config]
        effects = self.effects(t, setting.config)
        k = revision.k if setting.speculation else 0
        cost = self.timing.cost(revision.method) if k else 0.0
        overhead = self.timing.overhead(revision.method) if k else 0.0
        lookup = revision.method in PROMPT_LOOKUP
        specmodel = self.specmodel_at(t)
        slos = {c.name: c.slo for c in specmodel.spec.classes}
        critical = {c.name for c in specmodel.spec.classes if c.critical}
        classes = [
            self._class(name, t, effects, slos.get(name), lookup, name in critical, load)
            for name in self.scenario.classes
        ]
        replicas = max(specmodel.spec.pod.replicas if load.pods is None else load.pods, 1)
        steps = [
            c.rate * c.output_tokens / physics.tokens_per_step(c.alpha, k, c.decay, c.match_rate)
            for c in classes
        ]
        drafts = [physics.drafts_per_step(k, c.match_rate) for c in classes]
        drafting = _weighted_mean(drafts, steps)
        demand = sum(steps) * effects.tpot_factor / replicas
        max_batch = revision.max_batch
        batch = physics.concurrency(self.timing, demand, drafting, cost, max_batch, overhead)
        step = physics.step_seconds(self.timing, batch, drafting, cost, overhead)
        step *= effects.tpot_factor
        prompts = {n: p.prompt_tokens for n, p in self.scenario.classes.items()}
        ttft = {
            n: [
                physics.ttft_seconds(self.timing, prompts[n], step, effects.ttft_factor, waiting)
                for waiting in (physics.MEAN_WAITING_STEPS, physics.P95_WAITING_STEPS)
            ]
            for n in prompts
        }
        with_ttft = tuple(_with_ttft(c, *ttft[c.name]) for c in classes)
        return Conditions(with_ttft, k, step, batch, drafting)

    def _class(
        self,
        name: str,
        t: float,
        effects: Effects,
        slo: ClassSlo | None,
        lookup: bool,
        critical: bool,
        load: Load,
    ) -> ClassConditions:
        profile = self.scenario.classes[name]
        validity = effects.tool_call_validity
        validity = profile.tool_call_validity if validity is None else validity
        floors = [
            slo.min_tool_call_validity if slo and profile.tool_call_rate > 0 else None,
            slo.min_structured_output_validity if slo and name in self.structured else None,
        ]
        truncation = effects.truncation_rate.get(name, profile.truncation_rate)
        ceiling = slo.max_truncation_rate if slo else None
        return ClassConditions(
            name=name,
            rate=self.scenario.rps(t) * profile.share * load.share(name),
            alpha=min(self.scenario.acceptance(name, t) * effects.acceptance_factor, 1.0),
            decay=profile.position_decay,
            output_tokens=self.scenario.output_tokens(name, t),
            tool_call_rate=profile.tool_call_rate,
            structured=name in self.structured,
            validity=validity,
            error_rate=effects.error_rate,
            p95_ttft_seconds=0.0,
            meets_slo=all(validity >= f for f in floors if f is not None)
            and (ceiling is None or truncation <= ceiling),
            match_rate=profile.draft_match_rate if lookup else None,
            truncation_rate=truncation,
            acceptance_floor=slo.min_acceptance_rate if slo and critical else None,
        )


def _weighted_mean(values: list[float], weights: list[float]) -> float:
    total = sum(weights)
    return sum(v * w for v, w in zip(values, weights, strict=True)) / total if total else 0.0


def _with_ttft(conditions: ClassConditions, mean: float, p95: float) -> ClassConditions:
    return replace(conditions, mean_ttft_seconds=mean, p95_ttft_seconds=p95)
