"""The SpecExperiment's reconcile: arms applied through the children's apply path, status Pending
until every arm is ready then Running, Failed naming the fix, and never a write to the
SpecModel."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from conftest import experiment_doc, specmodel_doc
from specfleet.controller.children import ChildKey
from specfleet.controller.experiments import reconcile_experiment
from specfleet.controller.kube import Kube
from specfleet.controller.operator import Operator
from specfleet.render import RenderSettings
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


def specmodel_body() -> dict[str, Any]:
    return specmodel_doc(**FOUR_ARMS_SPEC)


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
        for kind in ("Deployment", "Service")
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
        assert {m["kind"] for m in written} <= {"Deployment", "Service", "ConfigMap"}
        assert {kind for kind, _, _ in kube.statuses} <= {"SpecExperiment"}
        assert all(name == "x" for _, name, _ in kube.statuses)


def test_the_operator_reads_the_named_specmodel_and_the_experiments_arms_from_the_indexes() -> None:
    kube = StatusKube()
    operator = Operator(cast(Kube, kube), clock=lambda: T0)
    experiments = {("ns", "x"): [experiment_doc()]}
    operator.reconcile_experiment(("ns", "x"), experiments, {("ns", "m"): [specmodel_body()]}, [])
    assert {m["kind"] for m in kube.applied} == {"Deployment", "ConfigMap", "Service"}
    live = {("ns", "x"): [complete(m) for m in kube.applied]}
    kube.applied.clear()
    operator.reconcile_experiment(("ns", "x"), experiments, {}, [live])
    assert kube.applied == [] and len(kube.deleted) == 12
    assert kube.statuses[-1][2]["conditions"][0]["reason"] == "SpecModelNotFound"
