"""Leader election on a Lease (controller/leader.py), against an in-memory Lease API with the
API server's optimistic concurrency (a replace with a stale resourceVersion is a 409), and a
clock that is an argument."""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from specfleet.controller.leader import (
    Conflict,
    Elector,
    Leadership,
    Lease,
    NotLeading,
    Timings,
)

TIMINGS = Timings(lease_seconds=15, renew_deadline_seconds=10, retry_seconds=2)
EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


class FakeLeases:
    """One Lease; every write bumps its resourceVersion; `down` makes every request fail."""

    def __init__(self) -> None:
        self.lease: Lease | None = None
        self.version = 0
        self.down = False
        self.writes = 0

    def read(self) -> Lease | None:
        self._up()
        return self.lease

    def create(self, lease: Lease) -> Lease:
        self._up()
        if self.lease is not None:
            raise Conflict("exists")
        return self._store(lease)

    def replace(self, lease: Lease) -> Lease:
        self._up()
        if self.lease is None or lease.version != self.lease.version:
            raise Conflict("stale resourceVersion")
        return self._store(lease)

    def _store(self, lease: Lease) -> Lease:
        self.version += 1
        self.writes += 1
        self.lease = replace(lease, version=str(self.version))
        return self.lease

    def _up(self) -> None:
        if self.down:
            raise ConnectionError("API server unreachable")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def wall(self) -> datetime:
        return EPOCH + timedelta(seconds=self.now)


def electors(api: FakeLeases, clock: Clock, *names: str) -> list[Elector]:
    return [Elector(name, api, TIMINGS, wall=clock.wall) for name in names]


def test_the_first_candidate_creates_the_lease_and_leads_the_second_follows() -> None:
    api, clock = FakeLeases(), Clock()
    a, b = electors(api, clock, "a", "b")
    assert a.attempt(0.0)
    assert not b.attempt(0.5)
    assert api.lease is not None and api.lease.holder == "a"
    assert a.leading(0.5) and not b.leading(0.5)
    assert b.holder == "a"


def test_renewing_keeps_the_acquire_time_and_counts_no_transition() -> None:
    api, clock = FakeLeases(), Clock()
    (a,) = electors(api, clock, "a")
    a.attempt(0.0)
    clock.now = 2.0
    a.attempt(2.0)
    assert api.lease is not None
    assert api.lease.acquired == EPOCH and api.lease.renewed == EPOCH + timedelta(seconds=2)
    assert api.lease.transitions == 0 and api.lease.lease_seconds == 15


def test_of_two_candidates_that_read_the_same_lease_only_one_writes_it() -> None:
    """Both saw the Lease expired; the second replace carries a stale resourceVersion."""
    api, clock = FakeLeases(), Clock()
    a, b, c = electors(api, clock, "a", "b", "c")
    c.attempt(0.0)  # c leads, then dies
    b.attempt(0.1)
    a.attempt(0.1)  # both first saw c's record at 0.1
    read = api.read

    def read_then_let_b_write() -> Lease | None:
        seen = read()
        api.read = read  # type: ignore[method-assign]
        assert b.attempt(20.0)  # b reads and replaces in between
        return seen

    api.read = read_then_let_b_write  # type: ignore[method-assign]
    assert not a.attempt(20.0)
    assert api.lease is not None and api.lease.holder == "b" and api.lease.transitions == 1
    assert b.leading(20.0) and not a.leading(20.0)


def test_a_held_lease_is_taken_only_after_a_whole_lease_on_the_follower_s_own_clock() -> None:
    api, clock = FakeLeases(), Clock()
    a, b = electors(api, clock, "a", "b")
    a.attempt(0.0)
    assert not b.attempt(1.0)  # b first sees a's record at 1.0
    assert not b.attempt(15.9)
    assert b.attempt(16.0)
    assert api.lease is not None and api.lease.holder == "b" and api.lease.transitions == 1


def test_a_paused_leader_stops_at_its_renew_deadline_strictly_before_another_acquires() -> None:
    api, clock = FakeLeases(), Clock()
    a, b = electors(api, clock, "a", "b")
    t = 0.0
    while t <= 10.0:  # both running: a renews, b follows
        clock.now = t
        a.attempt(t)
        b.attempt(t + 0.3)
        t += TIMINGS.retry_seconds
    last_renewal = t - TIMINGS.retry_seconds
    # a is paused (SIGSTOP, a long GC, a partition): no more attempts. b keeps trying.
    b_took = None
    a_stopped = None
    step = 0.01
    now = last_renewal
    while b_took is None:
        now = round(now + step, 2)
        if a_stopped is None and not a.leading(now):
            a_stopped = now
        if round((now - last_renewal - 0.3) % TIMINGS.retry_seconds, 2) == 0:
            clock.now = now
            if b.attempt(now):
                b_took = now
        assert not (a.leading(now) and b.leading(now)), now
    assert a_stopped == pytest.approx(last_renewal + TIMINGS.renew_deadline_seconds)
    assert b_took > a_stopped
    assert b_took - a_stopped >= TIMINGS.lease_seconds - TIMINGS.renew_deadline_seconds
    # a wakes up: the Lease is b's, so a does not lead again
    assert not a.attempt(now + 0.5)
    assert api.lease is not None and api.lease.holder == "b"


def test_a_leader_cut_off_from_the_api_server_stops_at_its_deadline() -> None:
    api, clock = FakeLeases(), Clock()
    (a,) = electors(api, clock, "a")
    assert a.attempt(0.0)
    api.down = True
    assert a.attempt(2.0)  # the renewal failed, but the deadline has not passed
    assert a.attempt(9.9)
    assert not a.attempt(10.0)
    api.down = False
    assert a.attempt(12.0)  # the Lease is still its own: it renews and leads again


def test_release_hands_the_lease_over_at_the_follower_s_next_attempt() -> None:
    api, clock = FakeLeases(), Clock()
    a, b = electors(api, clock, "a", "b")
    a.attempt(0.0)
    assert not b.attempt(1.0)
    a.release()
    assert not a.leading(1.1)
    assert api.lease is not None and api.lease.holder is None
    assert b.attempt(1.2)


def test_a_follower_that_releases_writes_nothing() -> None:
    api, clock = FakeLeases(), Clock()
    a, b = electors(api, clock, "a", "b")
    a.attempt(0.0)
    b.attempt(1.0)
    writes = api.writes
    b.release()
    assert api.writes == writes and api.lease is not None and api.lease.holder == "a"


@pytest.mark.parametrize("seed", range(20))
def test_two_candidates_never_lead_at_once_whatever_pauses_and_outages(seed: int) -> None:
    """Random pauses of either process (it makes no attempt) and API outages, in 10 ms steps
    over 10 simulated minutes: at no instant do both lead, and someone leads most of the time."""
    rng = random.Random(seed)
    api, clock = FakeLeases(), Clock()
    candidates = electors(api, clock, "a", "b")
    next_attempt = [0.0, rng.uniform(0, 2)]
    paused_until = [0.0, 0.0]
    down_until = 0.0
    led = 0
    steps = 60_000
    for i in range(steps):
        now = i / 100
        clock.now = now
        api.down = now < down_until
        if rng.random() < 0.0005:
            down_until = now + rng.uniform(0, 20)
        for n, elector in enumerate(candidates):
            if rng.random() < 0.0005:
                paused_until[n] = now + rng.uniform(0, 30)
            if now >= next_attempt[n] and now >= paused_until[n]:
                elector.attempt(now)
                next_attempt[n] = now + TIMINGS.retry_seconds
        leaders = [e.identity for e in candidates if e.leading(now)]
        assert len(leaders) <= 1, (now, leaders)
        led += bool(leaders)
    assert led > steps / 2


def test_timings_need_retry_below_the_renew_deadline_below_the_lease() -> None:
    Timings(4, 3, 1)
    for bad in ((10, 10, 2), (15, 10, 10), (15, 20, 2), (15, 10, 0)):
        with pytest.raises(ValueError, match="retry < renew deadline < lease"):
            Timings(*bad)


def test_leadership_checks_every_write_against_the_clock_and_tells_of_changes() -> None:
    api, clock = FakeLeases(), Clock()
    (a,) = electors(api, clock, "a")
    changes: list[bool] = []
    leadership = Leadership(a, on_change=changes.append, monotonic=lambda: clock.now)
    with pytest.raises(NotLeading):
        leadership.check()
    a.attempt(0.0)
    leadership._notice(leadership.leading())
    leadership.check()
    clock.now = 10.0
    with pytest.raises(NotLeading):
        leadership.check()
    leadership._notice(leadership.leading())
    leadership._notice(leadership.leading())
    assert changes == [True, False]
