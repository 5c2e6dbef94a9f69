"""The experiment's rule: which of the four arms serves an accepted answer cheapest, and why not."""

from __future__ import annotations

from typing import Any

import pytest

from specfleet.api.spec import ClassSlo
from specfleet.api.verdict import ArmName, Latency, Outcome
from specfleet.experiment.verdict import (
    ArmMeasurement,
    ClassMeasurement,
    accepted_share,
    cost_per_accepted_answer,
    judge,
    within_latency_slo,
)
from specfleet.telemetry.model import ClassWindow, GreedyComparison

SLOS = {
    "code": ClassSlo(max_p95_tpot_seconds=0.05),
    "tools": ClassSlo(min_tool_call_validity=0.95, max_p95_ttft_seconds=1.0),
}
PRICE = 4.0


def measured(
    requests: int = 1000,
    tpot_p95: float = 0.03,
    greedy: GreedyComparison | None = None,
    **counts: Any,
) -> ClassMeasurement:
    """`counts`: the window's (`ClassWindow`); every request that did not fail answered."""
    window = ClassWindow(
        requests=requests,
        choices=requests - counts.get("errors", 0),
        **{"errors": 0.0, "truncated": 0.0, **counts},
    )
    return ClassMeasurement(
        window,
        ttft=Latency(p50_seconds=0.2, p95_seconds=0.4, p99_seconds=0.5),
        tpot=Latency(p50_seconds=tpot_p95 * 0.8, p95_seconds=tpot_p95, p99_seconds=tpot_p95 * 1.1),
        greedy=greedy or GreedyComparison(),
    )


def arm(name: ArmName, throughput: float, **classes: ClassMeasurement) -> ArmMeasurement:
    defaults = {
        "code": measured(greedy=GreedyComparison(compared=200, exact_matches=200)),
        "tools": measured(tool_calls_valid=990, tool_calls_invalid=10),
    }
    return ArmMeasurement(
        arm=name, gpus_per_replica=1, throughput_at_slo=throughput, classes=defaults | classes
    )


def arms(**overrides: ArmMeasurement) -> list[ArmMeasurement]:
    """Throughputs: baseline 2, quantized 3, speculative 4, both 6 requests/s per replica."""
    base = {
        "baseline": arm(ArmName.BASELINE, 2.0),
        "quantized": arm(ArmName.QUANTIZED, 3.0),
        "speculative": arm(ArmName.SPECULATIVE, 4.0),
        "both": arm(ArmName.BOTH, 6.0),
    }
    return list((base | overrides).values())


def test_cost_per_accepted_answer_is_the_replica_hour_over_its_accepted_answers() -> None:
    # 2 GPUs at 4/h, 5 req/s, 80% accepted: 8 / (5 * 3600 * 0.8) = 8 / 14400
    assert cost_per_accepted_answer(4.0, 2, 5.0, 0.8) == pytest.approx(8 / 14400)
    assert cost_per_accepted_answer(4.0, 2, 0.0, 0.8) is None
    assert cost_per_accepted_answer(4.0, 2, 5.0, 0.0) is None


def test_an_accepted_answer_finished_valid_and_on_time() -> None:
    m = measured(
        requests=100, errors=5, truncated=5, tool_calls_valid=8, tool_calls_invalid=2, tpot_p95=0.03
    )
    # 100 - 5 errors - 5 cut off - 2 invalid tool calls; TPOT SLO over p99: all on time
    assert accepted_share(m, SLOS["code"]) == pytest.approx(0.88)
    # the SLO at p95 exactly: 95% of requests within it
    assert accepted_share(m, ClassSlo(max_p95_tpot_seconds=0.03)) == pytest.approx(0.88 * 0.95)


def test_latency_share_interpolates_between_the_percentiles() -> None:
    latency = Latency(p50_seconds=0.1, p95_seconds=0.2, p99_seconds=0.3)
    assert within_latency_slo(latency, None) == 1.0
    assert within_latency_slo(latency, 0.3) == 1.0
    assert within_latency_slo(latency, 0.15) == pytest.approx(0.725)
    assert within_latency_slo(latency, 0.05) == pytest.approx(0.25)


def test_both_wins_when_it_beats_each_single_technique_confidently() -> None:
    verdict = judge(arms(), SLOS, PRICE, min_samples=20)
    assert (verdict.outcome, verdict.recommendation) == (Outcome.RECOMMENDED, ArmName.BOTH)
    assert verdict.exclusions == []
    costs = {row.arm: row.cost_per_accepted_answer for row in verdict.overall}
    assert costs["both"] == pytest.approx(PRICE / (6.0 * 3600 * (1000 + 990) / 2000))
    assert [row.arm for row in verdict.classes[0].rows] == [str(a) for a in ArmName]


def test_both_only_slightly_cheaper_loses_to_the_single_technique() -> None:
    verdict = judge(arms(both=arm(ArmName.BOTH, 4.05)), SLOS, PRICE, min_samples=20)
    assert verdict.recommendation == ArmName.SPECULATIVE
    assert "not confidently cheaper than speculative" in verdict.reason


def test_an_arm_over_a_latency_slo_is_excluded_with_its_evidence() -> None:
    slow = arm(ArmName.BOTH, 6.0, code=measured(tpot_p95=0.06))
    verdict = judge(arms(both=slow), SLOS, PRICE, min_samples=20)
    assert verdict.recommendation == ArmName.SPECULATIVE
    [exclusion] = verdict.exclusions
    assert (exclusion.arm, exclusion.class_name, exclusion.signal) == (
        "both",
        "code",
        "p95TpotSeconds",
    )
    assert (exclusion.value, exclusion.limit, exclusion.samples) == (0.06, 0.05, 1000)
    assert "(excluded: both)" in verdict.reason


def test_broken_tool_calls_exclude_the_arm_against_the_baseline() -> None:
    broken = measured(tool_calls_valid=800, tool_calls_invalid=200)
    verdict = judge(
        arms(
            quantized=arm(ArmName.QUANTIZED, 3.0, tools=broken),
            both=arm(ArmName.BOTH, 6.0, tools=broken),
        ),
        SLOS,
        PRICE,
        min_samples=20,
    )
    assert verdict.recommendation == ArmName.SPECULATIVE
    excluded = {(e.arm, e.class_name, e.signal) for e in verdict.exclusions}
    assert excluded == {
        ("quantized", "tools", "toolCallValidity"),
        ("both", "tools", "toolCallValidity"),
    }
    evidence = verdict.exclusions[0]
    assert (evidence.value, evidence.baseline) == (0.8, 0.99)
    assert (evidence.samples, evidence.baseline_samples) == (1000, 1000)


@pytest.mark.parametrize(
    ("counts", "signal"),
    [
        ({"truncated": 100}, "truncationRate"),
        ({"errors": 50}, "errorRate"),
        ({"greedy": GreedyComparison(compared=200, exact_matches=150)}, "greedyAgreement"),
    ],
)
def test_each_quality_signal_excludes_an_arm(counts: dict[str, Any], signal: str) -> None:
    worse = arm(ArmName.QUANTIZED, 3.0, code=measured(**counts))
    verdict = judge(arms(quantized=worse), SLOS, PRICE, min_samples=20)
    assert [(e.arm, e.class_name, e.signal) for e in verdict.exclusions] == [
        ("quantized", "code", signal)
    ]


def test_a_small_quality_gap_is_not_confidently_worse() -> None:
    slightly = arm(ArmName.BOTH, 6.0, tools=measured(tool_calls_valid=975, tool_calls_invalid=25))
    verdict = judge(arms(both=slightly), SLOS, PRICE, min_samples=20)
    assert verdict.exclusions == [] and verdict.recommendation == ArmName.BOTH


def test_few_requests_are_inconclusive_with_the_sample_sizes() -> None:
    thin = arm(ArmName.SPECULATIVE, 4.0, tools=measured(requests=12))
    verdict = judge(arms(speculative=thin), SLOS, PRICE, min_samples=20)
    assert (verdict.outcome, verdict.recommendation) == (Outcome.INCONCLUSIVE, None)
    assert "speculative/tools n=12" in verdict.reason and "at least 20" in verdict.reason
    assert verdict.overall  # the table is still there


def test_no_arm_when_even_the_baseline_misses_a_latency_slo() -> None:
    slow = measured(tpot_p95=0.08)
    verdict = judge(
        arms(**{name: arm(ArmName(name), 2.0, code=slow) for name in ArmName}), SLOS, PRICE, 20
    )
    assert (verdict.outcome, verdict.recommendation) == (Outcome.NO_ARM, None)
    assert {e.arm for e in verdict.exclusions} == set(ArmName)


def test_every_arm_is_needed() -> None:
    with pytest.raises(ValueError, match="missing \\['both'\\]"):
        judge(arms()[:3], SLOS, PRICE, min_samples=20)


def test_counts_that_cannot_be_are_refused() -> None:
    with pytest.raises(ValueError, match="truncationRate"):
        measured(requests=4, truncated=5)
    with pytest.raises(ValueError, match="greedyAgreement"):
        measured(greedy=GreedyComparison(compared=4, exact_matches=5))
