"""Which of the four arms to serve, judged on the same traffic sample (pure).

An answer is *accepted* when it finished (no error, not cut off at its token limit), is valid
where validity applies (a tool call, a structured output) and met its class's latency SLOs.
An arm's cost per accepted answer is what its replica costs an hour over the accepted answers
it serves an hour at its throughput at SLO (the highest load at which every class's p95 stays
inside its SLO).

The rule: the cheapest arm per accepted answer among those whose every class meets its p95
latency SLOs and whose answers are not confidently worse than the baseline's (each quality
signal, `signals.QUALITY`, as a canary is judged against its control, `guard.analysis`; and
exact agreement with the baseline on greedy requests). `both` only when it is confidently
cheaper than each single technique still in the running; otherwise the cheaper of the rest. Too
few requests in any arm's class is inconclusive, never a recommendation.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from pydantic import Field

from specfleet.api.base import ApiModel
from specfleet.api.spec import ClassSlo
from specfleet.api.verdict import (
    NO_THROUGHPUT,
    ArmName,
    ArmRow,
    ClassTable,
    Exclusion,
    ExperimentVerdict,
    Latency,
    Outcome,
)
from specfleet.guard.analysis import Breach, Sides, quality_breaches
from specfleet.guard.policy import QUALITY_MARGIN
from specfleet.guard.speedup import wilson_interval
from specfleet.signals import GREEDY_AGREEMENT, P95_TPOT, P95_TTFT, QUALITY, Signal
from specfleet.telemetry.model import ClassWindow, GreedyComparison

SECONDS_PER_HOUR = 3600.0
AGREEMENT_FLOOR = 1.0 - QUALITY_MARGIN
"""Greedy decoding of the baseline agrees with itself exactly: an arm may agree with it this
much less before it is confidently worse."""
OVERALL = "overall"
PER = 1000
"""Costs are told per thousand accepted answers: a single answer costs fractions of a cent."""
BOTH_MARGIN = 0.1
"""`both` must cost this much less than each single technique, bound against bound: the 95%
intervals cover only the accepted share, not the throughput (a model's, or one load test's),
and two techniques are two things to break (as speculation must pay the guard's release
margin, 10%, before it is turned back on)."""


SINGLES = (ArmName.QUANTIZED, ArmName.SPECULATIVE)


@dataclass(frozen=True)
class ClassMeasurement:
    """One arm's requests of one class on the shared sample: its window as telemetry reads it
    (whole counts, each part within its whole), its latency percentiles and its greedy answers
    compared with the baseline arm's."""

    window: ClassWindow
    ttft: Latency
    tpot: Latency
    greedy: GreedyComparison = field(default_factory=GreedyComparison)

    def __post_init__(self) -> None:
        for signal in QUALITY:
            count, samples = signal.count(self.window) or 0.0, signal.samples(self.window)
            if count > samples:
                raise ValueError(f"{signal.name}: {count:g} counted of {samples:g}")
        if self.greedy.exact_matches > self.greedy.compared:
            raise ValueError(
                f"{GREEDY_AGREEMENT}: {self.greedy.exact_matches:g} matched of "
                f"{self.greedy.compared:g} compared"
            )

    @property
    def requests(self) -> int:
        return round(self.window.requests or 0.0)


class ArmMeasurement(ApiModel):
    arm: ArmName
    gpus_per_replica: int = Field(ge=1)
    throughput_at_slo: float = Field(
        ge=0,
        description="Requests/s per replica of the traffic mix at the highest load at which "
        "every class's p95 TTFT and TPOT stay inside their SLOs.",
    )
    classes: dict[str, ClassMeasurement]
    kv_cache_peak: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="The highest KV-cache usage of the arm's engines over the sample (vLLM's "
        "`vllm:kv_cache_usage_perc`); None where the engine exports none (TensorRT-LLM 1.2).",
    )


def within_latency_slo(latency: Latency, limit: float | None) -> float:
    """The share of requests at or under `limit`, read off the percentiles by linear
    interpolation (from 0 at 0 s). The tail past p99 is not measured: at or over p99, all."""
    if limit is None or limit >= latency.p99_seconds:
        return 1.0
    seconds = [0.0, latency.p50_seconds, latency.p95_seconds, latency.p99_seconds]
    shares = [0.0, 0.5, 0.95, 0.99]
    i = bisect.bisect_left(seconds, limit)
    fraction = (limit - seconds[i - 1]) / (seconds[i] - seconds[i - 1])
    return shares[i - 1] + (shares[i] - shares[i - 1]) * fraction


def accepted_share(measurement: ClassMeasurement, slo: ClassSlo) -> float:
    """The share of a class's requests that were accepted answers. Failed, cut-off and invalid
    answers are counted as distinct requests; of the rest, the share within both latency SLOs,
    whichever is tighter (the requests slow to start are the ones slow to decode: load)."""
    m = measurement
    if not m.requests:
        return 0.0
    bad = sum(signal.bad(m.window) for signal in QUALITY)
    finished = max(m.requests - bad, 0) / m.requests
    on_time = min(
        within_latency_slo(m.ttft, slo.max_p95_ttft_seconds),
        within_latency_slo(m.tpot, slo.max_p95_tpot_seconds),
    )
    return finished * on_time


def accepted_answers_per_hour(throughput: float, share: float) -> float:
    """Of one replica at `throughput` requests/s."""
    return throughput * SECONDS_PER_HOUR * share


def cost_per_accepted_answer(
    gpu_hour_price: float, gpus: int, throughput: float, share: float
) -> float | None:
    per_hour = accepted_answers_per_hour(throughput, share)
    return gpu_hour_price * gpus / per_hour if per_hour > 0 else None


class _Cost(NamedTuple):
    """An arm's cost per accepted answer and its 95% interval (Wilson over its requests)."""

    point: float
    low: float
    high: float


def judge(
    arms: Sequence[ArmMeasurement],
    slos: Mapping[str, ClassSlo],
    gpu_hour_price: float,
    min_samples: int,
) -> ExperimentVerdict:
    """The table per class and overall, every exclusion with its evidence, and the recommendation
    (or why there is none). `slos` are the SpecModel's classes; every arm must measure each."""
    by_name = _by_name(arms, slos)
    shares = {
        arm: {c: accepted_share(by_name[arm].classes[c], slo) for c, slo in slos.items()}
        for arm in ArmName
    }
    overall = {arm: _overall_share(by_name[arm], shares[arm]) for arm in ArmName}
    tables = [
        ClassTable(
            name=c,
            rows=[
                _row(by_name[a], [by_name[a].classes[c]], shares[a][c], gpu_hour_price)
                for a in ArmName
            ],
        )
        for c in slos
    ]
    totals = [
        _row(
            by_name[a],
            list(by_name[a].classes.values()),
            overall[a],
            gpu_hour_price,
            kv_cache_headroom=_headroom(by_name[a].kv_cache_peak),
        )
        for a in ArmName
    ]
    verdict = ExperimentVerdict(
        outcome=Outcome.INCONCLUSIVE,
        reason="",
        gpu_hour_price=gpu_hour_price,
        min_samples=min_samples,
        classes=tables,
        overall=totals,
    )
    few = _too_few(by_name, min_samples)
    if few:
        reason = f"too few requests to judge (at least {min_samples} per arm and class): "
        return verdict.model_copy(update={"reason": reason + ", ".join(few)})
    exclusions = [e for arm in ArmName for e in _exclusions(by_name, arm, slos, min_samples)]
    costs = {
        row.arm: _cost(row, gpu_hour_price, by_name[row.arm].gpus_per_replica)
        for row in totals
        if row.arm not in {e.arm for e in exclusions} and row.cost_per_accepted_answer
    }
    outcome, recommendation, reason = _recommend(costs, {e.arm for e in exclusions})
    return verdict.model_copy(
        update={
            "outcome": outcome,
            "recommendation": recommendation,
            "reason": reason,
            "exclusions": exclusions,
        }
    )


def _by_name(
    arms: Sequence[ArmMeasurement], slos: Mapping[str, ClassSlo]
) -> dict[ArmName, ArmMeasurement]:
    by_name = {ArmName(a.arm): a for a in arms}
    missing = [str(name) for name in ArmName if name not in by_name]
    if missing or len(arms) != len(ArmName):
        raise ValueError(f"arms: need each of the four arms once, missing {missing or 'none'}")
    for arm in by_name.values():
        absent = [c for c in slos if c not in arm.classes]
        if absent:
            raise ValueError(f"arms.{arm.arm}.classes: no measurement of {', '.join(absent)}")
    return by_name


def _overall_share(arm: ArmMeasurement, shares: Mapping[str, float]) -> float:
    """Accepted share over every request of the sample: classes weighted by their requests."""
    requests = {c: arm.classes[c].requests for c in shares}
    total = sum(requests.values())
    return sum(shares[c] * requests[c] for c in shares) / total if total else 0.0


def _row(
    arm: ArmMeasurement,
    classes: list[ClassMeasurement],
    share: float,
    gpu_hour_price: float,
    kv_cache_headroom: float | None = None,
) -> ArmRow:
    """`kv_cache_headroom` only overall: the KV cache is the arm's, shared by its classes."""
    requests = sum(m.requests for m in classes)
    drafting = [
        (m.window.acceptance_rate, m.requests)
        for m in classes
        if m.window.acceptance_rate is not None
    ]
    one = classes[0] if len(classes) == 1 else None
    compared = sum(m.greedy.compared for m in classes)
    agreed = sum(m.greedy.exact_matches for m in classes)
    return ArmRow(
        arm=arm.arm,
        requests=requests,
        ttft=one.ttft if one else None,
        tpot=one.tpot if one else None,
        acceptance_rate=_mean(drafting),
        **{s.arm_field: _pooled(s, [m.window for m in classes]) for s in QUALITY},
        greedy_agreement=agreed / compared if compared else None,
        throughput_at_slo=arm.throughput_at_slo,
        accepted_share=share,
        cost_per_accepted_answer=cost_per_accepted_answer(
            gpu_hour_price, arm.gpus_per_replica, arm.throughput_at_slo, share
        ),
        kv_cache_headroom=kv_cache_headroom,
    )


def _headroom(peak: float | None) -> float | None:
    return None if peak is None else 1.0 - peak


def _pooled(signal: Signal, windows: list[ClassWindow]) -> float | None:
    """Over the classes: sums of counts, not a mean of ratios; None without samples or data."""
    counts = [signal.count(w) for w in windows]
    total = sum(signal.samples(w) for w in windows)
    if not total or all(c is None for c in counts):
        return None
    return sum(c or 0.0 for c in counts) / total


def _mean(values: list[tuple[float, int]]) -> float | None:
    weight = sum(w for _, w in values)
    return sum(v * w for v, w in values) / weight if weight else None


def _too_few(by_name: Mapping[ArmName, ArmMeasurement], min_samples: int) -> list[str]:
    return [
        f"{arm.arm}/{c} n={m.requests}"
        for arm in by_name.values()
        for c, m in arm.classes.items()
        if m.requests < min_samples
    ]


def _exclusions(
    by_name: Mapping[ArmName, ArmMeasurement],
    name: ArmName,
    slos: Mapping[str, ClassSlo],
    min_samples: int,
) -> list[Exclusion]:
    arm, baseline = by_name[name], by_name[ArmName.BASELINE]
    found = []
    for c, slo in slos.items():
        measured = arm.classes[c]
        found += _latency(name, c, measured, slo)
        if name != ArmName.BASELINE:
            control = baseline.classes[c]
            # band 0: an experiment has no hysteresis, and decisiveness means nothing here
            sides = Sides(c, measured.window, control.window, slo, min_samples)
            found += [_excluded(name, b) for b in quality_breaches(sides, 0.0)]
            found += _agreement(name, c, measured, min_samples)
    if not arm.throughput_at_slo:
        found.append(
            Exclusion(
                arm=name,
                class_name=OVERALL,
                signal=NO_THROUGHPUT,
                value=0.0,
                limit=0.0,
                samples=0.0,
            )
        )
    return found


class LatencyMiss(NamedTuple):
    signal: str
    value: float
    limit: float


def latency_misses(p95_ttft: float, p95_tpot: float, slo: ClassSlo) -> list[LatencyMiss]:
    """A class's p95 TTFT and TPOT over its SLO's limits; none when it is inside them."""
    checks = [
        (P95_TTFT, p95_ttft, slo.max_p95_ttft_seconds),
        (P95_TPOT, p95_tpot, slo.max_p95_tpot_seconds),
    ]
    return [
        LatencyMiss(signal, value, limit)
        for signal, value, limit in checks
        if limit is not None and value > limit
    ]


def _latency(arm: ArmName, name: str, m: ClassMeasurement, slo: ClassSlo) -> list[Exclusion]:
    return [
        Exclusion(
            arm=arm, class_name=name, signal=signal, value=value, limit=limit, samples=m.requests
        )
        for signal, value, limit in latency_misses(m.ttft.p95_seconds, m.tpot.p95_seconds, slo)
    ]


def _excluded(arm: ArmName, breach: Breach) -> Exclusion:
    return Exclusion(
        arm=arm,
        class_name=breach.klass,
        signal=breach.signal,
        value=breach.canary,
        limit=breach.limit,
        baseline=breach.control,
        samples=breach.canary_samples,
        baseline_samples=breach.control_samples,
    )


def _agreement(arm: ArmName, name: str, m: ClassMeasurement, min_samples: int) -> list[Exclusion]:
    """Confidently under the floor: the 95% upper bound of exact matches below it."""
    agreed, compared = m.greedy.exact_matches, m.greedy.compared
    if compared < min_samples:
        return []
    _, upper = wilson_interval(agreed, compared)
    if upper >= AGREEMENT_FLOOR:
        return []
    return [
        Exclusion(
            arm=arm,
            class_name=name,
            signal=GREEDY_AGREEMENT,
            value=agreed / compared,
            limit=AGREEMENT_FLOOR,
            baseline=1.0,
            samples=compared,
        )
    ]


def _cost(row: ArmRow, gpu_hour_price: float, gpus: int) -> _Cost:
    """The interval treats accepted answers as binomial over the arm's requests."""
    low_share, high_share = wilson_interval(row.accepted_share * row.requests, row.requests)
    price = [
        cost_per_accepted_answer(gpu_hour_price, gpus, row.throughput_at_slo, share)
        for share in (high_share, low_share)
    ]
    return _Cost(
        point=row.cost_per_accepted_answer or float("inf"),
        low=price[0] or float("inf"),
        high=price[1] or float("inf"),
    )


def cost_bounds(row: ArmRow) -> tuple[float, float] | None:
    """`_cost`'s 95% interval from the row alone (the cost is inversely proportional to the
    accepted share); None without a cost."""
    cost = row.cost_per_accepted_answer
    if cost is None:
        return None
    low_share, high_share = wilson_interval(row.accepted_share * row.requests, row.requests)
    high = cost * row.accepted_share / low_share if low_share > 0 else float("inf")
    return cost * row.accepted_share / high_share, high


def _recommend(
    costs: Mapping[ArmName, _Cost], excluded: set[ArmName]
) -> tuple[Outcome, ArmName | None, str]:
    out = f" (excluded: {', '.join(sorted(excluded))})" if excluded else ""
    if not costs:
        return Outcome.NO_ARM, None, "no arm meets every class's SLOs and the baseline's quality"
    cheapest = min(costs, key=lambda arm: costs[arm].point)
    if cheapest == ArmName.BOTH:
        rivals = [arm for arm in SINGLES if arm in costs]
        unbeaten = [
            arm for arm in rivals if not _confidently_cheaper(costs[ArmName.BOTH], costs[arm])
        ]
        if not unbeaten:
            return Outcome.RECOMMENDED, cheapest, _cheapest_words(cheapest, costs) + out
        rest: dict[ArmName, _Cost] = {
            arm: cost for arm, cost in costs.items() if arm != ArmName.BOTH
        }
        fallback = min(rest, key=lambda arm: rest[arm].point)
        why = (
            f"; both is cheaper ({_money(costs[ArmName.BOTH])}) but not confidently cheaper "
            f"than {', '.join(unbeaten)} ({', '.join(_money(costs[a]) for a in unbeaten)})"
        )
        return Outcome.RECOMMENDED, fallback, _cheapest_words(fallback, rest) + why + out
    return Outcome.RECOMMENDED, cheapest, _cheapest_words(cheapest, costs) + out


def _confidently_cheaper(cost: _Cost, rival: _Cost) -> bool:
    return cost.high < rival.low * (1.0 - BOTH_MARGIN)


def _cheapest_words(arm: ArmName, costs: Mapping[ArmName, _Cost]) -> str:
    others = [a for a in costs if a != arm]
    among = f"the cheapest of {arm}, {', '.join(others)}" if others else "the only arm left"
    return f"{arm}: {_money(costs[arm])} per {PER} accepted answers, {among}"


def _money(cost: _Cost) -> str:
    return f"{cost.point * PER:.3f} ({interval_words(cost.low * PER, cost.high * PER)})"


def interval_words(low: float, high: float, what: str = "95% ", only: bool = True) -> str:
    """A cost's 95% interval, which covers the accepted share only (Wilson over the arm's
    requests; no throughput's uncertainty is in it): with the digits that tell its bounds
    apart. Thousands of requests answered nearly all alike make it far narrower than 0.001."""
    tail = ", accepted share only" if only else ""
    if high == float("inf"):
        return f"{what}{low:.3f} to unbounded{tail}"
    digits = next((d for d in range(3, 7) if f"{low:.{d}f}" != f"{high:.{d}f}"), None)
    if digits is None:
        return f"no interval: its bounds agree to 6 decimals{tail}"
    return f"{what}{low:.{digits}f}-{high:.{digits}f}{tail}"
