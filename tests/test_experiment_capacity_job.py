"""The capacity phase in the cluster: a Job per arm running the load test against the arm's
Service, matched by no selector, and its result read back from the pod's termination message."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from conftest import experiment_doc, specmodel_doc
from specfleet.api import parse_specmodel
from specfleet.api.validation import parse_specexperiment
from specfleet.cli import main
from specfleet.experiment.capacity import Capacity, Miss
from specfleet.experiment.capacity_job import (
    CONTAINER,
    TERMINATION_LOG,
    CapacityFailed,
    capacity_of_pod,
    render_capacity_jobs,
    render_requests,
)
from specfleet.experiment.replay import load_requests
from specfleet.experiment.workloads import render_arms
from specfleet.render import render

IMAGE = "registry.example/specfleet-capacity:1"
CLASSES = [
    {"name": "chat", "slo": {"maxP95TtftSeconds": 1.5, "minAcceptanceRate": 0.5}},
    {"name": "code", "slo": {"maxP95TpotSeconds": 0.04}},
    {"name": "batch"},
]
SPEC = {
    "quantization": {"weights": "fp8", "online": True},
    "speculative": {"method": "ngram", "numSpeculativeTokens": 4},
    "classes": CLASSES,
    "defaultClass": "chat",
}


def jobs(**capacity: Any) -> list[dict[str, Any]]:
    specmodel = parse_specmodel(specmodel_doc(**SPEC))
    experiment = parse_specexperiment(experiment_doc(capacity=capacity or None))
    return render_capacity_jobs(specmodel, experiment, IMAGE)


def args_of(job: dict[str, Any]) -> dict[str, str]:
    [container] = job["spec"]["template"]["spec"]["containers"]
    return dict(a.removeprefix("--").split("=", 1) for a in container["args"])


def test_no_capacity_phase_no_job() -> None:
    assert jobs() == []


def test_one_job_per_arm_runs_the_load_test_against_the_arms_service() -> None:
    rendered = jobs(maxConcurrency=32, steps=4)
    names = [j["metadata"]["name"] for j in rendered]
    assert names == [
        f"x-{arm}-capacity" for arm in ("baseline", "quantized", "speculative", "both")
    ]
    job = rendered[1]
    assert job["metadata"]["ownerReferences"][0]["kind"] == "SpecExperiment"
    assert job["metadata"]["namespace"] == "ns"
    [container] = job["spec"]["template"]["spec"]["containers"]
    assert container["image"] == IMAGE
    assert container["command"] == ["specfleet", "experiment", "capacity"]
    args = args_of(job)
    assert args["url"] == "http://x-quantized.ns.svc:80"
    assert (args["max-concurrency"], args["steps"]) == ("32", "4")
    assert args["result-file"] == container["terminationMessagePath"] == TERMINATION_LOG
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
    # every class of the SpecModel is judged; one without an SLO for its errors alone
    assert json.loads(args["slo"]) == {
        "chat": {"maxP95TtftSeconds": 1.5, "minAcceptanceRate": 0.5},
        "code": {"maxP95TpotSeconds": 0.04},
        "batch": {},
    }
    assert job["spec"]["backoffLimit"] == 0
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"


def test_the_rendered_arguments_are_the_commands_own(tmp_path: Path) -> None:
    """The Job's arguments pass `specfleet experiment capacity`'s checks (the SLOs of every
    class included) up to running guidellm, absent here."""
    args = args_of(jobs(maxConcurrency=8, steps=2)[0])
    requests = tmp_path / "requests.jsonl"
    requests.write_text(
        "".join(f'{{"class": "{c["name"]}", "prompt": "{c["name"]}"}}\n' for c in CLASSES)
    )
    args["requests"] = str(requests)
    command = ["experiment", "capacity", *(f"--{k}={v}" for k, v in args.items())]
    command.append(f"--guidellm={tmp_path / 'absent'}")
    result = CliRunner().invoke(main, command)
    assert result.exit_code == 1 and "guidellm failed" in result.output, result.output


def test_no_fleet_or_arm_selector_matches_a_capacity_pod() -> None:
    specmodel = parse_specmodel(specmodel_doc(**SPEC))
    experiment = parse_specexperiment(experiment_doc(capacity={"maxConcurrency": 4}))
    selectors = []
    for manifest in [*render(specmodel), *render_arms(specmodel, experiment)]:
        if manifest["kind"] == "Service":
            selectors.append(manifest["spec"]["selector"])
        elif manifest["kind"] not in {"ConfigMap"}:
            selectors.append(manifest["spec"]["selector"]["matchLabels"])
    assert len(selectors) > 8
    for job in render_capacity_jobs(specmodel, experiment, IMAGE):
        labels = job["spec"]["template"]["metadata"]["labels"]
        assert "app.kubernetes.io/instance" not in labels
        for selector in selectors:
            assert not selector.items() <= labels.items(), (selector, labels)


def test_the_requests_config_map_holds_a_file_the_command_replays(tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text(
        '{"class": "chat", "messages": [{"role": "user", "content": "hi"}], "temperature": 0}\n'
        '{"class": "code", "messages": [{"role": "user", "content": "def f("}], "max_tokens": 9}\n'
    )
    requests = load_requests(source)
    experiment = parse_specexperiment(experiment_doc(capacity={"maxConcurrency": 4}))
    config_map = render_requests(experiment, requests)
    assert config_map["metadata"]["name"] == "x-capacity-requests"
    assert config_map["metadata"]["ownerReferences"][0]["name"] == "x"
    copy = tmp_path / "out.jsonl"
    copy.write_text(config_map["data"]["requests.jsonl"])
    assert load_requests(copy) == requests


def pod(**terminated: Any) -> dict[str, Any]:
    state = {"terminated": terminated} if terminated else {"running": {"startedAt": "now"}}
    return {"status": {"containerStatuses": [{"name": CONTAINER, "state": state}]}}


def test_a_running_or_unstarted_pod_has_no_result_yet() -> None:
    assert capacity_of_pod(pod()) is None
    assert capacity_of_pod({"status": {"phase": "Pending"}}) is None
    assert capacity_of_pod({}) is None


def test_the_result_is_read_from_the_termination_message() -> None:
    result = Capacity(
        throughput_at_slo=3.5,
        concurrency=8,
        misses=[
            Miss(concurrency=16, class_name="code", signal="p95TpotSeconds", value=1, limit=0.5)
        ],
    )
    message = result.model_dump_json(by_alias=True)
    assert capacity_of_pod(pod(exitCode=0, reason="Completed", message=message)) == result


@pytest.mark.parametrize(
    ("terminated", "words"),
    [
        (
            {"exitCode": 1, "reason": "Error", "message": "error: guidellm failed"},
            "guidellm failed",
        ),
        ({"exitCode": 137, "reason": "OOMKilled"}, r"OOMKilled \(exit 137\)"),
        ({"exitCode": 0, "message": ""}, "no result"),
        ({"exitCode": 0, "message": '{"throughputAtSlo": -1}'}, "no result"),
    ],
)
def test_a_load_test_that_ended_without_a_result_fails_with_its_words(
    terminated: dict[str, Any], words: str
) -> None:
    with pytest.raises(CapacityFailed, match=words):
        capacity_of_pod(pod(**terminated))


def test_the_capacity_image_pins_guidellm_as_the_local_build_does() -> None:
    root = Path(__file__).parents[1]
    script = (root / "hack/guidellm.sh").read_text()
    dockerfile = (root / "images/capacity/Dockerfile").read_text()
    for pin in ("GUIDELLM_VERSION", "TORCH_VERSION"):
        [version] = [line.split("=")[1] for line in script.splitlines() if line.startswith(pin)]
        assert f"ARG {pin}={version}" in dockerfile
