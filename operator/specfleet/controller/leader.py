"""Leader election on a coordination.k8s.io Lease, as client-go's leaderelection does it: of
the operator's replicas only the one holding the Lease acts (reconciles, guards, sends alerts);
the others keep their watches warm and take over when the Lease expires.

- A candidate acquires the Lease when nobody holds it, or when its holder has not renewed it for
  `leaseDurationSeconds` as measured on the candidate's own monotonic clock from when it first
  saw that record (no comparison of two machines' wall clocks: skew cannot hand the Lease over
  early).
- Every write is a replace with the resourceVersion read (optimistic concurrency): of two
  candidates at once the API server lets one through and answers the other 409.
- The leader renews every retry period. It leads until `renew_deadline` after the start of its
  last successful attempt (`leading(now)`, a pure function of the clock); a paused process or a
  partitioned one stops acting there without a request, strictly before another can acquire,
  since any other candidate saw that renewal no earlier than it was sent and waits a whole
  `lease` after that (renew_deadline < lease).
- On a clean stop the leader gives the Lease up (holder emptied), so a rolling upgrade hands
  over at once instead of after a lease.

The clock is an argument (`now`: monotonic seconds); the Lease API is a Protocol, with the
kubernetes client's CoordinationV1Api behind it in production (`KubeLeases`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Protocol

log = logging.getLogger(__name__)


class NotLeading(Exception):
    """A write refused because this replica does not hold the Lease (any more)."""


class Conflict(Exception):
    """The Lease changed since it was read (409), or another created it first."""


@dataclass(frozen=True)
class Timings:
    """controller-runtime's defaults: 15 s lease, 10 s renew deadline, 2 s retry."""

    lease_seconds: float = 15.0
    renew_deadline_seconds: float = 10.0
    retry_seconds: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.retry_seconds < self.renew_deadline_seconds < self.lease_seconds:
            raise ValueError(
                "leader election needs 0 < retry < renew deadline < lease, got "
                f"{self.retry_seconds}, {self.renew_deadline_seconds}, {self.lease_seconds}"
            )


@dataclass(frozen=True)
class Lease:
    """A Lease's spec as leader election reads and writes it, and its resourceVersion."""

    holder: str | None
    lease_seconds: int
    acquired: datetime | None = None
    renewed: datetime | None = None
    transitions: int = 0
    version: str | None = None


class LeaseApi(Protocol):
    def read(self) -> Lease | None:
        """The Lease, or None when there is none."""

    def create(self, lease: Lease) -> Lease:
        """Raises Conflict when it exists already."""

    def replace(self, lease: Lease) -> Lease:
        """Writes `lease` if the Lease's resourceVersion is still `lease.version`; else Conflict."""


class Elector:
    """One candidate. `attempt` does the I/O (one read, at most one write); `leading` decides
    from the clock alone, so a write can ask it just before going out."""

    def __init__(
        self,
        identity: str,
        api: LeaseApi,
        timings: Timings | None = None,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.identity = identity
        self.api = api
        self.timings = timings or Timings()
        self._wall = wall
        self._lock = threading.Lock()
        self._renewed_at: float | None = None
        """Monotonic time at the start of the last attempt that acquired or renewed."""
        self._observed: Lease | None = None
        self._observed_at = 0.0
        """Monotonic time when the Lease's record (holder, renewTime) was first seen as it is."""
        self.holder: str | None = None
        """Who holds the Lease, as last read."""

    def leading(self, now: float) -> bool:
        with self._lock:
            renewed = self._renewed_at
        return renewed is not None and now < renewed + self.timings.renew_deadline_seconds

    def attempt(self, now: float) -> bool:
        """One try to acquire or renew, `now` taken before any request. Whether it leads after."""
        try:
            current = self.api.read()
            if current is None:
                return self._won(self.api.create(self._record(None)), now)
            self._observe(current, now)
            mine = current.holder == self.identity
            if not mine and self._held(current, now):
                self._lost()
                return False
            return self._won(self.api.replace(self._record(current)), now)
        except Conflict:
            log.debug("lease changed under %s; trying again next period", self.identity)
        except Exception as exc:  # the API server unreachable: the deadline decides
            log.warning("lease read or write by %s failed: %s", self.identity, exc)
        return self.leading(now)

    def release(self) -> None:
        """Stops leading now and, if the Lease is still ours, empties its holder so a follower
        takes over at its next attempt. Best effort: the Lease expires anyway."""
        was = self._renewed_at is not None
        self._lost()
        if not was:
            return
        try:
            current = self.api.read()
            if current is not None and current.holder == self.identity:
                self.api.replace(replace(current, holder=None, lease_seconds=1))
                self.holder = None
                log.info("%s released the lease", self.identity)
        except Exception as exc:
            log.warning("releasing the lease failed (it expires anyway): %s", exc)

    def _record(self, current: Lease | None) -> Lease:
        wall = self._wall()
        lease_seconds = max(1, round(self.timings.lease_seconds))
        if current is not None and current.holder == self.identity:
            return replace(current, lease_seconds=lease_seconds, renewed=wall)
        transitions = current.transitions + 1 if current is not None else 0
        version = current.version if current is not None else None
        return Lease(self.identity, lease_seconds, wall, wall, transitions, version)

    def _observe(self, current: Lease, now: float) -> None:
        seen = self._observed
        if seen is None or (seen.holder, seen.renewed) != (current.holder, current.renewed):
            self._observed, self._observed_at = current, now
        self.holder = current.holder

    def _held(self, current: Lease, now: float) -> bool:
        """Another holds it and has renewed it within its lease, as this candidate saw it."""
        if not current.holder:
            return False  # released
        return now < self._observed_at + current.lease_seconds

    def _won(self, written: Lease, now: float) -> bool:
        with self._lock:
            self._renewed_at = now
        self._observed, self._observed_at, self.holder = written, now, written.holder
        return True

    def _lost(self) -> None:
        with self._lock:
            self._renewed_at = None


class Leadership:
    """Runs an Elector in a thread of its own (not kopf's event loop, not the workers' pool:
    a busy operator must not miss its renewals) and tells `on_change` when it starts or stops
    leading, from that thread."""

    def __init__(
        self,
        elector: Elector,
        on_change: Callable[[bool], None] = lambda leading: None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.elector = elector
        self.on_change = on_change
        self.monotonic = monotonic
        self._stop = threading.Event()
        self._was = False
        self._thread = threading.Thread(target=self._run, name="leader-election", daemon=True)

    def leading(self) -> bool:
        return self.elector.leading(self.monotonic())

    def check(self) -> None:
        """Raises NotLeading unless this replica leads now: called before every write."""
        if not self.leading():
            raise NotLeading(f"{self.elector.identity} does not hold the lease")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(self.elector.timings.retry_seconds * 2)
        self.elector.release()
        self._notice(False)

    def _run(self) -> None:
        retry = self.elector.timings.retry_seconds
        while not self._stop.is_set():
            self.elector.attempt(self.monotonic())
            self._notice(self.leading())
            self._stop.wait(retry)  # the Lease's requests time out within a retry period

    def _notice(self, leading: bool) -> None:
        if leading == self._was:
            return
        self._was = leading
        holder = self.elector.holder
        identity = self.elector.identity
        if leading:
            log.info("%s acquired the lease and leads", identity)
        elif holder in (None, identity):  # released on a clean stop, or not renewed in time
            log.warning("%s stopped leading", identity)
        else:
            log.warning("%s stopped leading (the lease is %s's)", identity, holder)
        try:
            self.on_change(leading)
        except Exception:
            log.exception("acting on a change of leadership failed")


class KubeLeases:
    """The Lease `namespace/name` through the kubernetes client (CoordinationV1Api). Each request
    times out within `timeout` seconds, so a hung API server cannot stall the elector's thread
    past its deadline by much."""

    def __init__(self, api: Any, namespace: str, name: str, timeout: float) -> None:
        from kubernetes import client

        self._client = client
        self._api = client.CoordinationV1Api(api)
        self.namespace, self.name, self.timeout = namespace, name, timeout

    def read(self) -> Lease | None:
        from kubernetes.client.exceptions import ApiException

        try:
            lease = self._api.read_namespaced_lease(
                self.name, self.namespace, _request_timeout=self.timeout
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return _from_wire(lease)

    def create(self, lease: Lease) -> Lease:
        body = self._to_wire(lease)
        return self._conflicting(
            lambda: self._api.create_namespaced_lease(
                self.namespace, body, _request_timeout=self.timeout
            )
        )

    def replace(self, lease: Lease) -> Lease:
        body = self._to_wire(lease)
        return self._conflicting(
            lambda: self._api.replace_namespaced_lease(
                self.name, self.namespace, body, _request_timeout=self.timeout
            )
        )

    def _conflicting(self, request: Callable[[], Any]) -> Lease:
        from kubernetes.client.exceptions import ApiException

        try:
            return _from_wire(request())
        except ApiException as exc:
            if exc.status == 409:
                raise Conflict(str(exc.reason)) from None
            raise

    def _to_wire(self, lease: Lease) -> Any:
        c = self._client
        return c.V1Lease(
            metadata=c.V1ObjectMeta(
                name=self.name, namespace=self.namespace, resource_version=lease.version
            ),
            spec=c.V1LeaseSpec(
                holder_identity=lease.holder,
                lease_duration_seconds=lease.lease_seconds,
                acquire_time=lease.acquired,
                renew_time=lease.renewed,
                lease_transitions=lease.transitions,
            ),
        )


def _from_wire(lease: Any) -> Lease:
    spec = lease.spec
    return Lease(
        holder=spec.holder_identity or None,
        lease_seconds=spec.lease_duration_seconds or 0,
        acquired=spec.acquire_time,
        renewed=spec.renew_time,
        transitions=spec.lease_transitions or 0,
        version=lease.metadata.resource_version,
    )
