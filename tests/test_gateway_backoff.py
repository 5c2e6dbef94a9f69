"""The plain pool's back-off, on a clock the test moves: no attempt while it runs, one probe
after it, doubling per consecutive failure up to the cap, a success ending it."""

from __future__ import annotations

from specfleet.gateway.backoff import Backoff


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def admitted(backoff: Backoff) -> int:
    attempt = backoff.admit()
    assert attempt is not None
    return attempt


def failing(backoff: Backoff) -> bool:
    """One attempt, admitted and failed."""
    return backoff.failed(admitted(backoff))


def test_an_available_pool_admits_every_attempt() -> None:
    backoff = Backoff(Clock())
    assert all(backoff.admit() is not None for _ in range(10))
    assert backoff.available and not backoff.succeeded()


def test_a_failure_holds_attempts_off_then_admits_one_probe() -> None:
    clock = Clock()
    backoff = Backoff(clock, first=1.0, cap=30.0)
    assert failing(backoff)
    assert not backoff.available and backoff.delay == 1.0
    clock.now += 0.99
    assert backoff.admit() is None
    clock.now += 0.01
    admitted(backoff)  # the probe
    assert backoff.admit() is None  # one probe at a time, however long it takes to connect
    assert backoff.succeeded()
    assert backoff.available and backoff.admit() is not None


def test_the_back_off_doubles_per_consecutive_failure_up_to_the_cap() -> None:
    clock = Clock()
    backoff = Backoff(clock, first=1.0, cap=30.0)
    delays = []
    for _ in range(8):
        became = failing(backoff)
        assert became == (not delays)  # only the first failure makes the pool unavailable
        delays.append(backoff.delay)
        clock.now += backoff.delay
    assert delays == [1, 2, 4, 8, 16, 30, 30, 30]
    backoff.succeeded()
    assert failing(backoff) and backoff.delay == 1.0  # a success forgets the failures


def test_attempts_in_flight_when_the_pool_went_fail_once_for_all() -> None:
    clock = Clock()
    backoff = Backoff(clock, first=1.0)
    in_flight = [admitted(backoff) for _ in range(50)]
    assert [backoff.failed(attempt) for attempt in in_flight[:-1]].count(True) == 1
    assert backoff.delay == 1.0
    clock.now += 1.0
    probe = admitted(backoff)
    assert not backoff.failed(in_flight[-1])  # a late one is not the probe's failure
    assert backoff.admit() is None
    assert not backoff.failed(probe) and backoff.delay == 2.0


def test_an_abandoned_probe_lets_another_probe() -> None:
    clock = Clock()
    backoff = Backoff(clock)
    failing(backoff)
    clock.now += backoff.delay
    probe = admitted(backoff)
    assert backoff.admit() is None
    backoff.abandoned(probe)
    assert backoff.admit() is not None
    assert not backoff.available and backoff.delay == 1.0  # no outcome: nothing learnt
