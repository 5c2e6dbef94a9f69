"""One SpecModel under the real operator shell (`Operator`, `reconcile`, `Kube`) over an API
server in memory (`fake_api`): its history played out window by window, then one reconcile
recorded whole (the requests, the Events, the alerts delivered).

The watches show the API server's objects at once, and a Deployment's pods roll out the moment
it is applied.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import httpx

from conftest import merge, specmodel_doc
from fake_api import FakeApi, kube
from specfleet.alerts.model import Alert
from specfleet.alerts.sender import AlertSender, Delivery
from specfleet.controller.operator import Operator
from specfleet.controller.reconcile import Outcome
from specfleet.telemetry.model import Observation
from specfleet.telemetry.reader import TelemetryReader
from specfleet.tick.children import summary
from specfleet.tick.step import GuardTick
from test_controller_reconcile import complete

KEY = ("ns", "m")
T0 = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
"""Where the operator's monotonic clock starts."""
GUARD_TICK = timedelta(seconds=15)
Body = dict[str, Any]
HTTP = httpx.Client()
"""For every world's operator: one client's TLS set-up took a tenth of a second (no row sends
alerts over HTTP or reads a sample)."""


class SyncSender(AlertSender):
    """The operator's alert sender, deciding what to send as it does, delivering at once."""

    def __init__(self) -> None:
        super().__init__(resend_seconds=3600)
        self.deliveries: list[Delivery] = []

    def _enqueue(self, delivery: Delivery) -> None:
        self.deliveries.append(delivery)


@dataclass
class Receiver:
    name: str = "recording"
    target: str = "memory"

    def send(self, alerts: Sequence[Alert], resolved: bool) -> None:
        raise AssertionError("SyncSender delivers nothing")


@dataclass
class World:
    spec: Body
    api: FakeApi = field(default_factory=FakeApi)
    now: datetime = T0 - timedelta(hours=1)
    generation: int = 1
    deleted: bool = False
    sender: SyncSender = field(init=False)
    operator: Operator = field(init=False)

    def __post_init__(self) -> None:
        self.restart()

    def restart(self) -> None:
        """A new operator process: nothing remembered but what the API server holds."""
        self.sender = SyncSender()
        self.operator = Operator(
            kube(self.api),
            reader=cast(TelemetryReader, object()),  # a guard judges; its reads are the ticks
            alerts=self.sender,
            receivers=[Receiver()],
            clock=lambda: self.now,
            monotonic=lambda: (self.now - EPOCH).total_seconds(),
            _http=HTTP,
        )

    # what the watches show
    def body(self) -> Body:
        doc = specmodel_doc(**self.spec)
        doc["metadata"]["generation"] = self.generation
        if self.deleted:
            doc["metadata"]["deletionTimestamp"] = self.now.isoformat()
        return {**doc, "status": copy.deepcopy(self.api.statuses.get(("SpecModel", "m"), {}))}

    def children(self) -> list[Body]:
        return [
            summary(complete(obj))
            for (kind, _), obj in self.api.objects.items()
            if kind != "ControllerRevision"
        ]

    # what happens to the SpecModel
    def change(self, **spec: Any) -> None:
        """Git applies a new spec."""
        self.spec = merge(self.spec, spec)
        self.generation += 1

    def reconcile(self, tick: GuardTick | None = None) -> Outcome | None:
        return self.operator.reconcile(
            KEY, {KEY: [self.body()]}, [{KEY: self.children()}], {}, tick
        )

    def settle(self) -> None:
        """Reconciles as the watches deliver what the last one wrote, until nothing changes."""
        for _ in range(5):
            before = len(self.api.requests)
            self.reconcile()
            if len(self.api.requests) == before:
                return
        raise AssertionError(f"never settles: {self.api.requests[-10:]}")

    def wait(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)

    def tick(self, *observations: Observation | None) -> None:
        """Guard ticks, one a GUARD_TICK, each followed by the reconciles it causes."""
        for observation in observations:
            self.wait(GUARD_TICK.total_seconds())
            self.reconcile(GuardTick(observation))
            self.settle()
