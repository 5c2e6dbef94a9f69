"""The operator's state between events: the API writer, render settings, telemetry, alert
delivery, per-SpecModel locks and retry backoff, and each SpecModel's spec parsed once per
generation. kopf handlers call in from worker threads; nothing here runs on the event loop."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import httpx

from specfleet.alerts.model import firing
from specfleet.alerts.receivers import Receiver
from specfleet.alerts.sender import AlertSender
from specfleet.api import InvalidSpecModel, SpecModel, SpecModelStatus, parse_specmodel
from specfleet.api.experiment import SpecExperiment, SpecExperimentStatus
from specfleet.api.validation import InvalidSpecExperiment, parse_specexperiment
from specfleet.controller.experiments import CapacityLive, reconcile_experiment
from specfleet.controller.kube import Kube
from specfleet.controller.last_written import LastWritten, uid_of
from specfleet.controller.metrics import (
    ACTIVE_REVISION,
    GUARD_BLIND,
    GUARD_DECISIONS,
    RECONCILE_SECONDS,
    RECONCILES,
    ROLLBACKS,
    ROLLOUT_CANARY_PODS,
    ROLLOUT_STEP,
    SPECMODELS,
    forget_classes,
    forget_kill_switch,
    record_classes,
    record_kill_switch,
    record_rollout,
)
from specfleet.controller.receivers import ReceiverCache
from specfleet.controller.reconcile import Live, Outcome, reconcile, status_of
from specfleet.controller.revisions import RevisionConfigs
from specfleet.experiment.mirror import mirror_of
from specfleet.experiment.sample import get_sample
from specfleet.guard.actions import ActionKind
from specfleet.render import RenderSettings
from specfleet.telemetry.reader import Target, TelemetryReader
from specfleet.tick import children
from specfleet.tick.next_tick import NextTick, next_tick
from specfleet.tick.step import GuardTick

ROLLED_BACK = (ActionKind.ROLLED_BACK, ActionKind.ROLLOUT_ABORTED)
"""What counts as a rollback: the fleet's, and a canary rollout's abort."""

Body = dict[str, Any]
Key = tuple[str, str]
"""(namespace, SpecModel name)."""
Index = Mapping[Key, Iterable[Body]]
log = logging.getLogger(__name__)

MAX_BACKOFF_SECONDS = 300.0
FIRST_BACKOFF_SECONDS = 1.0
RECENT_SECONDS = 10.0
MEASURE_SECONDS = 15.0
MEASURE_SLACK_SECONDS = 0.5
Stamp = tuple[str | None, int | None, tuple[tuple[str, str], ...]]
"""(uid, generation, annotations): one spec of one SpecModel."""


@dataclass
class Operator:
    kube: Kube
    settings: RenderSettings = field(default_factory=RenderSettings)
    reader: TelemetryReader | None = None
    alerts: AlertSender | None = None
    receivers: list[Receiver] = field(default_factory=list)
    """Operator-wide receivers (--alertmanager-url); SpecModels may add their own."""
    clock: Callable[[], datetime] = lambda: datetime.now(UTC)
    monotonic: Callable[[], float] = time.monotonic
    """For backoff and caches: seconds that only move forward."""
    _locks: dict[Key, threading.Lock] = field(default_factory=dict)
    _guard: threading.Lock = field(default_factory=threading.Lock)
    _backoff: dict[Key, tuple[float, float]] = field(default_factory=dict)
    """Key -> (next attempt at, current delay) after failed applies: no retry storms."""
    _http: httpx.Client = field(default_factory=httpx.Client)
    _own_receivers: ReceiverCache = field(init=False)
    _specs: dict[Key, tuple[Stamp, SpecModel | InvalidSpecModel]] = field(default_factory=dict)
    """The spec parsed once per generation and annotations, or why it is invalid."""
    _configs: RevisionConfigs = field(init=False)
    _phases: dict[Key, str] = field(default_factory=dict)
    """The phase each SpecModel was last reconciled into (`specfleet_specmodels`)."""
    _written: LastWritten[SpecModelStatus] = field(default_factory=LastWritten)
    _applied: dict[Key, tuple[float, dict[children.ChildKey, str]]] = field(default_factory=dict)
    """Children hashes applied in the last RECENT_SECONDS, until the watches catch up."""
    _measured: dict[Key, float] = field(default_factory=dict)
    """When each experiment's arms were last measured."""
    _experiments_written: LastWritten[SpecExperimentStatus] = field(default_factory=LastWritten)
    _told: set[Key] = field(default_factory=set)
    """SpecModels reconciled since this replica started acting: their recent decisions' Events
    were checked for ones the last leader did not live to post."""

    def __post_init__(self) -> None:
        self._own_receivers = ReceiverCache(self.kube, self._http, self.monotonic)
        self._configs = RevisionConfigs(self.kube)

    def reconcile(
        self,
        key: Key,
        specmodels: Index,
        child_indexes: list[Index],
        pods: Index,
        tick: GuardTick | None = None,
        experiments: Index | None = None,
    ) -> Outcome | None:
        body = next(iter(specmodels.get(key, [])), None)
        if body is None or self._backing_off(key):
            return None
        with self._lock(key), RECONCILE_SECONDS.time():
            live = _live(key, child_indexes, pods, self._recently_applied(key))
            written = self._written_for(key, body)
            parsed = self._parsed(key, body)
            if isinstance(parsed, SpecModel):
                live = replace(live, mirror=mirror_of(_experiments(key, experiments), parsed))
            outcome = reconcile(
                body,
                parsed,
                live,
                self.kube,
                self.settings,
                self.clock(),
                tick,
                written,
                self._configs,
                guard_on=self.reader is not None,
                first=key not in self._told,
            )
            self._told.add(key)
            self._written.remember(key, body, outcome.status)
            if outcome.applied_hashes:
                self._applied[key] = (self.monotonic(), outcome.applied_hashes)
        self._record(key, outcome)
        self._alert(key, body, outcome)
        return outcome

    def reconcile_experiment(
        self,
        key: Key,
        experiments: Index,
        specmodels: Index,
        arm_indexes: list[Index],
        capacity_pods: Index | None = None,
        pods: Index | None = None,
    ) -> None:
        """`capacity_pods`: the load tests' pods by experiment; `pods`: the fleets' by
        SpecModel."""
        body = next(iter(experiments.get(key, [])), None)
        if body is None:
            self._measured.pop(key, None)
            self._experiments_written.forget(key)
            return
        ref = body.get("spec", {}).get("specModelRef", {}).get("name", "")
        specmodel = next(iter(specmodels.get((key[0], ref), [])), None)
        arms = {children.key(b): b for index in arm_indexes for b in index.get(key, [])}
        capacity = CapacityLive(
            pods=list((capacity_pods or {}).get(key, [])),
            fleet_pods=list((pods or {}).get((key[0], ref), [])),
            fetch=lambda url, experiment, token: get_sample(self._http, url, experiment, token),
        )
        reader = self.reader if self._measure_due(key) else None
        status = reconcile_experiment(
            body,
            specmodel,
            arms,
            self.kube,
            self.settings,
            self.clock(),
            reader,
            capacity,
            self._experiments_written.get(key, body),
        )
        self._experiments_written.remember(key, body, status)

    def experiments_due(self, experiments: Iterable[Key], now: float) -> list[Key]:
        """The experiments whose arms are due a measurement at `now` (on the monotonic clock),
        for the guard tick to reconcile. Their reconciles also retry a capacity phase's sample
        at that cadence; arms coming up and load tests ending bring their own watch events."""
        return [key for key in experiments if self._measure_due_at(key, now)]

    def _measure_due(self, key: Key) -> bool:
        """An experiment's arms are measured once a MEASURE_SECONDS, however often its
        events come."""
        now = self.monotonic()
        if not self._measure_due_at(key, now):
            return False
        self._measured[key] = now
        return True

    def _measure_due_at(self, key: Key, now: float) -> bool:
        # Some slack: the tick that finds a measurement due comes a moment before the reconcile
        # that takes it and notes its time; without it, measurements would slip by a tick.
        elapsed = now - self._measured.get(key, -MEASURE_SECONDS)
        return elapsed >= MEASURE_SECONDS - MEASURE_SLACK_SECONDS

    def guard_tick(
        self,
        specmodels: Index,
        child_indexes: list[Index],
        pods: Index,
        experiments: Index | None = None,
    ) -> None:
        """Evaluates every SpecModel whose guard interval has passed, with one batch of queries:
        when and what each reads is what its last tick said (`Step.next_tick`)."""
        if self.reader is None:
            return
        now = self.clock()
        upcoming = {key: self._next_tick(key, _first(specmodels, key)) for key in list(specmodels)}
        due = {key: tick for key, tick in upcoming.items() if tick is not None and tick.due(now)}
        targets = [t for key, tick in due.items() if (t := _target(key, tick))]
        observations = self.reader.read(targets, now) if targets else {}
        for key in due:
            tick = GuardTick(observations.get(key))
            self.reconcile(key, specmodels, child_indexes, pods, tick, experiments)

    def forget(self, key: Key) -> None:
        self._backoff.pop(key, None)
        self._told.discard(key)
        self._written.forget(key)
        self._applied.pop(key, None)
        self._specs.pop(key, None)
        self._count_phase(key, None)
        with self._guard:
            self._locks.pop(key, None)
        own = self._own_receivers.forget(key)
        if self.alerts:
            self.alerts.update(key, [], [*self.receivers, *own])
            self.alerts.forget(key)
        for gauge in (
            GUARD_BLIND,
            ACTIVE_REVISION,
            ROLLOUT_CANARY_PODS,
            ROLLOUT_STEP,
        ):
            with contextlib.suppress(KeyError):
                gauge.remove(*key)
        forget_classes(*key)
        forget_kill_switch(*key)

    def new_term(self) -> None:
        """This replica starts leading: what it remembers writing or sending may be older than
        what another leader wrote meanwhile, so it builds on the watches' view again."""
        self._backoff.clear()
        self._written = LastWritten()
        self._experiments_written = LastWritten()
        self._applied.clear()
        self._measured.clear()
        self._told.clear()
        if self.alerts:
            self.alerts.forget_all()

    def retry_in(self, key: Key) -> float | None:
        """Seconds until a SpecModel whose apply failed may be tried again; None if it did not
        fail."""
        if key not in self._backoff:
            return None
        next_at, _ = self._backoff[key]
        return max(0.0, next_at - self.monotonic())

    def _written_for(self, key: Key, body: Body) -> SpecModelStatus | None:
        """The status last written for this very object and spec: a SpecModel deleted and
        created again (its DELETED event missed) or whose spec moved on builds on the watch's."""
        written = self._written.get(key, body)
        if written is None or _generation(body) != written.observed_generation:
            return None
        return written

    def _parsed(self, key: Key, body: Body) -> SpecModel | InvalidSpecModel:
        """The SpecModel `body` describes, parsed once per generation and annotations (which
        the plan reads and which change no generation), or why it is invalid."""
        stamp = _stamp(body)
        cached = self._specs.get(key)
        if cached is None or cached[0] != stamp:
            cached = self._specs[key] = (stamp, _parse(body))
        return cached[1]

    def _specmodel(self, key: Key, body: Body) -> SpecModel | None:
        parsed = self._parsed(key, body)
        return parsed if isinstance(parsed, SpecModel) else None

    def _next_tick(self, key: Key, body: Body) -> NextTick | None:
        """The next guard tick as the status the watch has says (None: an invalid spec, never
        evaluated)."""
        specmodel = self._specmodel(key, body)
        if specmodel is None:
            return None
        return next_tick(specmodel, status_of(body) or SpecModelStatus())

    def _recently_applied(self, key: Key) -> dict[children.ChildKey, str]:
        at, hashes = self._applied.get(key, (0.0, {}))
        return hashes if self.monotonic() - at < RECENT_SECONDS else {}

    def _lock(self, key: Key) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(key, threading.Lock())

    def _backing_off(self, key: Key) -> bool:
        next_at, _ = self._backoff.get(key, (0.0, 0.0))
        return self.monotonic() < next_at

    def _record(self, key: Key, outcome: Outcome) -> None:
        namespace, name = key
        result = "ok" if outcome.error is None else "error"
        if outcome.status.phase == "Invalid":
            result = "invalid"
        RECONCILES.labels(namespace, result).inc()
        if result == "error":
            _, delay = self._backoff.get(key, (0.0, 0.0))
            delay = min(max(delay * 2, FIRST_BACKOFF_SECONDS), MAX_BACKOFF_SECONDS)
            self._backoff[key] = (self.monotonic() + delay, delay)
        else:
            self._backoff.pop(key, None)
        self._count_phase(key, outcome.status.phase)
        record_kill_switch(namespace, name, outcome.status)
        if outcome.status.active_revision is not None:
            ACTIVE_REVISION.labels(namespace, name).set(outcome.status.active_revision)
        GUARD_BLIND.labels(namespace, name).set(
            1 if outcome.status.guard and outcome.status.guard.blind else 0
        )
        record_classes(
            namespace, name, outcome.status.guard.classes if outcome.status.guard else []
        )
        record_rollout(namespace, name, outcome.status.rollout)
        for action in outcome.actions:
            if not action.dry_run:
                GUARD_DECISIONS.labels(namespace, action.action).inc()
            if action.acts and action.action in ROLLED_BACK:
                ROLLBACKS.labels(namespace, name).inc()

    def _count_phase(self, key: Key, phase: str | None) -> None:
        with self._guard:
            before = self._phases.pop(key, None)
            if phase is not None:
                self._phases[key] = phase
        if before == phase:
            return
        if before is not None:
            SPECMODELS.labels(key[0], before).dec()
        if phase is not None:
            SPECMODELS.labels(key[0], phase).inc()

    def _alert(self, key: Key, body: Body, outcome: Outcome) -> None:
        if self.alerts is None:
            return
        alerts = firing(key[0], key[1], outcome.status, self.clock())
        self.alerts.update(key, alerts, self._receivers_of(key, body))

    def _receivers_of(self, key: Key, body: Body) -> list[Receiver]:
        """The operator's receivers plus the SpecModel's own (URLs from Secrets)."""
        own = self._own_receivers.of(key, self._specmodel(key, body))
        return [*self.receivers, *own]


def _generation(body: Body) -> int | None:
    generation = body.get("metadata", {}).get("generation")
    return int(generation) if generation is not None else None


def _first(index: Index, key: Key) -> Body:
    return next(iter(index.get(key, [])), {})


def _stamp(body: Body) -> Stamp:
    metadata = body.get("metadata", {})
    annotations = tuple(sorted((metadata.get("annotations") or {}).items()))
    return uid_of(body), _generation(body), annotations


def _parse(body: Body) -> SpecModel | InvalidSpecModel:
    """The spec as the API serves it; its status is the operator's own and parsed apart."""
    try:
        return parse_specmodel({k: v for k, v in body.items() if k != "status"})
    except InvalidSpecModel as exc:
        return exc


def _target(key: Key, tick: NextTick) -> Target | None:
    if tick.fleet is None:
        return None
    fleet, window = tick.fleet, tick.window_seconds
    return Target(key[0], key[1], window, fleet.revision, fleet.speculation, tick.canary)


def experiments_of(specmodel: Key, experiments: Index) -> list[Key]:
    """The SpecExperiments that name the SpecModel, read off their bodies unparsed."""
    return [
        key
        for key, bodies in experiments.items()
        for body in bodies
        if key[0] == specmodel[0]
        and body["spec"].get("specModelRef", {}).get("name") == specmodel[1]
    ]


def _experiments(specmodel: Key, experiments: Index | None) -> list[SpecExperiment]:
    """The valid SpecExperiments that name the SpecModel (an invalid one is its own reconcile's
    to report). Only those are parsed: this runs on every reconcile of every SpecModel."""
    found = []
    for key in experiments_of(specmodel, experiments or {}):
        for body in (experiments or {})[key]:
            with contextlib.suppress(InvalidSpecExperiment):
                found.append(parse_specexperiment(dict(body)))
    return found


def _live(
    key: Key, child_indexes: list[Index], pods: Index, recent: dict[children.ChildKey, str]
) -> Live:
    found = {children.key(body): body for index in child_indexes for body in index.get(key, [])}
    return Live(children=found, pods=list(pods.get(key, [])), recently_applied=recent)
