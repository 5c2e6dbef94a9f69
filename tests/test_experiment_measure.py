"""The live experiment's verdict inputs: telemetry's windows as measurements `judge` takes, the
progress towards the samples needed, and the recommended arm as a merge patch for Git."""

from __future__ import annotations

from datetime import UTC, datetime

import yaml

from specfleet.api.experiment import ArmOverlay
from specfleet.api.spec import ClassSlo
from specfleet.api.verdict import ArmName, Outcome
from specfleet.experiment.arms import default_overlay, overlay_spec
from specfleet.experiment.measure import (
    arm_measurement,
    arm_measurements,
    class_measurement,
    progress,
    recommended_patch,
    throughput_at_concurrency_one,
)
from specfleet.experiment.verdict import judge
from specfleet.telemetry.arms import ArmsObservation, GreedyComparison
from specfleet.telemetry.model import ClassWindow

T0 = datetime(2026, 1, 1, tzinfo=UTC)
SLO = ClassSlo(max_p95_tpot_seconds=0.02)


def window(requests: float, tpot: float, **counts: float) -> ClassWindow:
    return ClassWindow(
        requests=requests,
        errors=0.0,
        p95_ttft_seconds=0.2,
        p95_tpot_seconds=tpot,
        choices=requests,
        truncated=0.0,
        **counts,
    )


def test_windows_become_measurements_judge_takes() -> None:
    arms = [
        arm_measurement(arm, {"chat": window(400.4, tpot)}, {}, 1, rps)
        for arm, tpot, rps in [
            (ArmName.BASELINE, 0.030, 1.0),
            (ArmName.QUANTIZED, 0.015, 2.0),
            (ArmName.SPECULATIVE, 0.012, 1.5),
            (ArmName.BOTH, 0.010, 2.2),
        ]
    ]
    assert arms[0].classes["chat"].requests == 400
    verdict = judge(arms, {"chat": SLO}, gpu_hour_price=4.0, min_samples=100)
    assert verdict.outcome == Outcome.RECOMMENDED
    assert any(
        e.arm == ArmName.BASELINE and e.signal == "p95TpotSeconds" for e in verdict.exclusions
    )


def test_validity_counts_and_acceptance_carry_over() -> None:
    measured = arm_measurement(
        ArmName.BOTH,
        {
            "tools": window(
                50,
                0.01,
                tool_calls_valid=40,
                tool_calls_invalid=10,
                draft_tokens=100,
                accepted_tokens=60,
            )
        },
        {"tools": GreedyComparison(compared=20.2, exact_matches=18.9)},
        2,
        1.0,
    ).classes["tools"]
    assert measured.greedy == GreedyComparison(compared=20, exact_matches=19)
    assert (measured.window.tool_calls_valid, measured.window.tool_calls_judged) == (40, 50)
    assert measured.window.acceptance_rate == 0.6
    assert measured.ttft.p50_seconds == measured.ttft.p99_seconds == 0.2


def reading(**arms: dict[str, ClassWindow]) -> ArmsObservation:
    return ArmsObservation(at=T0, window_seconds=3600, arms=arms)


def test_progress_is_the_arm_and_class_furthest_from_the_samples_needed() -> None:
    gpus = dict.fromkeys(ArmName, 1)
    arms = {
        ArmName.BASELINE: {"chat": window(300, 0.01), "tools": window(20, 0.01)},
        ArmName.BOTH: {"chat": window(500, 0.01)},
    }
    measured = arm_measurements(reading(**arms), ["chat", "tools"], gpus)
    result = progress(measured, needed=40)
    assert result.percent == 0  # two arms served nothing yet, both no tool calls
    assert [(r.arm, r.class_name, r.requests) for r in result.requests][:2] == [
        (ArmName.BASELINE, "chat", 300),
        (ArmName.BASELINE, "tools", 20),
    ]
    arms = {arm: {"chat": window(500, 0.01), "tools": window(20, 0.01)} for arm in ArmName}
    measured = arm_measurements(reading(**arms), ["chat", "tools"], gpus)
    assert progress(measured, needed=40).percent == 50
    assert progress(measured[:1], needed=10).percent == 100
    assert progress(measured, needed=None).percent == 0  # it runs for its duration


def test_without_a_capacity_phase_an_arms_throughput_is_at_concurrency_one() -> None:
    windows = [
        ClassWindow(requests=100.0, request_seconds=50.0),
        ClassWindow(requests=100.0, request_seconds=150.0),
    ]
    assert throughput_at_concurrency_one(windows) == 1.0
    assert throughput_at_concurrency_one([ClassWindow()]) == 0.0
    gpus = dict.fromkeys(ArmName, 1)
    faster = {"chat": ClassWindow(requests=10.0, request_seconds=2.0)}
    [baseline, *_] = arm_measurements(reading(baseline=faster), ["chat"], gpus)
    assert baseline.throughput_at_slo == 5.0
    [baseline, *_] = arm_measurements(
        reading(baseline=faster), ["chat"], gpus, {ArmName.BASELINE: 7.5}
    )
    assert baseline.throughput_at_slo == 7.5


def merged(spec: dict[str, object], patch: dict[str, object]) -> dict[str, object]:
    """RFC 7386, as `kubectl patch --type merge` applies it."""
    out = dict(spec)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)  # type: ignore[arg-type]
        else:
            out[key] = value
    return out


def test_the_recommended_patch_makes_the_spec_serve_the_arm() -> None:
    spec = {
        "model": {"source": "org/awq", "servedName": "m"},
        "quantization": {"weights": "awq"},
        "speculative": {"method": "ngram"},
    }
    for arm in ArmName:
        overlay = default_overlay(arm, "org/bf16")
        patch = yaml.safe_load(recommended_patch(overlay))
        assert merged(spec, patch.get("spec", {})) == overlay_spec(spec, overlay), arm
    assert recommended_patch(ArmOverlay(quantization=True, speculative=True)) == "{}\n"


def test_extrapolated_parts_over_their_wholes_are_held_to_them() -> None:
    """Seen live on a real-engine arm: every answer cut at `max_tokens`, and Prometheus read
    4 truncated of 3 requests (each counter's increase extrapolated on its own)."""
    read = ClassWindow(
        requests=3.2,
        errors=3.6,
        truncated=4.4,
        draft_tokens=30.0,
        accepted_tokens=30.6,
    )

    measured = class_measurement(read, GreedyComparison(compared=2.0, exact_matches=2.4))

    held = measured.window
    assert (held.requests, held.errors, held.choices, held.truncated) == (3, 3, 0, 0)
    assert held.acceptance_rate == 1.0
    assert measured.greedy == GreedyComparison(compared=2, exact_matches=2)
