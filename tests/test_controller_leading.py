"""The operator's loops act only while this replica leads: workers pass keys by while it follows,
and starting to lead takes every object again from the watches' view."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from specfleet.controller import handlers
from specfleet.controller.leader import Elector, Leadership, NotLeading, Timings
from specfleet.controller.metrics import REGISTRY
from specfleet.controller.queue import WorkQueue
from test_controller_leader import Clock, FakeLeases

TIMINGS = Timings(4, 3, 1)


class Recording:
    """What a worker asked of the operator."""

    def __init__(self) -> None:
        self.reconciled: list[tuple[str, str]] = []
        self.terms = 0

    def reconcile(self, key: tuple[str, str], *_: Any, **__: Any) -> None:
        self.reconciled.append(key)

    def retry_in(self, key: tuple[str, str]) -> None:
        return None

    def new_term(self) -> None:
        self.terms += 1


def indexes() -> dict[str, Any]:
    found: dict[str, Any] = {name: {} for name in handlers.CHILD_INDEXES}
    found["specmodels"] = {("ns", "a"): [{}], ("ns", "b"): [{}]}
    found["specexperiments"] = {}
    found["pods"] = {}
    return found


def leader_gauge() -> float | None:
    return REGISTRY.get_sample_value("specfleet_leader")


@pytest.mark.asyncio
async def test_a_follower_reconciles_nothing_and_a_new_leader_takes_every_specmodel() -> None:
    clock, api = Clock(), FakeLeases()
    other = Elector("other", api, TIMINGS, wall=clock.wall)
    other.attempt(0.0)  # another replica leads
    mine = Elector("mine", api, TIMINGS, wall=clock.wall)
    leadership = Leadership(mine, monotonic=lambda: clock.now)
    operator = Recording()
    memo: dict[str, Any] = {
        "operator": operator,
        "leadership": leadership,
        "queue": WorkQueue(),
        "experiments": WorkQueue(),
    }
    idx = indexes()
    worker = asyncio.create_task(handlers._work(memo, idx))
    memo["queue"].add(("ns", "a"))
    mine.attempt(0.5)
    assert handlers.leader_probe(memo) == "follower"
    await asyncio.sleep(0.2)
    assert operator.reconciled == [] and len(memo["queue"]) == 0
    clock.now = 5.0  # other's lease (4 s) has run out as mine saw it
    assert mine.attempt(5.0)
    # It holds the Lease, but until the event loop has begun its term (caches of an earlier
    # term forgotten) it does not act.
    memo["queue"].add(("ns", "a"))
    await asyncio.sleep(0.2)
    assert operator.reconciled == [] and not handlers._leading(memo)
    handlers._leadership_changed(memo, idx, True)
    await asyncio.sleep(0.2)
    assert sorted(operator.reconciled) == [("ns", "a"), ("ns", "b")]
    assert operator.terms == 1 and leader_gauge() == 1
    assert handlers.leader_probe(memo) == "leader"
    clock.now = 8.0  # no renewal for the renew deadline: it stops before anyone may take over
    assert handlers.leader_probe(memo) == "follower"
    with pytest.raises(NotLeading):
        leadership.check()
    handlers._leadership_changed(memo, idx, False)
    assert leader_gauge() == 0
    memo["queue"].add(("ns", "a"))
    await asyncio.sleep(0.2)
    assert len(operator.reconciled) == 2
    worker.cancel()


def test_without_leader_election_the_replica_acts_alone() -> None:
    assert handlers._leading({"leadership": None})
    assert handlers.leader_probe({"leadership": None}) == "standalone"


def test_every_write_asks_the_gate_first_and_no_request_goes_out_when_it_refuses() -> None:
    from specfleet.controller.kube import Kube

    def refuse() -> None:
        raise NotLeading("follower")

    kube = Kube.__new__(Kube)  # no API client: a request would fail with AttributeError
    kube._gate = refuse
    body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "namespace": "n"}}
    for write in (
        lambda: kube.apply(body),
        lambda: kube.delete("v1", "ConfigMap", "n", "x"),
        lambda: kube.apply_status("n", "x", {}),
        lambda: kube.event(body, "Normal", "Reason", "message"),
    ):
        with pytest.raises(NotLeading):
            write()
