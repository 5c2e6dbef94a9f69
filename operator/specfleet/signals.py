"""The per-class quality signals, as data: one row each says what the signal counts in a window,
which way is worse, the SLO that bounds it, how the guard's judgements compare it, and the words
and labels people read it by. A signal's name is written here and nowhere else.

Its judges iterate `QUALITY`:

- a canary against its control on the same window (`guard.analysis`), and an experiment's arm
  against the baseline arm as a canary (`experiment.verdict`);
- a revision on probation against the last good revision (`guard.verdict`);
- each class against its SLO (`guard.classes`), for the signals an SLO bounds.

How each compares is the row's `rule`: `Rule.SHARE` for a share judged with Wilson bounds,
`Rule.MULTIPLE` for a rate of rare failures that must grow several-fold. A signal whose lower
values are better (a rate of bad answers) is judged as the share of answers it does not count,
and told as its own rate: a Wilson interval is symmetric under the complement.

The names of the other per-class signals (speculation's, latency's) are here too, so that no
judge, report or picture writes one of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum

from specfleet.telemetry.model import ClassWindow

ACCEPTANCE_RATE = "acceptanceRate"
SPEEDUP = "speedup"
P95_TTFT = "p95TtftSeconds"
P95_TPOT = "p95TpotSeconds"
MEAN_TPOT = "meanTpotSeconds"
GREEDY_AGREEMENT = "greedyAgreement"
"""An experiment's alone: an arm's greedy answers against the baseline arm's."""
LABELS = {
    ACCEPTANCE_RATE: "acceptance",
    SPEEDUP: "speedup",
    P95_TTFT: "p95 TTFT",
    P95_TPOT: "p95 TPOT",
    MEAN_TPOT: "mean TPOT",
    GREEDY_AGREEMENT: "exact agreement with the baseline on greedy requests",
}
"""The words of the signals outside `QUALITY`, in pictures and reports alike."""


class Rule(Enum):
    SHARE = "share"
    """Worse than the other side's 95% bound by `guard.policy.QUALITY_MARGIN` (the canary's
    bound, the probation's point value), or past the SLO where the other side is within it."""
    MULTIPLE = "multiple"
    """Rare failures: the rate's 95% lower bound over twice the other side's rate and at least
    `guard.policy.MIN_ERROR_RATE_BREACH`, once `guard.policy.MIN_ERRORS` of them happened."""


@dataclass(frozen=True)
class Signal:
    """One per-class quality signal."""

    name: str
    """Its name in status (`classes[].signals`), Events, alerts (`signal` label), evidence and
    an experiment's exclusions."""
    count: Callable[[ClassWindow], float | None]
    """What its value counts, in its own sense (valid calls for a validity, cut-off answers for
    a truncation rate); None: no data."""
    samples: Callable[[ClassWindow], float]
    """What the count is a share of."""
    higher_is_better: bool
    rule: Rule
    slo_field: str | None
    """The field of the class's SLO (`api.spec.ClassSlo`) that bounds it: a floor, or a ceiling
    where lower is better. None: no SLO bounds it (it is judged against the other side alone)."""
    baseline_field: str
    """The field of the last good revision's `api.status.QualityBaseline` that keeps its value:
    one share for the fleet, or a share per class."""
    arm_field: str
    """Its column of an experiment's table (`api.verdict.ArmRow`)."""
    plot: str
    """Its label on the replay's timeline (`simulate.plot`)."""
    report: str
    """Its words in an experiment's report (`experiment.report`): exclusions and SLOs."""
    column: str
    """Its column's head in the report's tables."""
    dashboard: str
    """The title of its Grafana panel (charts/specfleet/files/grafana-dashboard.json)."""
    unjudged: Callable[[ClassWindow], Mapping[str, float]] | None = None
    """Checks the gateway left out of the count, by reason."""
    unjudged_key: str = ""
    """The evidence key of those."""

    def last_good(self, baseline: object, klass: str) -> float | None:
        """The last good revision's value for `klass`."""
        kept = getattr(baseline, self.baseline_field)
        share = kept.get(klass) if isinstance(kept, dict) else kept
        return None if share is None else float(share)

    def value(self, window: ClassWindow) -> float | None:
        """count / samples; None without samples or without data."""
        samples = self.samples(window)
        count = self.count(window)
        if not samples or count is None:
            return None
        return count / samples

    def bad(self, window: ClassWindow) -> float:
        """The answers (or requests) it finds bad: none are an experiment's accepted answers."""
        count = self.count(window) or 0.0
        return self.samples(window) - count if self.higher_is_better else count

    def good(self, value: float) -> float:
        """A value as the share that is good: the value itself, or its complement."""
        return value if self.higher_is_better else 1.0 - value

    def slo(self, slo: object) -> float | None:
        """The class's bound in its SLO (an `api.spec.ClassSlo`: the table sits below the API,
        so it names the field, not the type); None: unbounded."""
        if self.slo_field is None:
            return None
        bound: float | None = getattr(slo, self.slo_field)
        return bound

    def floor(self, slo: object) -> float | None:
        """The SLO as a floor of the good share."""
        bound = self.slo(slo)
        return None if bound is None else self.good(bound)

    @property
    def worse(self) -> str:
        """The side of its limit a breach is on."""
        return "<" if self.higher_is_better else ">"


def _share_of(part: float | None) -> float:
    """A validity's count where the window has its whole: a missing part is none."""
    return part or 0.0


TOOL_CALL_VALIDITY = Signal(
    name="toolCallValidity",
    count=lambda w: _share_of(w.tool_calls_valid),
    samples=lambda w: w.tool_calls_judged,
    higher_is_better=True,
    rule=Rule.SHARE,
    slo_field="min_tool_call_validity",
    baseline_field="tool_call_validity",
    arm_field="tool_call_validity",
    plot="tool-call validity",
    report="tool-call validity",
    column="tool calls valid",
    dashboard="Tool-call validity per class",
    unjudged=lambda w: w.tool_calls_unjudged,
    unjudged_key="toolCallsUnjudged",
)
STRUCTURED_OUTPUT_VALIDITY = Signal(
    name="structuredOutputValidity",
    count=lambda w: _share_of(w.structured_valid),
    samples=lambda w: w.structured_judged,
    higher_is_better=True,
    rule=Rule.SHARE,
    slo_field="min_structured_output_validity",
    baseline_field="structured_output_validity",
    arm_field="structured_output_validity",
    plot="JSON validity",
    report="JSON validity",
    column="JSON valid",
    dashboard="Tool-call validity per class",
    unjudged=lambda w: w.structured_unjudged,
    unjudged_key="structuredOutputsUnjudged",
)
TRUNCATION_RATE = Signal(
    name="truncationRate",
    count=lambda w: _share_of(w.truncated),
    samples=lambda w: w.choices or 0.0,
    higher_is_better=False,
    rule=Rule.SHARE,
    slo_field="max_truncation_rate",
    baseline_field="truncation_rate",
    arm_field="truncation_rate",
    plot="truncation",
    report="truncated answers",
    column="truncated",
    dashboard="Truncation per class (answers cut at their token limit)",
)
EMPTY_ANSWER_RATE = Signal(
    name="emptyAnswerRate",
    count=lambda w: w.empty_answers,
    samples=lambda w: w.choices or 0.0,
    higher_is_better=False,
    rule=Rule.SHARE,
    slo_field="max_empty_answer_rate",
    baseline_field="empty_answer_rate",
    arm_field="empty_answer_rate",
    plot="empty answers",
    report="empty answers",
    column="empty",
    dashboard="Empty answers per class (no content and no tool call)",
)
ERROR_RATE = Signal(
    name="errorRate",
    count=lambda w: w.errors,
    samples=lambda w: w.requests or 0.0,
    higher_is_better=False,
    rule=Rule.MULTIPLE,
    slo_field=None,
    baseline_field="error_rate",
    arm_field="error_rate",
    plot="errors",
    report="errors",
    column="errors",
    dashboard="Requests per class and outcome",
)
QUALITY = (
    TOOL_CALL_VALIDITY,
    STRUCTURED_OUTPUT_VALIDITY,
    TRUNCATION_RATE,
    EMPTY_ANSWER_RATE,
    ERROR_RATE,
)
"""In the order their readings and breaches are told."""
CLASS_SIGNALS = (
    SPEEDUP,
    ACCEPTANCE_RATE,
    P95_TTFT,
    P95_TPOT,
    *(s.name for s in QUALITY if s.slo_field),
)
"""What a class can breach (`guard.classes`): speculation not paying, or one of its SLOs."""
