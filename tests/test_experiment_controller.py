"""The SpecExperiment's reconcile: arms applied through the children's apply path, status Pending
until every arm is ready then Running, Failed naming the fix, and never a write to the
SpecModel."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import yaml

from conftest import experiment_doc, merge, specmodel_doc
from specfleet.controller.children import ChildKey
from specfleet.controller.experiments import reconcile_experiment
from specfleet.controller.kube import Kube
from specfleet.controller.operator import Operator
from specfleet.render import RenderSettings
from specfleet.telemetry.reader import TelemetryReader
from test_controller_reconcile import FakeKube, complete
from test_experiment_workloads import FOUR_ARMS_SPEC

T0 = datetime(2026, 1, 1, tzinfo=UTC)


@dataclass
class StatusKube(FakeKube):
    statuses: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)

    def apply_status(
        self, namespace: str, name: str, status: dict[str, Any], kind: str = "SpecModel"
    ) -> None:
        self.statuses.append((kind, name, status))


CLASSES = [
    {"name": "chat", "slo": {"maxP95TpotSeconds": 0.05}},
    {"name": "code", "critical": True, "slo": {"maxP95TpotSeconds": 0.05}},
]


def specmodel_body() -> dict[str, Any]:
    return specmodel_doc(**FOUR_ARMS_SPEC, classes=CLASSES, defaultClass="chat")


def run(
    experiment: dict[str, Any],
    specmodel: dict[str, Any] | None,
    arms: dict[ChildKey, dict[str, Any]] | None = None,
    now: datetime = T0,
) -> tuple[StatusKube, dict[str, Any]]:
    kube = StatusKube()
    status = reconcile_experiment(
        experiment, specmodel, arms or {}, cast(Kube, kube), RenderSettings(), now
    )
    return kube, status.to_wire()


def test_arms_are_applied_and_pending_until_ready() -> None:
    kube, status = run(experiment_doc(), specmodel_body())
    assert {
        (m["kind"], m["metadata"]["name"]) for m in kube.applied if m["kind"] != "ConfigMap"
    } == {
        (kind, f"x-{arm}")
        for kind in ("Deployment", "Service", "ServiceMonitor", "PodMonitor")
        for arm in ("baseline", "quantized", "speculative", "both")
    }
    assert status["phase"] == "Pending"
    [ready] = status["conditions"]
    assert (ready["reason"], ready["status"]) == ("ArmsStarting", "False")
    assert "x-baseline 0/1" in ready["message"]
    assert [a["name"] for a in status["arms"]] == ["baseline", "quantized", "speculative", "both"]


def test_running_once_every_arm_is_ready_and_unchanged_arms_are_left_alone() -> None:
    first, _ = run(experiment_doc(), specmodel_body())
    live = {(m["kind"], m["metadata"]["name"]): complete(m) for m in first.applied}
    body = {**experiment_doc(), "status": first.statuses[-1][2]}
    kube, status = run(body, specmodel_body(), live, T0 + timedelta(minutes=5))
    assert kube.applied == [] and kube.deleted == []
    assert status["phase"] == "Running"
    assert status["conditions"][0]["reason"] == "ArmsReady"
    assert status["conditions"][0]["lastTransitionTime"] == (T0 + timedelta(minutes=5)).isoformat()


def test_a_missing_specmodel_fails_naming_the_fix_and_prunes_the_arms() -> None:
    first, _ = run(experiment_doc(), specmodel_body())
    live = {(m["kind"], m["metadata"]["name"]): complete(m) for m in first.applied}
    kube, status = run(experiment_doc(), None, live)
    assert status["phase"] == "Failed"
    [ready] = status["conditions"]
    assert ready["reason"] == "SpecModelNotFound"
    assert "spec.specModelRef.name" in ready["message"]
    assert len(kube.deleted) == len(live) and kube.applied == []


def test_an_invalid_specmodel_or_experiment_fails_and_leaves_the_arms() -> None:
    invalid = specmodel_doc(**{**FOUR_ARMS_SPEC, "engine": {"name": "sglang"}})
    kube, status = run(experiment_doc(), invalid)
    assert (status["phase"], status["conditions"][0]["reason"]) == ("Failed", "SpecModelInvalid")
    assert kube.applied == kube.deleted == []
    kube, status = run(experiment_doc(gpuHourPrice=0), specmodel_body())
    assert status["conditions"][0]["reason"] == "InvalidSpec"
    assert "spec.gpuHourPrice" in status["conditions"][0]["message"]
    kube, status = run(experiment_doc(), specmodel_doc())
    assert status["conditions"][0]["reason"] == "ArmsInvalid"


def test_the_experiment_never_writes_the_specmodel() -> None:
    first, _ = run(experiment_doc(), specmodel_body())
    live = {(m["kind"], m["metadata"]["name"]): complete(m) for m in first.applied}
    for specmodel in (specmodel_body(), None, specmodel_doc()):
        kube, _ = run(experiment_doc(), specmodel, live)
        written = kube.applied + [{"kind": k} for k, _ in kube.deleted]
        arm_kinds = {"Deployment", "Service", "ConfigMap", "ServiceMonitor", "PodMonitor"}
        assert {m["kind"] for m in written} <= arm_kinds
        assert {kind for kind, _, _ in kube.statuses} <= {"SpecExperiment"}
        assert all(name == "x" for _, name, _ in kube.statuses)


def test_the_operator_reads_the_named_specmodel_and_the_experiments_arms_from_the_indexes() -> None:
    kube = StatusKube()
    operator = Operator(cast(Kube, kube), clock=lambda: T0)
    experiments = {("ns", "x"): [experiment_doc()]}
    operator.reconcile_experiment(("ns", "x"), experiments, {("ns", "m"): [specmodel_body()]}, [])
    assert {m["kind"] for m in kube.applied} == {
        "Deployment",
        "ConfigMap",
        "Service",
        "ServiceMonitor",
        "PodMonitor",
    }
    live = {("ns", "x"): [complete(m) for m in kube.applied]}
    kube.applied.clear()
    operator.reconcile_experiment(("ns", "x"), experiments, {}, [live])
    assert kube.applied == [] and len(kube.deleted) == len(live[("ns", "x")])
    assert kube.statuses[-1][2]["conditions"][0]["reason"] == "SpecModelNotFound"


def prometheus(requests: float, tpot: dict[str, float] | None = None) -> TelemetryReader:
    """A reader whose Prometheus answers as the arms' and the fleet's gateways would after
    serving `requests` of every class (`tpot`: p95 TPOT per arm, else 10 ms)."""
    reader = TelemetryReader("http://127.0.0.1:1")
    classes = [c["name"] for c in CLASSES]

    def rows(value: Callable[[str], float]) -> list[dict[str, Any]]:
        return [
            {"metric": {"arm": arm, "class": klass}, "value": [0, str(value(arm))]}
            for arm in ("baseline", "quantized", "speculative", "both")
            for klass in classes
        ]

    def query(text: str, params: dict[str, str]) -> list[dict[str, Any]]:
        if 'experiment="x"' in text and 'namespace="ns"' in text:
            if "specfleet_requests_total" in text and "outcome" not in text:
                return rows(lambda _: requests)
            if "specfleet_request_seconds_total" in text:
                return rows(lambda _: requests * 0.5)
            if "specfleet_tpot_seconds_bucket" in text and "histogram_quantile" in text:
                return rows(lambda arm: (tpot or {}).get(arm, 0.01))
            if "specfleet_ttft_seconds_bucket" in text:
                return rows(lambda _: 0.1)
        if "specfleet_mirror_compared_total" in text and 'specmodel="m"' in text:
            return rows(lambda _: requests / 2)
        if "specfleet_mirror_exact_matches_total" in text:
            return rows(lambda _: requests / 2)
        return []

    reader._prometheus.custom_query = query  # type: ignore[method-assign]
    return reader


def running(now: datetime = T0) -> tuple[dict[str, Any], dict[ChildKey, dict[str, Any]]]:
    """The experiment with its arms up and Running since `now`."""
    first, _ = run(experiment_doc(), specmodel_body(), now=now)
    live = {(m["kind"], m["metadata"]["name"]): complete(m) for m in first.applied}
    body = {**experiment_doc(), "status": first.statuses[-1][2]}
    kube, status = run(body, specmodel_body(), live, now)
    assert status["phase"] == "Running" and status["startedAt"] == now.isoformat()
    assert kube.events == ["ArmsReady"]
    return {**experiment_doc(), "status": status}, live


def measure(
    body: dict[str, Any],
    live: dict[ChildKey, dict[str, Any]],
    reader: TelemetryReader,
    at: datetime,
) -> tuple[StatusKube, dict[str, Any]]:
    kube = StatusKube()
    status = reconcile_experiment(
        body, specmodel_body(), live, cast(Kube, kube), RenderSettings(), at, reader
    )
    return kube, status.to_wire()


def test_the_running_arms_are_measured_and_judged_with_progress_and_a_patch_for_git() -> None:
    body, live = running()
    slow = {"baseline": 0.5}  # misses every class's TPOT SLO
    _, status = measure(body, live, prometheus(10, slow), T0 + timedelta(minutes=1))
    assert status["verdict"]["outcome"] == "inconclusive"  # under the guard's minimum
    assert "leadingArm" not in status and "recommendedPatch" not in status
    kube, status = measure(body, live, prometheus(60, slow), T0 + timedelta(minutes=2))
    assert status["phase"] == "Running"
    assert status["progress"]["percent"] == 60
    assert {r["requests"] for r in status["progress"]["requests"]} == {60}
    assert status["verdict"]["outcome"] == "recommended" and status["leadingArm"] != "baseline"
    assert kube.deleted == []
    body = {**body, "status": status}
    kube, status = measure(body, live, prometheus(120, slow), T0 + timedelta(minutes=4))
    verdict = status["verdict"]
    assert status["phase"] == "Concluded"
    assert verdict["outcome"] == "recommended"
    assert status["leadingArm"] == verdict["recommendation"] != "baseline"
    assert any(e["arm"] == "baseline" for e in verdict["exclusions"])
    agreement = {r["arm"]: r["greedyAgreement"] for r in verdict["overall"]}
    assert agreement["both"] == 1.0
    concluded = next(c for c in status["conditions"] if c["type"] == "Concluded")
    assert concluded["reason"] == "Recommended"
    assert (
        "spec" in yaml.safe_load(status["recommendedPatch"]) or verdict["recommendation"] == "both"
    )
    assert len(kube.deleted) == len(live)  # the arms are retired once concluded
    assert kube.events == ["ExperimentConcluded"]
    kube, again = measure({**body, "status": status}, live, prometheus(0), T0 + timedelta(hours=1))
    assert again["verdict"] == verdict and len(kube.deleted) == len(live)


def test_a_blind_prometheus_keeps_the_last_verdict_and_says_so() -> None:
    body, live = running()
    _, status = measure(body, live, prometheus(60), T0 + timedelta(minutes=2))
    reader = TelemetryReader("http://127.0.0.1:1", timeout_seconds=0.2)  # nothing listens
    kube, blind = measure({**body, "status": status}, live, reader, T0 + timedelta(minutes=4))
    measured = next(c for c in blind["conditions"] if c["type"] == "Measured")
    assert (measured["status"], measured["reason"]) == ("False", "PrometheusUnavailable")
    assert blind["verdict"] == status["verdict"] and blind["progress"] == status["progress"]
    assert blind["phase"] == "Running" and kube.deleted == []
    assert kube.events == ["ExperimentBlind"]


def test_the_duration_concludes_an_experiment_that_saw_too_few_requests() -> None:
    body, live = running()
    body = merge(body, {"spec": {"durationSeconds": 600}})
    _, status = measure(body, live, prometheus(10), T0 + timedelta(minutes=5))
    assert (status["phase"], status["progress"]["percent"]) == ("Running", 50)
    _, status = measure(body, live, prometheus(10), T0 + timedelta(minutes=10))
    assert status["phase"] == "Concluded"
    assert status["verdict"]["outcome"] == "inconclusive" and status.get("leadingArm") is None
    assert "too few requests" in status["verdict"]["reason"]


def test_a_new_spec_restarts_the_sample() -> None:
    body, live = running()
    changed = merge(body, {"metadata": {"generation": 2}, "spec": {"minRequestsPerClass": 50}})
    later = T0 + timedelta(minutes=7)
    _, status = run(changed, specmodel_body(), live, later)
    assert status["startedAt"] == later.isoformat()
