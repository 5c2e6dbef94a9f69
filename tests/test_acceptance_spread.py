"""The acceptance rate's bound as wide as requests differ: the gateway exports per-request sums,
telemetry reads them, the replay models them, and the guard's bound (`sequential`'s
ratio_confidence_sequence) narrows with them while it keeps its error rate."""

from __future__ import annotations

import math
import random

import pytest
from prometheus_client.parser import text_string_to_metric_families

from specfleet import series
from specfleet.gateway.metrics import GatewayMetrics, RequestRecord
from specfleet.gateway.stats import SpecCounts
from specfleet.guard.sequential import (
    confidence_sequence,
    mean_confidence_sequence,
    ratio_confidence_sequence,
    requests_to_decide,
)
from specfleet.guard.verdict import acceptance_bounds, requests_to_show
from specfleet.simulate.outcome import moments
from specfleet.telemetry.model import ClassWindow
from specfleet.telemetry.reader import MOMENT_FIELDS, QUERIES

REQUESTS = [
    SpecCounts(drafted=40, accepted=30, steps=10),
    SpecCounts(drafted=20, accepted=4, steps=5),
]


def spread_window(
    rate: float, spread: float, requests: float, drafted: float = 100.0
) -> ClassWindow:
    """A window of `requests` that drafted alike and accepted `spread` apart around `rate`."""
    sums = moments(
        round(requests), round(requests * drafted), round(requests * drafted * rate), spread
    )
    return ClassWindow(
        requests=requests,
        spec_requests=requests,
        draft_tokens=requests * drafted,
        accepted_tokens=requests * drafted * rate,
        **sums,
    )


def test_the_gateway_exports_the_per_request_sums_per_class() -> None:
    metrics = GatewayMetrics()
    metrics.ensure_classes(["code", "chat"])
    for spec in REQUESTS:
        metrics.record(RequestRecord("code", "ok", spec=spec))
    metrics.record(RequestRecord("code", "ok"))  # no counts reported: in no sum
    families = text_string_to_metric_families(metrics.exposition().decode())
    [family] = [f for f in families if f.name == series.REQUEST_MOMENTS]
    code = {s.labels[series.MOMENT]: s.value for s in family.samples if s.labels["class"] == "code"}
    assert code == {
        "drafting_requests": 2.0,
        "accepted_squared": 30.0**2 + 4.0**2,
        "drafted_squared": 40.0**2 + 20.0**2,
        "accepted_drafted": 30.0 * 40 + 4.0 * 20,
        "tpot_squared_seconds": 0.0,  # none streamed
        "ttft_squared_seconds": 0.0,  # no first token timed
    }


def test_telemetry_reads_each_sum_with_one_query() -> None:
    templates = {QUERIES[field][0] for field in MOMENT_FIELDS}
    assert len(templates) == 1 and f"{series.REQUEST_MOMENTS}_total" in templates.pop()
    assert [QUERIES[field][2] for field in MOMENT_FIELDS] == list(series.MOMENTS)


def test_the_window_gives_the_requests_deviations_from_its_rate() -> None:
    accepted = [r.accepted for r in REQUESTS]
    drafted = [r.drafted for r in REQUESTS]
    window = ClassWindow(
        spec_requests=2.0,
        draft_tokens=float(sum(drafted)),
        accepted_tokens=float(sum(accepted)),
        accepted_squares=float(sum(a * a for a in accepted)),
        drafted_squares=float(sum(d * d for d in drafted)),
        accepted_by_drafted=float(sum(a * d for a, d in zip(accepted, drafted, strict=True))),
    )
    rate = sum(accepted) / sum(drafted)
    expected = sum((a - rate * d) ** 2 for a, d in zip(accepted, drafted, strict=True))
    assert window.acceptance_deviations == pytest.approx(expected)
    assert ClassWindow(draft_tokens=60.0, accepted_tokens=34.0).acceptance_deviations is None


def test_the_replay_s_sums_hold_the_spread_it_draws_requests_with() -> None:
    window = spread_window(0.6, 0.15, 200, drafted=100.0)
    binomial = 200 * 100 * 0.6 * 0.4
    assert window.acceptance_deviations == pytest.approx(199 * (100 * 0.15) ** 2 + binomial)
    assert moments(0, 0, 0, 0.15) == {}


def test_requests_that_agree_give_a_narrower_bound_than_counting_them_as_trials() -> None:
    alike, apart = spread_window(0.59, 0.05, 60), spread_window(0.59, 0.4, 60)
    _, narrow = acceptance_bounds(alike, 0.05)
    _, wide = acceptance_bounds(apart, 0.05)
    _, trials = acceptance_bounds(
        ClassWindow(requests=60, draft_tokens=6000, accepted_tokens=3540), 0.05
    )
    assert trials == pytest.approx(confidence_sequence(0.59 * 60, 60, 0.05))
    assert narrow[0] > wide[0] and narrow[1] < wide[1]
    assert narrow[1] - narrow[0] < 0.5 * (trials[1] - trials[0])
    assert narrow[0] > 0.5  # a floor of 0.5 is shown met on 60 requests
    assert trials[0] < 0.5  # where counting them as trials needs 380
    assert requests_to_show(
        ClassWindow(requests=60, draft_tokens=6000, accepted_tokens=3540), 0.5, 0.05
    ) == pytest.approx(380, rel=0.01)


def test_few_requests_never_make_a_narrow_bound_whatever_they_show() -> None:
    # two requests that happen to agree exactly: the prior's spread keeps the bound wide
    low, high = ratio_confidence_sequence(120.0, 200.0, 0.0, 2.0, 0.05)
    assert low == 0.0 and high == 1.0
    assert ratio_confidence_sequence(5.0, 0.0, 0.0, 3.0, 0.05) == (0.0, 1.0)
    assert ratio_confidence_sequence(5.0, 10.0, 0.0, 0.0, 0.05) == (0.0, 1.0)
    with pytest.raises(ValueError, match="error_rate"):
        ratio_confidence_sequence(5.0, 10.0, 1.0, 3.0, 1.0)


@pytest.mark.parametrize(
    ("rate", "limit", "spread"), [(0.59, 0.5, 0.15), (0.2, 0.5, 0.3), (0.7, 0.6, 0.05)]
)
def test_requests_to_decide_is_where_the_bound_leaves_the_limit(
    rate: float, limit: float, spread: float
) -> None:
    needed = requests_to_decide(rate, limit, spread, 0.05)
    assert needed is not None

    def decided(n: float) -> bool:
        deviations = (n * spread * 100) ** 2 / n  # n requests of 100 drafts, `spread` apart
        low, high = ratio_confidence_sequence(rate * 100 * n, 100 * n, deviations, n, 0.05)
        return low > limit or high < limit

    assert decided(needed * 1.001) and not decided(needed * 0.99)
    assert requests_to_decide(0.5, 0.5, 0.1, 0.05) is None


def test_looked_at_after_every_request_it_errs_about_as_often_as_it_says() -> None:
    """Requests of 10-500 drafts whose own rates lie close (a Beta around 0.7, sd 0.05) but
    one in twenty of which accepts nothing: the bound looked at after each of 400 requests
    excludes the true rate of sums in at most its error rate of 300 streams (plus sampling
    slack). The rare request the first ones have not shown is what a spread estimated from
    them misses (with PRIOR_REQUESTS at 2 this errs in 11%)."""
    rng = random.Random(11)
    alpha, streams, truth = 0.05, 300, 0.95 * 0.7
    errs = 0
    for _ in range(streams):
        n = acc = dra = a2 = d2 = ad = 0.0
        for _ in range(400):
            d = rng.randint(10, 500)
            p = 0.0 if rng.random() < 0.05 else rng.betavariate(70.0, 30.0)
            a = min(max(round(rng.gauss(d * p, math.sqrt(d * p * (1 - p)))), 0), d)
            n, acc, dra = n + 1, acc + a, dra + d
            a2, d2, ad = a2 + a * a, d2 + d * d, ad + a * d
            r = acc / dra
            low, high = ratio_confidence_sequence(acc, dra, a2 - 2 * r * ad + r * r * d2, n, alpha)
            if not low <= truth <= high:
                errs += 1
                break
    assert errs / streams <= alpha + 0.035


@pytest.mark.parametrize("latency", ["tpot", "ttft"])
def test_the_gateway_sums_the_squares_of_the_latencies_it_observes(latency: str) -> None:
    metrics = GatewayMetrics()
    for seconds in (0.02, 0.03):
        metrics.record(RequestRecord("chat", "ok", **{latency: seconds}))
    families = text_string_to_metric_families(metrics.exposition().decode())
    [family] = [f for f in families if f.name == series.REQUEST_MOMENTS]
    [squares] = [
        s.value for s in family.samples if s.labels[series.MOMENT] == f"{latency}_squared_seconds"
    ]
    assert squares == pytest.approx(0.02**2 + 0.03**2)


def test_a_mean_s_bound_narrows_as_streams_agree_and_grow() -> None:
    assert mean_confidence_sequence(0.0, 0.0, 0.0, 0.05) == (0.0, math.inf)

    def width(samples: float, cv: float) -> float:
        low, high = mean_confidence_sequence(
            0.03 * samples, samples * 0.03**2 * (1 + cv * cv), samples, 0.05
        )
        assert low <= 0.03 <= high
        return high - low

    assert width(100, 0.1) < width(100, 0.5) < width(20, 0.5)
    assert width(1000, 0.3) < 0.1 * 0.03


def test_a_mean_tpot_looked_at_after_every_stream_errs_within_its_rate() -> None:
    """Lognormal TPOTs (a heavy right tail: a stalled stream now and then) bounded after each
    of 300 streams: the true mean is excluded in at most the error rate of 300 runs."""
    rng = random.Random(5)
    sigma, alpha, runs = 0.6, 0.05, 300
    truth = 0.03 * math.exp(sigma * sigma / 2)
    errs = 0
    for _ in range(runs):
        total = squares = 0.0
        for n in range(1, 301):
            x = 0.03 * math.exp(rng.gauss(0.0, sigma))
            total, squares = total + x, squares + x * x
            low, high = mean_confidence_sequence(total, squares, n, alpha)
            if not low <= truth <= high:
                errs += 1
                break
    assert errs / runs <= alpha + 0.035
