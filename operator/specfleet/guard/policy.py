"""The guard's settings for one SpecModel, read from its spec once per evaluation."""

from __future__ import annotations

from dataclasses import dataclass, field

from specfleet.api import SpecModel
from specfleet.api.spec import ClassSlo, GuardSpec, RolloutSpec, SpeculativeSpec

QUALITY_MARGIN = 0.02
"""A revision on probation may fall this far (absolute) below the last good one's validity."""
LATENCY_MARGIN = 1.5
"""A revision on probation may be this many times slower (p95) than the last good one."""
MIN_ERROR_RATE_BREACH = 0.01
MIN_ERRORS = 5
"""Fewer upstream errors in a window are never a quality breach, whatever the rate."""
QUIET_HORIZON_SECONDS = 3600
"""A quiet fleet's evidence (`guard.quiet`) undecided this long starts over: a change is judged
on at most this much past."""
TPOT_MEMORY_SECONDS = 3600
"""TPOT measured without speculation stands in for the model this long, then expires."""


@dataclass(frozen=True)
class ClassPolicy:
    name: str
    slo: ClassSlo
    critical: bool


@dataclass(frozen=True)
class Policy:
    guard: GuardSpec
    classes: list[ClassPolicy]
    k: int
    """Draft tokens per verify step (0 when no speculation is configured)."""
    draft_cost: float
    step_overhead: float
    """o: what speculation being on costs every decode step (`guard.speedup`)."""
    per_token_compute: float
    """g: a forward over n tokens costs 1 + g·n one-token forwards (the load term)."""
    replicas: int
    override: str | None
    """`annotation` or `spec` when a human or Git decides speculation; None when the guard does."""
    rollout: RolloutSpec = field(default_factory=RolloutSpec)
    """A canary step's deadline and what it does then."""
    classes_off: frozenset[str] = frozenset()
    """The classes a human's per-class override serves without speculation
    (`SpecModel.classes_off`): the fleet's speculation is judged without them."""

    @property
    def band(self) -> float:
        """The hysteresis band's half-width relative to minSpeedup (releaseMargin / minSpeedup):
        a window whose bound lies this far past a threshold decides on its own."""
        return self.guard.release_margin / self.guard.min_speedup

    @classmethod
    def of(
        cls, specmodel: SpecModel, override: str | None, speculative: SpeculativeSpec | None = None
    ) -> Policy:
        """`speculative` is the active revision's, when a rollback serves an older config."""
        spec = specmodel.spec
        speculative = speculative or spec.speculative
        return cls(
            guard=spec.guard,
            classes=[ClassPolicy(c.name, c.slo or ClassSlo(), c.critical) for c in spec.classes],
            k=speculative.num_speculative_tokens if speculative else 0,
            draft_cost=speculative.effective_draft_cost() if speculative else 0.0,
            step_overhead=speculative.step_overhead if speculative else 0.0,
            per_token_compute=_per_token_compute(spec.speculative or speculative),
            replicas=spec.pod.replicas,
            override=override,
            rollout=spec.rollout,
            classes_off=frozenset(specmodel.classes_off()[0]),
        )


def _per_token_compute(speculative: SpeculativeSpec | None) -> float:
    """From the spec even when a rollback serves an older revision: revisions do not store it
    (it is the GPU's property, not the engine's config)."""
    return speculative.effective_per_token_compute() if speculative else 0.0
