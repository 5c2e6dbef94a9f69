"""Always-valid bounds of a proportion (specfleet.guard.sequential): the bound the guard may peek
at every tick without its error rate growing with the number of peeks."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specfleet.guard.sequential import (
    MAX_TRIALS,
    PRIOR,
    confidence_sequence,
    excludes,
    log_martingale,
    trials_to_decide,
)
from specfleet.guard.speedup import wilson_interval

trials_st = st.floats(min_value=0.05, max_value=1e6)
fraction_st = st.floats(min_value=0.0, max_value=1.0)
error_st = st.sampled_from([0.001, 0.01, 0.05, 0.1, 0.3])


def evidence(p: float, successes: float, trials: float, a: float, b: float) -> float:
    """log M_n(p) written out again, apart from the module's own."""
    failures = trials - successes
    log_beta = math.lgamma(a + successes) + math.lgamma(b + failures)
    log_beta -= math.lgamma(a + b + trials)
    log_beta -= math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)
    return log_beta - successes * math.log(p) - failures * math.log(1.0 - p)


@pytest.mark.parametrize(
    ("successes", "trials"), [(0.0, 0.0), (3.0, 0.0), (0.0, -2.0), (1.0, math.nan), (math.nan, 9.0)]
)
def test_no_evidence_is_the_whole_range(successes: float, trials: float) -> None:
    assert confidence_sequence(successes, trials, 0.05) == (0.0, 1.0)


@pytest.mark.parametrize("error_rate", [0.0, 1.0, -0.1, 1.5, math.nan])
def test_an_error_rate_outside_0_1_is_refused(error_rate: float) -> None:
    with pytest.raises(ValueError, match="error_rate"):
        confidence_sequence(3, 10, error_rate)
    with pytest.raises(ValueError, match="error_rate"):
        trials_to_decide(0.1, 0.3, error_rate)


def test_one_trial_by_hand() -> None:
    """Jeffreys' mixture after one failure predicts it with probability 1/2, so
    M_1(p) = 1/2 / (1 - p) and the bound ends where that is 1/α: at 1 - α/2."""
    assert PRIOR == (0.5, 0.5)
    assert confidence_sequence(0, 1, 0.05) == pytest.approx((0.0, 0.975), abs=1e-12)
    assert confidence_sequence(1, 1, 0.05) == pytest.approx((0.025, 1.0), abs=1e-12)
    assert confidence_sequence(0, 1, 0.2) == pytest.approx((0.0, 0.9), abs=1e-12)


def test_wider_than_the_single_look_wilson_interval() -> None:
    """The price of peeking at will: at 100 trials the sequence is wider than the 95% Wilson
    interval, which is valid for one look only."""
    lower, upper = confidence_sequence(30, 100, 0.05)
    low, high = wilson_interval(30, 100)
    assert lower < low and high < upper
    assert lower > 0.15 and upper < 0.48


@given(fraction_st, trials_st, error_st)
def test_the_bounds_hold_the_observed_share(fraction: float, trials: float, alpha: float) -> None:
    successes = fraction * trials
    lower, upper = confidence_sequence(successes, trials, alpha)
    assert 0.0 <= lower <= upper <= 1.0
    assert lower <= successes / trials <= upper
    assert lower < upper


@given(fraction_st, trials_st, error_st)
def test_the_ends_are_where_the_martingale_reaches_one_over_the_error_rate(
    fraction: float, trials: float, alpha: float
) -> None:
    successes = fraction * trials
    level = math.log(1.0 / alpha)
    lower, upper = confidence_sequence(successes, trials, alpha)
    for end in (lower, upper):
        if 1e-300 < end < 1.0 - 1e-9:  # not clipped at 0 or 1, nor at float resolution near 1
            assert evidence(end, successes, trials, *PRIOR) == pytest.approx(level, rel=1e-6)
            assert log_martingale(end, successes, trials) == pytest.approx(level, rel=1e-6)
    # 0 and 1 only when no success (failure) rules them out or the end is past float resolution
    if lower == 0.0 and successes > 0.0:
        assert evidence(1e-300, successes, trials, *PRIOR) < level
    if upper == 1.0 and successes < trials:
        assert evidence(1.0 - 1e-15, successes, trials, *PRIOR) < level
    # inside the interval the evidence stays below the level, outside it is above
    share = successes / trials
    if 0.0 < share < 1.0:
        assert evidence(share, successes, trials, *PRIOR) < level
    if lower > 1e-9:
        assert evidence(lower * 0.999, successes, trials, *PRIOR) > level
    if upper < 0.999:
        assert evidence(upper + 0.001 * (1 - upper), successes, trials, *PRIOR) > level


def test_the_one_sided_ends_in_closed_form() -> None:
    """With no success the upper end solves (1 - p)^-n · B(a, b + n) / B(a, b) = 1/α."""
    for n in (0.5, 3.0, 20.0, 1000.0, 36.8):
        # log B(1/2, 1/2 + n) - log B(1/2, 1/2)
        log_marginal = math.lgamma(0.5 + n) - math.lgamma(1.0 + n) - math.lgamma(0.5)
        upper = 1.0 - math.exp((log_marginal - math.log(20.0)) / n)
        assert confidence_sequence(0.0, n, 0.05) == pytest.approx((0.0, upper), rel=1e-12)
        lower, top = confidence_sequence(n, n, 0.05)
        assert top == 1.0
        assert lower == pytest.approx(1.0 - upper, rel=1e-9)  # Jeffreys' prior is symmetric


@given(fraction_st, st.floats(min_value=1.0, max_value=1e5), st.floats(1.01, 100.0), error_st)
def test_more_trials_at_the_same_share_narrow_the_bound(
    fraction: float, trials: float, factor: float, alpha: float
) -> None:
    lower, upper = confidence_sequence(fraction * trials, trials, alpha)
    more = trials * factor
    low, high = confidence_sequence(fraction * more, more, alpha)
    assert high - low < upper - lower or upper - lower == 1.0


@given(fraction_st, trials_st, st.floats(0.001, 0.5), st.floats(1.01, 100.0))
def test_a_smaller_error_rate_widens_the_bound(
    fraction: float, trials: float, alpha: float, factor: float
) -> None:
    lower, upper = confidence_sequence(fraction * trials, trials, alpha)
    low, high = confidence_sequence(fraction * trials, trials, min(alpha * factor, 0.99))
    assert lower <= low and high <= upper
    assert lower < low or lower < 1e-300  # strictly, unless at 0 or 1 in floats
    assert high < upper or upper > 1.0 - 1e-12


@given(trials_st, fraction_st, fraction_st)
def test_more_successes_move_both_ends_up(trials: float, one: float, other: float) -> None:
    fewer, more = sorted((one * trials, other * trials))
    low, high = confidence_sequence(fewer, trials, 0.05)
    lower, upper = confidence_sequence(more, trials, 0.05)
    # to rounding: log B(a + S, b + F) at a million trials is a difference of numbers near 1e7
    assert low <= lower * (1 + 1e-9) and high <= upper * (1 + 1e-9)


def test_float_counts_from_prometheus() -> None:
    """An extrapolated increase (36.8 of 37.0) lies between its integer neighbours; successes
    outside [0, trials] are clipped."""
    below, _ = confidence_sequence(36, 37, 0.05)
    lower, upper = confidence_sequence(36.8, 37.0, 0.05)
    above, _ = confidence_sequence(37, 37, 0.05)
    assert below < lower < above
    assert upper < 1.0
    assert confidence_sequence(38.2, 37.0, 0.05) == confidence_sequence(37.0, 37.0, 0.05)
    assert confidence_sequence(-0.4, 37.0, 0.05) == confidence_sequence(0.0, 37.0, 0.05)


def test_the_prior_is_a_choice_that_matters_where_the_guard_looks() -> None:
    """Near 0 and 1 (validity floors) Jeffreys' prior is tighter than flatter or concentrated
    ones; near 1/2 a concentrated prior is tighter (the module's docstring says why the ends
    win)."""

    def width(share: float, prior: tuple[float, float]) -> float:
        lower, upper = confidence_sequence(share * 100, 100, 0.05, prior=prior)
        return upper - lower

    for prior in ((1.0, 1.0), (2.0, 2.0), (10.0, 10.0)):
        assert width(0.97, PRIOR) < width(0.97, prior)
        assert width(0.03, PRIOR) < width(0.03, prior)
    assert width(0.5, (10.0, 10.0)) < width(0.5, PRIOR)


def test_peeking_at_every_tenth_draw_keeps_the_error_rate() -> None:
    """The reason the module exists. 400 seeded streams of 2000 Bernoulli(p) draws, both bounds
    looked at after every 10th draw: the confidence sequence excludes the true p in at most about
    error_rate of the streams, ever; the 95% Wilson interval, valid for one look, in far more."""
    rng = random.Random(20250101)
    alpha, streams, draws = 0.05, 400, 2000
    for p in (0.05, 0.5, 0.9):
        sequence_erred = wilson_erred = 0
        for _ in range(streams):
            successes = 0
            sequence_wrong = wilson_wrong = False
            for n in range(1, draws + 1):
                successes += rng.random() < p
                if n % 10:
                    continue
                if not sequence_wrong:
                    lower, upper = confidence_sequence(successes, n, alpha)
                    sequence_wrong = not lower <= p <= upper
                if not wilson_wrong:
                    lower, upper = wilson_interval(successes, n)
                    wilson_wrong = not lower <= p <= upper
            sequence_erred += sequence_wrong
            wilson_erred += wilson_wrong
        # 0.025 is about two standard errors of a share of 400 streams at 0.05
        assert sequence_erred / streams <= alpha + 0.025, p
        assert wilson_erred / streams > 0.2, p
        assert wilson_erred > 3 * sequence_erred, p


sides_st = st.tuples(
    st.floats(0.01, 0.99), st.floats(0.01, 0.99), st.floats(0.01, 0.99), error_st
).filter(lambda t: abs(t[0] - t[1]) > 0.02 and abs(t[0] - t[2]) > 0.02)


@settings(max_examples=60)
@given(sides_st)
def test_a_share_further_from_the_limit_needs_fewer_trials(
    case: tuple[float, float, float, float],
) -> None:
    limit, one, other, alpha = case
    if (one < limit) != (other < limit):
        return
    near, far = sorted((one, other), key=lambda share: abs(share - limit))
    needs_far, needs_near = (
        trials_to_decide(far, limit, alpha),
        trials_to_decide(near, limit, alpha),
    )
    assert needs_far is not None and needs_near is not None
    assert needs_far <= needs_near * 1.001  # both to 0.1%


@settings(max_examples=80)
@given(
    st.floats(0.0, 1.0),
    st.floats(0.005, 0.995),
    st.sampled_from([0.01, 0.05, 0.1]),
)
def test_trials_to_decide_agrees_with_the_bound(share: float, limit: float, alpha: float) -> None:
    """At the returned n the bound is past the limit, at 0.9·n not yet, and it stays past as
    more trials at the same share arrive."""
    needs = trials_to_decide(share, limit, alpha)
    if abs(share - limit) < 0.005:
        return  # may need more than MAX_TRIALS
    assert needs is not None

    def past(n: float) -> bool:
        lower, upper = confidence_sequence(share * n, n, alpha)
        return upper < limit + 1e-12 if share < limit else lower > limit - 1e-12

    assert past(needs)
    assert not past(0.9 * needs)
    assert all(past(needs * factor) for factor in (1.01, 1.5, 2.0, 10.0, 1000.0))


def test_trials_to_decide_edges() -> None:
    assert trials_to_decide(0.3, 0.3, 0.05) is None
    assert trials_to_decide(0.5, 0.5001, 0.05) is None  # needs more than MAX_TRIALS
    assert trials_to_decide(0.2, 1.0, 0.05) is None
    assert trials_to_decide(0.2, 0.0, 0.05) is None
    assert trials_to_decide(math.nan, 0.5, 0.05) is None
    assert trials_to_decide(1.5, 0.5, 0.05) == trials_to_decide(1.0, 0.5, 0.05)
    needs = trials_to_decide(0.49, 0.5, 0.05)
    assert needs is not None and 1e4 < needs < MAX_TRIALS
    # a collapse from 0.3 to 0.05 acceptance is judged within tens of trials, a healthy
    # validity class confirms its 0.98 floor within hundreds
    collapse = trials_to_decide(0.05, 0.3, 0.05)
    assert collapse is not None and 10 < collapse < 40
    healthy = trials_to_decide(0.995, 0.98, 0.05)
    assert healthy is not None and 300 < healthy < 1500
    assert (stricter := trials_to_decide(0.05, 0.3, 0.01)) is not None and stricter > collapse


@given(fraction_st, trials_st, error_st, st.floats(0.001, 0.999))
def test_excludes_says_what_the_bounds_say(
    fraction: float, trials: float, alpha: float, p: float
) -> None:
    """The guard's one-evaluation test agrees with the bounds' roots, but within a hair of an
    end (where the root finder's tolerance decides)."""
    lower, upper = confidence_sequence(fraction * trials, trials, alpha)
    if min(abs(p - lower), abs(p - upper)) < 1e-6:
        return
    assert excludes(p, fraction * trials, trials, alpha) == (p < lower or p > upper)
