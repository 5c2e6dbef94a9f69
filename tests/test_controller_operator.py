"""The operator's state between events, without a cluster: retry backoff, the status it wrote,
the children it applied moments ago, what `forget` drops, which SpecModels a guard tick reads,
and the alert receivers it reads from Secrets."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest
from kubernetes.client.exceptions import ApiException

from conftest import merge, specmodel_doc
from specfleet.alerts.sender import AlertSender
from specfleet.api import KILL_SWITCH_ANNOTATION, SpecModelStatus, parse_specmodel
from specfleet.controller import operator as operator_module
from specfleet.controller.kube import Kube
from specfleet.controller.metrics import REGISTRY
from specfleet.controller.operator import MAX_BACKOFF_SECONDS, RECENT_SECONDS, Operator
from specfleet.controller.receivers import REFRESH_SECONDS
from specfleet.telemetry.model import Observation
from specfleet.telemetry.reader import Target, TelemetryReader
from specfleet.tick.next_tick import next_tick

NOW = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)
KEY = ("ns", "m")
SPEC = {"speculative": {"method": "ngram", "numSpeculativeTokens": 3}}
WEBHOOK: dict[str, Any] = {"guard": {"alerts": {"webhookSecret": {"name": "hooks", "key": "url"}}}}
Body = dict[str, Any]


@dataclass
class RecordingKube:
    """`Kube`'s methods, recording every call; applies fail while `failing` is set."""

    calls: list[tuple[Any, ...]] = field(default_factory=list)
    secrets: dict[tuple[str, str, str], str] = field(default_factory=dict)
    failing: bool = False

    def apply(self, manifest: Body) -> None:
        self.calls.append(("apply", manifest["kind"], manifest["metadata"]["name"]))
        if self.failing:
            raise ApiException(status=500, reason="Internal Server Error")

    def delete(self, api_version: str, kind: str, namespace: str, name: str) -> None:
        self.calls.append(("delete", kind, name))

    def apply_status(self, namespace: str, name: str, status: Body) -> None:
        self.calls.append(("status", name, status))

    def read_revision(self, namespace: str, name: str) -> Body:
        raise AssertionError("the tests' SpecModels keep their revisions' configs in memory")

    def read_secret(self, namespace: str, name: str, key: str) -> str:
        self.calls.append(("secret", name, key))
        if (namespace, name, key) not in self.secrets:
            raise ApiException(status=404, reason="Not Found")
        return self.secrets[(namespace, name, key)]

    def event(
        self, involved: Body, kind: str, reason: str, message: str, name: str | None = None
    ) -> None:
        self.calls.append(("event", reason))

    def event_exists(self, namespace: str, name: str) -> bool:
        self.calls.append(("event?", name))
        return True

    def made(self, verb: str) -> list[tuple[Any, ...]]:
        return [call for call in self.calls if call[0] == verb]


@dataclass
class Clock:
    seconds: float = 1000.0

    def monotonic(self) -> float:
        return self.seconds


@dataclass
class RecordingReader:
    reads: list[list[Target]] = field(default_factory=list)

    def read(self, targets: list[Target], now: datetime) -> dict[tuple[str, str], Observation]:
        self.reads.append(targets)
        return {}


@dataclass
class RecordingSender:
    updates: list[tuple[tuple[str, str], list[Any], list[Any]]] = field(default_factory=list)
    forgotten: list[tuple[str, str]] = field(default_factory=list)

    def update(self, key: tuple[str, str], alerts: list[Any], receivers: list[Any]) -> None:
        self.updates.append((key, alerts, receivers))

    def forget(self, key: tuple[str, str]) -> None:
        self.forgotten.append(key)


def world(**extra: Any) -> tuple[Operator, RecordingKube, Clock]:
    kube, clock = RecordingKube(), Clock()
    operator = Operator(cast(Kube, kube), clock=lambda: NOW, monotonic=clock.monotonic, **extra)
    return operator, kube, clock


def body(name: str = "m", generation: int = 1, status: Body | None = None, **spec: Any) -> Body:
    doc = specmodel_doc(**merge(SPEC, spec))
    doc["metadata"] |= {"name": name, "uid": f"uid-{name}", "generation": generation}
    return {**doc, "status": status or {}}


def run(operator: Operator, *bodies: Body) -> Any:
    index = {("ns", b["metadata"]["name"]): [b] for b in bodies}
    return operator.reconcile(("ns", bodies[0]["metadata"]["name"]), index, [], {})


def test_a_failed_apply_backs_off_doubling_up_to_the_cap_and_success_clears_it() -> None:
    operator, kube, clock = world()
    kube.failing = True
    assert operator.retry_in(KEY) is None
    delays = []
    for _ in range(12):
        assert run(operator, body()).error is not None
        delay = operator.retry_in(KEY)
        assert delay is not None
        delays.append(delay)
        clock.seconds += delay
    assert delays[:4] == [1.0, 2.0, 4.0, 8.0]
    assert delays[-1] == delays[-2] == MAX_BACKOFF_SECONDS
    kube.failing = False
    assert run(operator, body()).error is None
    assert operator.retry_in(KEY) is None


def test_no_reconcile_while_backing_off_and_retry_in_counts_down() -> None:
    operator, kube, clock = world()
    kube.failing = True
    run(operator, body())
    calls = len(kube.calls)
    clock.seconds += 0.25
    assert run(operator, body()) is None
    assert len(kube.calls) == calls
    assert operator.retry_in(KEY) == 0.75
    clock.seconds += 5
    assert operator.retry_in(KEY) == 0.0


def test_the_status_written_is_built_on_until_the_generation_moves_on() -> None:
    operator, kube, _ = world()
    run(operator, body())
    assert len(kube.made("status")) == 1
    run(operator, body())  # the watch has not delivered the status yet: nothing to write again
    assert len(kube.made("status")) == 1
    deeper = body(generation=2, speculative={"numSpeculativeTokens": 4})
    outcome = run(operator, deeper)  # built on the watch's (empty) status, not the one written
    assert [r.number for r in outcome.status.revisions] == [1]


def test_a_specmodel_created_again_never_inherits_the_status_written_for_the_old_one() -> None:
    operator, _, _ = world()
    run(operator, body(speculative={"numSpeculativeTokens": 4}))
    again = body()  # same name and generation, a new object: its DELETED event was missed
    again["metadata"]["uid"] = "uid-m-again"
    outcome = run(operator, again)
    assert [r.number for r in outcome.status.revisions] == [1]


def test_children_applied_moments_ago_count_as_present_until_they_expire() -> None:
    operator, kube, clock = world()
    run(operator, body())
    deployments = [call for call in kube.made("apply") if call[1] == "Deployment"]
    assert len(deployments) == 1
    clock.seconds += RECENT_SECONDS - 1
    run(operator, body())  # the watches show no children yet
    assert [call for call in kube.made("apply") if call[1] == "Deployment"] == deployments
    clock.seconds += 2
    run(operator, body())
    assert len([call for call in kube.made("apply") if call[1] == "Deployment"]) == 2


def test_forget_drops_backoff_and_the_written_status_and_resolves_alerts() -> None:
    sender = RecordingSender()
    operator, kube, _ = world(alerts=cast(AlertSender, sender))
    kube.secrets[("ns", "hooks", "url")] = "http://hooks.example/x"
    kube.failing = True
    run(operator, body(**WEBHOOK))
    assert operator.retry_in(KEY) is not None
    operator.forget(KEY)
    assert operator.retry_in(KEY) is None
    _, alerts, receivers = sender.updates[-1]
    assert alerts == [] and [r.name for r in receivers] == ["webhook"]
    assert sender.forgotten == [KEY]
    kube.failing = False
    writes = len(kube.made("status"))
    run(operator, body())
    assert len(kube.made("status")) == writes + 1  # no written status left to build on


def evaluated(seconds_ago: float, plan: bool = True) -> Body:
    status: Body = {"guard": {"lastEvaluation": (NOW - timedelta(seconds=seconds_ago)).isoformat()}}
    if plan:
        status["servingPlan"] = {"revision": 1, "speculation": True}
    return status


def test_a_guard_tick_reads_one_batch_for_the_due_specmodels_only() -> None:
    reader = RecordingReader()
    operator, kube, _ = world(reader=cast(TelemetryReader, reader))
    guard = {"intervalSeconds": 30, "windowSeconds": 120}
    bodies = [
        body("due", status=evaluated(31), guard=guard),
        body("recent", status=evaluated(10), guard=guard),
        body("never", status={"servingPlan": {"revision": 2, "speculation": False}}),
        body("planless", status=evaluated(60, plan=False)),
        body("invalid", status=evaluated(60), defaultClass="nowhere"),
    ]
    index = {("ns", b["metadata"]["name"]): [b] for b in bodies}
    operator.guard_tick(index, [], {})
    assert reader.reads == [
        [Target("ns", "due", 120, 1, True), Target("ns", "never", 60, 2, False)]
    ]
    reconciled = {call[1] for call in kube.made("status")}
    assert reconciled == {"due", "never", "planless"}


def test_a_rollout_in_progress_has_its_canary_read_beside_the_control() -> None:
    reader = RecordingReader()
    operator, _, _ = world(reader=cast(TelemetryReader, reader))
    rollout = {
        "revision": 3,
        "control": 2,
        **{"step": 1, "steps": 2, "pods": 1, "windows": 3, "started": NOW.isoformat()},
        "phase": "Progressing",
    }
    status = {"servingPlan": {"revision": 2, "speculation": False}, "rollout": rollout}
    ended = {**status, "rollout": {**rollout, "phase": "Aborted"}}
    bodies = [body("rolling", status=status), body("aborted", status=ended)]
    operator.guard_tick({("ns", b["metadata"]["name"]): [b] for b in bodies}, [], {})
    assert reader.reads == [
        [
            Target("ns", "rolling", 60, 2, False, canary=(3, False)),
            Target("ns", "aborted", 60, 2, False),
        ]
    ]


def test_a_guard_tick_reads_what_the_last_tick_said_when_it_said() -> None:
    """The operator acts on the tick's statement (`Step.next_tick`) of the status it wrote: due
    one interval (less the slack) after the evaluation, reading the plan that status serves."""
    reader = RecordingReader()
    now = [NOW]
    operator, kube, _ = world(reader=cast(TelemetryReader, reader))
    operator.clock = lambda: now[0]
    guard = {"intervalSeconds": 30, "windowSeconds": 120}
    operator.guard_tick({KEY: [body(guard=guard)]}, [], {})  # never evaluated: due at once
    assert reader.reads == []  # nothing planned yet, nothing to read
    written = kube.made("status")[-1][2]
    said = next_tick(parse_specmodel(body(guard=guard)), SpecModelStatus.model_validate(written))
    assert said.due_at == NOW + timedelta(seconds=29.5) and said.fleet == (1, True)
    index = {KEY: [body(guard=guard, status=written)]}
    now[0] = NOW + timedelta(seconds=29.4)
    writes = len(kube.made("status"))
    operator.guard_tick(index, [], {})
    assert reader.reads == [] and len(kube.made("status")) == writes  # not due
    now[0] = NOW + timedelta(seconds=29.5)
    operator.guard_tick(index, [], {})
    assert reader.reads[-1] == [Target("ns", "m", 120, 1, True)]


def test_a_spec_is_parsed_once_per_generation(monkeypatch: pytest.MonkeyPatch) -> None:
    parsed: list[str] = []

    def counting(document: Body) -> Any:
        parsed.append(document["metadata"]["name"])
        return parse_specmodel(document)

    monkeypatch.setattr(operator_module, "parse_specmodel", counting)
    operator, _, _ = world(reader=cast(TelemetryReader, RecordingReader()))
    recent = evaluated(1)
    for generation in (1, 1, 1, 2):
        operator.guard_tick({KEY: [body(generation=generation, status=recent)]}, [], {})
    assert parsed == ["m", "m"]


def test_receivers_are_read_once_per_generation_and_again_after_a_while() -> None:
    sender = RecordingSender()
    operator, kube, clock = world(alerts=cast(AlertSender, sender))
    kube.secrets[("ns", "hooks", "url")] = "http://hooks.example/x"
    for _ in range(3):
        run(operator, body(**WEBHOOK))
    assert len(kube.made("secret")) == 1
    assert [r.name for r in sender.updates[-1][2]] == ["webhook"]
    clock.seconds += REFRESH_SECONDS
    run(operator, body(**WEBHOOK))
    assert len(kube.made("secret")) == 2
    run(operator, body(generation=2, **WEBHOOK))
    assert len(kube.made("secret")) == 3


def test_an_unreadable_secret_keeps_the_last_receivers_and_is_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sender = RecordingSender()
    operator, kube, clock = world(alerts=cast(AlertSender, sender))
    kube.secrets[("ns", "hooks", "url")] = "http://hooks.example/x"
    run(operator, body(**WEBHOOK))
    del kube.secrets[("ns", "hooks", "url")]
    with caplog.at_level(logging.WARNING, logger="specfleet.controller.receivers"):
        for _ in range(3):
            clock.seconds += REFRESH_SECONDS
            run(operator, body(**WEBHOOK))
    assert len(kube.made("secret")) == 4
    assert [r.message for r in caplog.records] == [
        "alert receivers of ns/m: Secret hooks key url: API server answered 404 Not Found"
    ]
    assert [r.name for r in sender.updates[-1][2]] == ["webhook"]
    assert unreadable() == 1.0
    kube.secrets[("ns", "hooks", "url")] = "http://hooks.example/y"
    clock.seconds += REFRESH_SECONDS
    run(operator, body(**WEBHOOK))
    assert unreadable() == 0.0


def unreadable() -> float | None:
    labels = {"namespace": "ns", "specmodel": "m"}
    return REGISTRY.get_sample_value("specfleet_alert_receivers_unreadable", labels)


def test_specmodels_are_counted_by_namespace_and_phase() -> None:
    operator, _, _ = world()
    doc = body()
    doc["metadata"]["namespace"] = "counted"
    operator.reconcile(("counted", "m"), {("counted", "m"): [doc]}, [], {})
    labels = {"namespace": "counted", "phase": "Progressing"}
    assert REGISTRY.get_sample_value("specfleet_specmodels", labels) == 1.0
    operator.forget(("counted", "m"))
    assert REGISTRY.get_sample_value("specfleet_specmodels", labels) == 0.0


def test_the_kill_switch_gauge_names_who_holds_it_and_goes_with_the_specmodel() -> None:
    operator, _, _ = world()
    doc = body()
    doc["metadata"]["namespace"] = "held"
    doc["metadata"]["annotations"] = {KILL_SWITCH_ANNOTATION: "engage"}
    operator.reconcile(("held", "m"), {("held", "m"): [doc]}, [], {})

    def held(source: str) -> float | None:
        labels = {"namespace": "held", "specmodel": "m", "source": source}
        return REGISTRY.get_sample_value("specfleet_kill_switch_engaged", labels)

    assert (held("annotation"), held("guard"), held("spec")) == (1.0, 0.0, 0.0)
    operator.forget(("held", "m"))
    assert (held("annotation"), held("guard"), held("spec")) == (None, None, None)


def test_reconciles_parse_a_spec_once_and_again_when_its_annotations_change(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    parsed: list[str] = []

    def counting(document: Body) -> Any:
        parsed.append(document["metadata"]["name"])
        return parse_specmodel(document)

    monkeypatch.setattr(operator_module, "parse_specmodel", counting)
    operator, _, _ = world()
    run(operator, body())
    run(operator, body())
    assert parsed == ["m"]
    engaged = body()
    engaged["metadata"]["annotations"] = {KILL_SWITCH_ANNOTATION: "engage"}
    outcome = run(operator, engaged)  # the kill-switch annotation changes no generation
    assert parsed == ["m", "m"]
    assert outcome.status.serving_plan.speculation is False
