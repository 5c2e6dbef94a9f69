"""The SpecExperiment's reconcile: arms applied through the children's apply path, status Pending
until every arm is ready then Running, Failed naming the fix, and never a write to the
SpecModel; the guard tick reconciles it when its arms are due a measurement."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import httpx
import pytest
import urllib3
import yaml

from conftest import experiment_doc, merge, specmodel_doc
from specfleet.api import parse_specmodel
from specfleet.api.validation import parse_specexperiment
from specfleet.controller.experiments import CapacityLive, reconcile_experiment
from specfleet.controller.handlers import CHILD_INDEXES, _guard_forever
from specfleet.controller.kube import Kube
from specfleet.controller.operator import Operator
from specfleet.controller.queue import WorkQueue
from specfleet.experiment.capacity import Capacity, termination_message
from specfleet.experiment.mirror import mirror_of, sample_token
from specfleet.experiment.sample import SampleUnavailable
from specfleet.render import RenderSettings
from specfleet.telemetry.reader import TelemetryReader
from specfleet.tick.children import ChildKey, summary
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
        if "vllm:kv_cache_usage_perc" in text and 'experiment="x"' in text:
            peaks = {"baseline": 0.9, "quantized": 0.5, "speculative": 0.95, "both": 0.55}
            return [{"metric": {"arm": a}, "value": [0, str(p)]} for a, p in peaks.items()]
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
    headroom = {r["arm"]: r["kvCacheHeadroom"] for r in verdict["overall"]}
    assert headroom == pytest.approx(
        {"baseline": 0.1, "quantized": 0.5, "speculative": 0.05, "both": 0.45}
    )
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


# ---------------------------------------------------------------------------- capacity phase

CAPACITY = {"maxConcurrency": 8, "steps": 2}
FLEET_POD_IP = "10.0.0.5"
SAMPLE = "".join(
    json.dumps({"class": klass, "messages": [{"role": "user", "content": f"{klass} {i}"}]}) + "\n"
    for i in range(5)
    for klass in ("chat", "code")
)
THROUGHPUTS = {"baseline": 4.0, "quantized": 6.5, "speculative": 5.0, "both": 8.25}


def fleet_pod(name: str = "m-0", ready: bool = True) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "specfleet-engine"}},
        "status": {
            "podIP": FLEET_POD_IP,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def load_test_pod(arm: str, exit_code: int = 0, message: str | None = None) -> dict[str, Any]:
    """A load test's pod as it ends: its result in the termination message."""
    result = Capacity(throughput_at_slo=THROUGHPUTS[arm], concurrency=8)
    terminated = {"exitCode": exit_code, "message": message or termination_message(result)}
    return {
        "metadata": {"name": f"x-{arm}-capacity-abcde", "labels": {"specfleet.dev/arm": arm}},
        "status": {
            "containerStatuses": [{"name": "capacity", "state": {"terminated": terminated}}]
        },
    }


@dataclass
class Fetches:
    """The fleet gateways' sample as the operator fetches it: `answer`, or a failure."""

    answer: str | None = SAMPLE
    urls: list[str] = field(default_factory=list)

    def __call__(self, url: str, experiment: str, token: str) -> str:
        self.urls.append(url)
        if self.answer is None:
            raise SampleUnavailable("ConnectError: connection refused")
        assert experiment == "x"
        assert token == sample_token(parse_specexperiment(experiment_doc()))
        return self.answer


def reconcile_capacity(
    body: dict[str, Any],
    live: dict[ChildKey, dict[str, Any]],
    at: datetime,
    reader: TelemetryReader | None = None,
    pods: list[dict[str, Any]] | None = None,
    fetch: Fetches | None = None,
) -> tuple[StatusKube, dict[str, Any]]:
    kube = StatusKube()
    capacity = CapacityLive(pods=pods or [], fleet_pods=[fleet_pod()], fetch=fetch or Fetches())
    status = reconcile_experiment(
        body, specmodel_body(), live, cast(Kube, kube), RenderSettings(), at, reader, capacity
    )
    return kube, status.to_wire()


def mirrors(body: dict[str, Any], status: dict[str, Any]) -> bool:
    experiment = parse_specexperiment({**body, "status": status})
    return mirror_of([experiment], parse_specmodel(specmodel_body())) is not None


def in_capacity() -> tuple[dict[str, Any], dict[ChildKey, dict[str, Any]]]:
    """The sample complete: the experiment in its capacity phase, its sample not yet taken."""
    body, live = running()
    body = merge(body, {"spec": {"capacity": CAPACITY}})
    kube, status = measure(body, live, prometheus(120), T0 + timedelta(minutes=4))
    assert status["phase"] == "Capacity" and kube.deleted == [] and kube.applied == []
    assert status["capacity"]["startedAt"] == (T0 + timedelta(minutes=4)).isoformat()
    assert "sampledAt" not in status["capacity"]
    assert not any(c["type"] == "Concluded" for c in status["conditions"])
    assert mirrors(body, status)  # until the sample is taken
    return {**body, "status": status}, live


def sampled() -> tuple[dict[str, Any], dict[ChildKey, dict[str, Any]], StatusKube]:
    body, live = in_capacity()
    fetches = Fetches()
    kube, status = reconcile_capacity(body, live, T0 + timedelta(minutes=5), fetch=fetches)
    assert fetches.urls == [f"http://{FLEET_POD_IP}:9090/mirror/sample"]
    return {**body, "status": status}, live, kube


def test_a_complete_sample_enters_the_capacity_phase_and_load_tests_every_arm() -> None:
    body, _, kube = sampled()
    status = body["status"]
    assert status["phase"] == "Capacity"
    [requests, *jobs] = kube.applied
    assert requests["kind"] == "ConfigMap" and requests["metadata"]["name"] == "x-capacity-requests"
    replayed = requests["data"]["requests.jsonl"].splitlines()
    assert sorted(json.loads(line)["class"] for line in replayed) == ["chat"] * 5 + ["code"] * 5
    assert [j["metadata"]["name"] for j in jobs] == [
        f"x-{arm}-capacity" for arm in ("baseline", "quantized", "speculative", "both")
    ]
    assert kube.deleted == []
    assert status["capacity"]["requests"] == 10 and status["capacity"]["classes"] == [
        "chat",
        "code",
    ]
    sampled_condition = next(c for c in status["conditions"] if c["type"] == "CapacitySampled")
    assert sampled_condition["status"] == "True" and "10 prompts" in sampled_condition["message"]
    assert kube.events == ["LoadTestsStarted"]
    assert not mirrors(body, status)  # the sample is in the ConfigMap: mirroring stops


def applied(kube: StatusKube) -> dict[ChildKey, dict[str, Any]]:
    """What the watches show of `kube`'s applies (no ConfigMap's data)."""
    return {(m["kind"], m["metadata"]["name"]): summary(m) for m in kube.applied}


def test_the_load_tests_results_conclude_with_their_throughputs_and_everything_is_retired() -> None:
    body, live, first = sampled()
    live = {**live, **applied(first)}
    later = T0 + timedelta(minutes=12)
    pods = [load_test_pod(arm) for arm in ("baseline", "quantized", "speculative")]
    kube, status = reconcile_capacity(body, live, later, pods=pods)
    assert kube.applied == [] and kube.deleted == []  # the sample's ConfigMap kept as it is
    assert [a["name"] for a in status["capacity"]["arms"]] == [
        "baseline",
        "quantized",
        "speculative",
    ]
    measured = next(c for c in status["conditions"] if c["type"] == "CapacityMeasured")
    assert (measured["status"], measured["reason"]) == ("Unknown", "LoadTesting")
    pods.append(load_test_pod("both"))
    body = {**body, "status": status}
    reader = prometheus(120)
    asked = recorded(reader)
    kube, status = reconcile_capacity(body, live, later, reader, pods)
    assert status["phase"] == "Concluded"
    rows = {row["arm"]: row["throughputAtSlo"] for row in status["verdict"]["overall"]}
    assert rows == THROUGHPUTS
    assert {a["name"]: a["throughputAtSlo"] for a in status["capacity"]["arms"]} == THROUGHPUTS
    # the arms measured on the sample, up to its end: the load tests are no sample
    sample_end = datetime.fromisoformat(status["capacity"]["startedAt"]).timestamp()
    assert asked and {float(params["time"]) for params in asked} == {sample_end}
    assert {kind for kind, _ in kube.deleted} >= {"Job", "ConfigMap", "Deployment"}
    assert len(kube.deleted) == len(live)
    assert kube.events == ["ExperimentConcluded"]


def recorded(reader: TelemetryReader) -> list[dict[str, str]]:
    """The query parameters `reader` sends, as it sends them."""
    asked: list[dict[str, str]] = []
    answer = reader._prometheus.custom_query

    def query(text: str, params: dict[str, str]) -> list[dict[str, Any]]:
        asked.append(params)
        return answer(text, params)  # type: ignore[no-any-return]

    reader._prometheus.custom_query = query  # type: ignore[method-assign]
    return asked


def test_a_failed_load_test_falls_back_to_concurrency_one_and_says_so() -> None:
    body, live, first = sampled()
    live = {**live, **applied(first)}
    crashed = load_test_pod("quantized", exit_code=1, message="guidellm: connection refused")
    pods = [load_test_pod(arm) for arm in ("baseline", "speculative", "both")] + [crashed]
    later = T0 + timedelta(minutes=12)
    kube, status = reconcile_capacity(body, live, later, prometheus(120), pods)
    assert status["phase"] == "Concluded"
    measured = next(c for c in status["conditions"] if c["type"] == "CapacityMeasured")
    assert (measured["status"], measured["reason"]) == ("False", "CapacityFailed")
    assert "quantized" in measured["message"] and "connection refused" in measured["message"]
    assert "concurrency one" in measured["message"]
    assert kube.events == ["CapacityFailed", "ExperimentConcluded"]
    rows = {row["arm"]: row["throughputAtSlo"] for row in status["verdict"]["overall"]}
    assert rows["both"] == THROUGHPUTS["both"]
    assert rows["quantized"] == 1 / 0.5  # its requests over their seconds on the sample


def test_a_load_test_past_its_deadline_fails_from_its_job_or_the_operators_clock() -> None:
    body, live, first = sampled()
    live = {**live, **applied(first)}
    job = live[("Job", "x-baseline-capacity")]
    deadline = {"type": "Failed", "status": "True", "reason": "DeadlineExceeded",
                "message": "Job was active longer than specified deadline"}  # fmt: skip
    live[("Job", "x-baseline-capacity")] = {**job, "status": {"conditions": [deadline]}}
    _, status = reconcile_capacity(body, live, T0 + timedelta(minutes=20))
    [baseline] = status["capacity"]["arms"]
    assert baseline["failed"].startswith("DeadlineExceeded: Job was active longer")
    hours_later = T0 + timedelta(hours=3)  # no pod, no Job status: the operator's own deadline
    _, status = reconcile_capacity({**body, "status": status}, live, hours_later)
    assert [a["name"] for a in status["capacity"]["arms"]] == [
        "baseline", "quantized", "speculative", "both"
    ]  # fmt: skip
    assert all("no result" in a["failed"] for a in status["capacity"]["arms"][1:])


def test_a_sample_that_cannot_be_taken_is_said_and_tried_again_never_load_tested_empty() -> None:
    body, live = in_capacity()
    for fetch, words in (
        (Fetches(answer=None), "connection refused"),
        (Fetches(answer=""), "no request"),
    ):
        kube, status = reconcile_capacity(body, live, T0 + timedelta(minutes=5), fetch=fetch)
        assert kube.applied == [] and kube.deleted == []
        condition = next(c for c in status["conditions"] if c["type"] == "CapacitySampled")
        assert (condition["status"], condition["reason"]) == ("False", "SampleUnavailable")
        assert words in condition["message"]
        assert kube.events == ["SampleUnavailable"]
        assert status["phase"] == "Capacity" and "sampledAt" not in status["capacity"]
        assert mirrors(body, status)  # the gateways keep mirroring and keeping a sample
    body = {**body, "status": status}
    kube, status = reconcile_capacity(body, live, T0 + timedelta(minutes=6))
    assert len(kube.applied) == 1 + 4 and status["capacity"]["requests"] == 10
    assert kube.events == ["LoadTestsStarted"]


def test_the_operator_reads_the_fleets_pods_for_the_sample_and_the_load_tests_pods() -> None:
    body, _ = in_capacity()
    asked: list[str] = []

    def gateway(request: httpx.Request) -> httpx.Response:
        asked.append(str(request.url))
        return httpx.Response(200, text=SAMPLE, headers={"x-specfleet-experiment": "x"})

    kube = StatusKube()
    http = httpx.Client(transport=httpx.MockTransport(gateway))
    operator = Operator(cast(Kube, kube), clock=lambda: T0 + timedelta(minutes=5), _http=http)
    experiments = {("ns", "x"): [body]}
    specmodels = {("ns", "m"): [specmodel_body()]}
    fleet = {("ns", "m"): [fleet_pod()]}
    operator.reconcile_experiment(("ns", "x"), experiments, specmodels, [], {}, fleet)
    assert asked == [f"http://{FLEET_POD_IP}:9090/mirror/sample"]
    assert sum(m["kind"] == "Job" for m in kube.applied) == 4
    status = kube.statuses[-1][2]
    experiments = {("ns", "x"): [{**body, "status": status}]}
    capacity_pods = {("ns", "x"): [load_test_pod("both")]}
    operator.reconcile_experiment(("ns", "x"), experiments, specmodels, [], capacity_pods, fleet)
    [both] = kube.statuses[-1][2]["capacity"]["arms"]
    assert (both["name"], both["throughputAtSlo"]) == ("both", THROUGHPUTS["both"])


def test_a_lagging_watch_never_takes_a_concluded_experiment_back() -> None:
    body, live = running()
    kube = StatusKube()
    at = T0 + timedelta(minutes=3)
    operator = Operator(cast(Kube, kube), reader=prometheus(120), clock=lambda: at)
    experiments = {("ns", "x"): [body]}  # the watch keeps showing it Running
    specmodels = {("ns", "m"): [specmodel_body()]}
    arms = {("ns", "x"): list(live.values())}
    operator.reconcile_experiment(("ns", "x"), experiments, specmodels, [arms])
    assert kube.statuses[-1][2]["phase"] == "Concluded" and len(kube.deleted) == len(live)
    kube.statuses.clear()
    kube.deleted.clear()
    operator.reconcile_experiment(("ns", "x"), experiments, specmodels, [arms])
    assert kube.statuses == [] and kube.applied == []
    assert len(kube.deleted) == len(live)  # its arms go, however late the watch


X, Y = ("ns", "x"), ("ns", "y")


def measured_at(seconds: float) -> tuple[Operator, Callable[[float], None]]:
    """An operator that measured experiment x's arms at `seconds` (monotonic), and x's
    reconcile at a later moment."""
    body, live = running()
    clock = {"seconds": seconds}
    operator = Operator(
        cast(Kube, StatusKube()),
        reader=prometheus(10),
        clock=lambda: T0 + timedelta(minutes=1),
        monotonic=lambda: clock["seconds"],
    )

    def reconcile(at: float) -> None:
        clock["seconds"] = at
        specmodels = {("ns", "m"): [specmodel_body()]}
        operator.reconcile_experiment(X, {X: [body]}, specmodels, [{X: list(live.values())}])

    reconcile(seconds)
    return operator, reconcile


def test_an_experiment_is_due_on_the_tick_once_its_arms_were_measured_15_seconds_ago() -> None:
    operator, reconcile = measured_at(1000.0)
    assert operator.experiments_due([X, Y], 1005.0) == [Y]  # y was never measured
    reconcile(1010.0)  # an arm's event between ticks: no measurement, the cadence kept
    assert operator.experiments_due([X], 1014.0) == []
    assert operator.experiments_due([X], 1014.6) == [X]  # its reconcile comes a moment later
    reconcile(1014.7)
    assert operator.experiments_due([X], 1020.0) == []


async def test_the_guard_loop_queues_only_the_experiments_due_a_measurement() -> None:
    operator, _ = measured_at(1000.0)
    memo: dict[str, Any] = {
        "operator": operator,
        "guard_tick_seconds": 0.0,
        "experiments": WorkQueue(),
    }
    indexes: dict[str, Any] = {name: {} for name in ["specmodels", "pods", *CHILD_INDEXES]}
    indexes["specexperiments"] = {X: [experiment_doc()], Y: [experiment_doc()]}
    loop = asyncio.create_task(_guard_forever(memo, indexes))
    await asyncio.sleep(0.1)
    loop.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await loop
    assert len(memo["experiments"]) == 1 and await memo["experiments"].get() == Y


@dataclass
class SilentKube(StatusKube):
    """An API server that never answers an apply (after the client's own retries)."""

    def apply(self, manifest: dict[str, Any]) -> None:
        raise urllib3.exceptions.ReadTimeoutError(None, "/apis", "Read timed out.")  # type: ignore[arg-type]


def test_an_api_server_that_never_answers_is_a_failed_apply_in_status_not_an_exception() -> None:
    kube = SilentKube()
    status = reconcile_experiment(
        experiment_doc(), specmodel_body(), {}, cast(Kube, kube), RenderSettings(), T0
    ).to_wire()
    assert status["phase"] == "Pending"
    [ready] = status["conditions"]
    assert "API server did not answer" in ready["message"], ready
    assert [kind for kind, _, _ in kube.statuses] == ["SpecExperiment"]
