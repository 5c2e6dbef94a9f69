"""An arm's throughput at SLO from a load test's concurrency steps."""

from __future__ import annotations

from specfleet.api.spec import ClassSlo
from specfleet.experiment.capacity import (
    ERROR_BUDGET,
    TERMINATION_MESSAGE_BYTES,
    Capacity,
    ClassStep,
    ConcurrencyStep,
    capacity,
    termination_message,
)

SLOS = {
    "chat": ClassSlo(max_p95_ttft_seconds=1.0, max_p95_tpot_seconds=0.05),
    "code": ClassSlo(max_p95_tpot_seconds=0.03),
}


def cls(ttft: float = 0.5, tpot: float = 0.02, requests: int = 50, errors: int = 0) -> ClassStep:
    return ClassStep(requests=requests, errors=errors, p95_ttft_seconds=ttft, p95_tpot_seconds=tpot)


def step(concurrency: int, throughput: float, **classes: ClassStep) -> ConcurrencyStep:
    return ConcurrencyStep(
        concurrency=concurrency,
        throughput=throughput,
        classes={"chat": cls(), "code": cls()} | classes,
    )


def test_the_highest_throughput_before_the_first_step_outside_the_slos() -> None:
    steps = [
        step(8, 9.0, code=cls(tpot=0.04)),
        step(2, 3.0),
        step(4, 5.5),
        step(16, 10.0),
    ]
    result = capacity(steps, SLOS)
    assert (result.throughput_at_slo, result.concurrency) == (5.5, 4)
    [miss] = result.misses
    assert (miss.concurrency, miss.class_name, miss.signal) == (8, "code", "p95TpotSeconds")
    assert (miss.value, miss.limit) == (0.04, 0.03)
    assert [s.concurrency for s in result.steps] == [2, 4, 8, 16]


def test_a_step_back_inside_after_a_miss_is_not_capacity() -> None:
    steps = [step(2, 3.0), step(4, 5.0, chat=cls(ttft=1.2)), step(8, 9.0)]
    assert capacity(steps, SLOS).throughput_at_slo == 3.0


def test_every_step_inside_takes_the_best_throughput_and_reports_no_miss() -> None:
    # a saturated engine's last step can achieve less than the one before it
    result = capacity([step(2, 3.0), step(4, 6.0), step(8, 5.8)], SLOS)
    assert (result.throughput_at_slo, result.concurrency, result.misses) == (6.0, 4, [])


def test_zero_when_the_first_step_misses_with_each_class_and_signal_as_evidence() -> None:
    steps = [step(1, 1.0, chat=cls(ttft=2.0, tpot=0.06), code=cls(tpot=0.031)), step(2, 2.0)]
    result = capacity(steps, SLOS)
    assert (result.throughput_at_slo, result.concurrency) == (0.0, None)
    assert [(m.class_name, m.signal) for m in result.misses] == [
        ("chat", "p95TtftSeconds"),
        ("chat", "p95TpotSeconds"),
        ("code", "p95TpotSeconds"),
    ]


def test_a_limit_left_unset_is_never_missed() -> None:
    result = capacity([step(1, 1.0, code=cls(ttft=30.0))], SLOS)
    assert result.throughput_at_slo == 1.0


def test_errors_past_the_budget_miss_whatever_the_latencies() -> None:
    within = round(100 * ERROR_BUDGET)
    steps = [step(2, 2.0, chat=cls(requests=100 - within, errors=within))]
    assert capacity(steps, SLOS).throughput_at_slo == 2.0
    steps = [step(2, 2.0, chat=cls(requests=99 - within, errors=within + 1))]
    [miss] = capacity(steps, SLOS).misses
    assert (miss.signal, miss.limit) == ("errorRate", ERROR_BUDGET)
    assert miss.value == (within + 1) / 100


def test_a_class_absent_from_a_step_misses_it() -> None:
    only_chat = ConcurrencyStep(concurrency=1, throughput=1.0, classes={"chat": cls()})
    none_done = step(1, 1.0, code=cls(requests=0))
    for lacking in (only_chat, none_done):
        [miss] = capacity([lacking], SLOS).misses
        assert (miss.class_name, miss.signal) == ("code", "requests")


def test_classes_without_an_slo_are_not_judged() -> None:
    result = capacity([step(1, 1.0, other=cls(ttft=99.0, errors=50))], SLOS)
    assert result.throughput_at_slo == 1.0


def test_the_compact_result_round_trips_on_the_wire() -> None:
    result = capacity([step(1, 1.0), step(2, 1.5, code=cls(tpot=0.5))], SLOS)
    wire = result.model_dump_json(by_alias=True, exclude={"steps"})
    assert '"class":"code"' in wire and '"throughputAtSlo":1.0' in wire
    assert type(result).model_validate_json(result.model_dump_json(by_alias=True)) == result


def test_the_termination_message_drops_the_last_misses_to_fit_and_counts_them() -> None:
    many = {
        f"class-{i:03}": ClassSlo(max_p95_ttft_seconds=0.1, max_p95_tpot_seconds=0.01)
        for i in range(60)
    }
    slow = cls(ttft=1.0, tpot=0.1)
    result = capacity(
        [ConcurrencyStep(concurrency=1, throughput=1.0, classes=dict.fromkeys(many, slow))], many
    )
    assert len(result.misses) == 120
    message = termination_message(result)
    assert len(message.encode()) <= TERMINATION_MESSAGE_BYTES
    compact = Capacity.model_validate_json(message)
    assert compact.misses == result.misses[: len(compact.misses)]
    assert compact.omitted_misses == 120 - len(compact.misses) > 0
    small = capacity([step(1, 1.0)], SLOS)
    assert Capacity.model_validate_json(termination_message(small)).throughput_at_slo == 1.0
