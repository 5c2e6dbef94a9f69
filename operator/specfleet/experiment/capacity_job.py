"""The capacity phase in the cluster (pure): a Job per arm, `<experiment>-<arm>-capacity`, that
runs `specfleet experiment capacity` against the arm's Service with the experiment's sample of
prompts (the ConfigMap `<experiment>-capacity-requests`) and the SpecModel's class SLOs, and
leaves its result in the container's termination message; and that result read back from the
Job's pod. The Job and its pod are owned by the experiment and labelled
`app.kubernetes.io/name: specfleet-capacity`, never `app.kubernetes.io/instance`: no fleet or arm
selector matches them. The image must hold specfleet and guidellm (not the operator's: it stays
lean)."""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from specfleet.api import SpecModel
from specfleet.api.experiment import ArmSpec, CapacitySpec, SpecExperiment
from specfleet.api.spec import ClassSlo
from specfleet.experiment.arms import arms_of
from specfleet.experiment.capacity import Capacity, concurrency_steps
from specfleet.experiment.guidellm import STARTUP_SECONDS
from specfleet.experiment.replay import ReplayRequest, request_line
from specfleet.experiment.workloads import arm_name, arm_url
from specfleet.render import Manifest
from specfleet.render.labels import MANAGED, owner_reference
from specfleet.render.workload import ARM_LABEL, EXPERIMENT_LABEL, non_root_read_only

CAPACITY_APP = "specfleet-capacity"
CONTAINER = "capacity"
REQUESTS_DIR = "/etc/specfleet/capacity"
REQUESTS_KEY = "requests.jsonl"
TERMINATION_LOG = "/dev/termination-log"
STEP_SECONDS = 300
FAILURE_WORDS = 500
"""Characters of a failed load test's words kept: the end of its log, the start of a result."""


Slos = dict[str, dict[str, Any]]
"""Each judged class's SLO, as the command takes it."""


class CapacityFailed(RuntimeError):
    """The load test ended without a result; the words are the container's."""


def capacity_job_name(experiment: str, arm: str) -> str:
    return f"{arm_name(experiment, arm)}-capacity"


def requests_name(experiment: str) -> str:
    return f"{experiment}-capacity-requests"


def labels(experiment: str, arm: str | None = None) -> dict[str, str]:
    own = {"app.kubernetes.io/name": CAPACITY_APP, EXPERIMENT_LABEL: experiment}
    return {**own, **({ARM_LABEL: arm} if arm else {}), **MANAGED}


def render_requests(experiment: SpecExperiment, requests: Sequence[ReplayRequest]) -> Manifest:
    """The sample of prompts every arm's load test replays, one JSONL line each."""
    lines = [request_line(r) for r in requests]
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(experiment, requests_name(experiment.metadata.name)),
        "data": {REQUESTS_KEY: "".join(lines)},
    }


def render_capacity_jobs(
    specmodel: SpecModel,
    experiment: SpecExperiment,
    image: str,
    classes: Collection[str] | None = None,
) -> list[Manifest]:
    """One Job per arm, judging `classes` (those the sample holds; default: every class); none
    when the experiment has no capacity phase."""
    if experiment.spec.capacity is None:
        return []
    slos = {
        c.name: (c.slo or ClassSlo()).to_wire()
        for c in specmodel.spec.classes
        if classes is None or c.name in classes
    }
    return [_job(experiment, arm, image, slos) for arm in arms_of(experiment.spec)]


def job_deadline_seconds(capacity: CapacitySpec) -> int:
    """How long a load test may run: guidellm's startups and every step at its longest."""
    steps = len(concurrency_steps(capacity.max_concurrency, capacity.steps))
    return 2 * STARTUP_SECONDS + steps * STEP_SECONDS


def _job(experiment: SpecExperiment, arm: ArmSpec, image: str, slos: Slos) -> Manifest:
    capacity = experiment.spec.capacity
    assert capacity is not None
    name = experiment.metadata.name
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": _metadata(experiment, capacity_job_name(name, arm.name), arm.name),
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": job_deadline_seconds(capacity),
            "template": {
                "metadata": {"labels": labels(name, arm.name)},
                "spec": {
                    "restartPolicy": "Never",
                    "automountServiceAccountToken": False,
                    "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [_container(experiment, arm, image, slos)],
                    "volumes": [
                        {"name": "requests", "configMap": {"name": requests_name(name)}},
                        {"name": "tmp", "emptyDir": {}},
                    ],
                },
            },
        },
    }


def _container(experiment: SpecExperiment, arm: ArmSpec, image: str, slos: Slos) -> dict[str, Any]:
    capacity = experiment.spec.capacity
    assert capacity is not None
    return {
        "name": CONTAINER,
        "image": image,
        "command": ["specfleet", "experiment", "capacity"],
        "args": [
            f"--url={arm_url(experiment, arm.name)}",
            f"--requests={REQUESTS_DIR}/{REQUESTS_KEY}",
            f"--slo={json.dumps(slos, sort_keys=True, separators=(',', ':'))}",
            f"--max-concurrency={capacity.max_concurrency}",
            f"--steps={capacity.steps}",
            f"--step-seconds={STEP_SECONDS}",
            f"--result-file={TERMINATION_LOG}",
        ],
        # guidellm and its libraries write caches under HOME and the temporary directory.
        "env": [{"name": "HOME", "value": "/tmp"}],
        "terminationMessagePath": TERMINATION_LOG,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "resources": {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"memory": "4Gi"}},
        "securityContext": non_root_read_only(),
        "volumeMounts": [
            {"name": "requests", "mountPath": REQUESTS_DIR, "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    }


def _metadata(experiment: SpecExperiment, name: str, arm: str | None = None) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": experiment.metadata.namespace,
        "labels": labels(experiment.metadata.name, arm),
        "ownerReferences": [owner_reference(experiment)],
    }


def capacity_of_pod(pod: Mapping[str, Any]) -> Capacity | None:
    """The load test's result from its pod (the API's wire form); None while it runs.
    CapacityFailed when it ended without one."""
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    status = next((s for s in statuses if s.get("name") == CONTAINER), None)
    terminated = ((status or {}).get("state") or {}).get("terminated")
    if terminated is None:
        return None
    message = terminated.get("message") or ""
    if terminated.get("exitCode") != 0:
        reason = terminated.get("reason") or "Error"
        raise CapacityFailed(
            f"{reason} (exit {terminated.get('exitCode')}): {message[-FAILURE_WORDS:]}"
        )
    try:
        return Capacity.model_validate_json(message)
    except ValidationError:
        raise CapacityFailed(
            f"no result in the termination message: {message[:FAILURE_WORDS]}"
        ) from None


def capacity_of_job(
    job: Mapping[str, Any] | None, pods: Sequence[Mapping[str, Any]]
) -> Capacity | None:
    """An arm's result from its Job and the Job's pods (as watched); None while it runs.
    CapacityFailed when the pod ended without one, or when the Job failed without a pod that
    says why (its deadline passed: its pod is gone)."""
    for pod in pods:
        found = capacity_of_pod(pod)
        if found is not None:
            return found
    failed = next(
        (
            c
            for c in ((job or {}).get("status") or {}).get("conditions") or []
            if c.get("type") == "Failed" and c.get("status") == "True"
        ),
        None,
    )
    if failed is not None:
        raise CapacityFailed(f"{failed.get('reason', 'Failed')}: {failed.get('message', '')}")
    return None
