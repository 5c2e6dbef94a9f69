"""A SpecExperiment whose baseline and speculative arms run the real vLLM (CPU build, the tiny
model; the speculative arm's target drafts for itself) while the fleet and the quantized arms
run the simulator: the fleet's gateway mirrors the real `openai` clients' greedy requests to
every arm, and what the experiment measures of the real arms is the real engine's doing.

Greedy speculative decoding is lossless and a target drafting for itself has every draft
accepted: the real speculative arm must agree with the real baseline on (nearly) every answer
with an acceptance near 1, while a simulated arm, whose text is not the tiny model's, must not.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from e2e import real_clients, real_engine
from e2e.cluster.harness import LocalCluster, eventually
from e2e.fleet import simulated_pods
from e2e.real_clients import NAME
from e2e.real_engine_pod import COMMAND
from e2e.test_experiment import experiment_status, operator  # noqa: F401
from e2e.test_guard import apply, status
from e2e.test_real_engine_guard import ENGINE_READY_S

REAL_ARMS = "specfleet.dev/arm=baseline,speculative"
RPS = 0.6
MIN_REQUESTS = 12


def specmodel() -> dict[str, Any]:
    """The tiny model quantized (online FP8: the simulated arms serve it, the CPU build cannot,
    so the real arms never get it) with the target drafting for itself."""
    return real_clients.specmodel(
        quantization={"weights": "fp8", "online": True}, pod={"replicas": 1}
    )


def experiment() -> dict[str, Any]:
    return {
        "apiVersion": "specfleet.dev/v1alpha1",
        "kind": "SpecExperiment",
        "metadata": {"name": "exp"},
        "spec": {
            "specModelRef": {"name": NAME},
            "sample": {"share": 1.0},
            "minRequestsPerClass": MIN_REQUESTS,
            "gpuHourPrice": 4.0,
        },
    }


def test_real_arms_agree_on_greedy_answers_and_accept_every_self_draft(
    local_cluster: LocalCluster,
    namespace: str,
    operator: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    real_engine.build()
    apply(local_cluster, namespace, specmodel())
    options = ("--engine-command", COMMAND, "--engine-command-for", REAL_ARMS)
    options += ("--ready-timeout", str(ENGINE_READY_S))
    with simulated_pods(local_cluster, namespace, real_clients.scenario(RPS), tmp_path, options):
        eventually(
            lambda: status(local_cluster, namespace, NAME).get("activeRevision") == 1, "served"
        )
        _, traffic = real_clients.in_background(local_cluster, namespace, RPS, 1200)
        apply(local_cluster, namespace, experiment())
        started = time.monotonic()
        eventually(
            lambda: experiment_status(local_cluster, namespace).get("phase") == "Running",
            "every arm ready, two of them real engines",
            timeout_s=ENGINE_READY_S + 60,
        )
        print(f"arms ready after {time.monotonic() - started:.0f} s")
        eventually(
            lambda: experiment_status(local_cluster, namespace).get("phase") == "Concluded",
            "the verdict",
            timeout_s=600,
        )
        report = traffic.result(stop=True)
    verdict = experiment_status(local_cluster, namespace)["verdict"]
    rows = {row["arm"]: row for row in verdict["overall"]}
    print({a: (r.get("greedyAgreement"), r.get("acceptanceRate")) for a, r in rows.items()})
    assert rows["speculative"]["acceptanceRate"] > 0.9, rows["speculative"]
    assert rows["baseline"].get("acceptanceRate") is None, rows["baseline"]
    assert rows["speculative"]["greedyAgreement"] >= 0.9, rows["speculative"]
    assert rows["quantized"]["greedyAgreement"] < 0.5, rows["quantized"]
    # the real engines' KV-cache usage, scraped with their arm's label
    for arm in ("baseline", "speculative"):
        assert 0 < rows[arm]["kvCacheHeadroom"] <= 1, rows[arm]
    assert sum(report.failed.values()) == 0, report.errors[:5]
