"""The capacity phase's load test: the replayed request file, guidellm's scenario, and its report
read back per class. The report under tests/data/guidellm/ is guidellm 0.8.1's, recorded by
`specfleet experiment capacity --report` against `specfleet-testbed engine --engine vllm` with
requests.jsonl beside it (2 steps up to 4 concurrent; the last chat request asks for more tokens
than the context holds, so the engine refuses it every time)."""

from __future__ import annotations

import gzip
import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from specfleet.cli import main
from specfleet.experiment import guidellm
from specfleet.experiment.capacity import concurrency_steps
from specfleet.experiment.replay import load_requests
from specfleet.yamlio import InputError

DATA = Path(__file__).parent / "data" / "guidellm"
REQUESTS = DATA / "requests.jsonl"


def recorded() -> dict[str, Any]:
    return dict(json.loads(gzip.decompress((DATA / "report-0.8.1.json.gz").read_bytes())))


def ttfts(benchmark: dict[str, Any], word: str) -> list[float]:
    """The class's TTFTs found by another road: its word in the prompt sent."""
    return [
        r["time_to_first_token_ms"] / 1000
        for r in benchmark["requests"]["successful"]
        if word in r["request_args"]
    ]


def test_the_recorded_report_reads_as_steps_per_class() -> None:
    report = recorded()
    steps = guidellm.steps(report, load_requests(REQUESTS))
    assert [s.concurrency for s in steps] == [2, 4]
    # each step sends the file round after round: 8 then 16 requests, the chat past the
    # context each time it comes round
    counts = [{c: (m.requests, m.errors) for c, m in s.classes.items()} for s in steps]
    assert counts == [{"chat": (4, 1), "code": (3, 0)}, {"chat": (7, 2), "code": (7, 0)}]
    for step, benchmark in zip(steps, report["benchmarks"], strict=True):
        rps = benchmark["metrics"]["requests_per_second"]["successful"]["mean"]
        assert step.throughput == rps > 0
    # code at 4: 7 requests, no error: the p95 by nearest rank is the slowest
    assert steps[1].classes["code"].p95_ttft_seconds == max(ttfts(report["benchmarks"][1], "code"))
    # chat at 4: 7 successes and 2 errors ranked slowest: rank ceil(0.95 * 9) = 9 is an error
    assert steps[1].classes["chat"].p95_ttft_seconds == max(ttfts(report["benchmarks"][1], "chat"))
    assert all(0.001 < m.p95_tpot_seconds < 1 for s in steps for m in s.classes.values())


def test_a_report_of_other_prompts_is_refused() -> None:
    report = recorded()
    benchmark = report["benchmarks"][0]["requests"]["successful"][0]
    benchmark["request_args"] = benchmark["request_args"].replace("chat request 0", "another")
    with pytest.raises(guidellm.ReportError, match="not in the file"):
        guidellm.steps(report, load_requests(REQUESTS))
    with pytest.raises(guidellm.ReportError):
        guidellm.steps({"benchmarks": [{}]}, load_requests(REQUESTS))


def test_more_results_than_requests_sent_is_refused() -> None:
    report = recorded()
    report["benchmarks"][0]["scheduler_metrics"]["requests_made"]["total"] = 2
    with pytest.raises(guidellm.ReportError, match="more results"):
        guidellm.steps(report, load_requests(REQUESTS))


@pytest.mark.parametrize(
    ("values", "errors", "expected"),
    [
        (list(range(1, 21)), 0, 19),  # rank 19 of 20
        (list(range(1, 21)), 1, 20),  # rank 20 of 21: the slowest success
        (list(range(1, 21)), 5, 20),  # past the successes: the slowest measured
        ([0.5], 0, 0.5),
        ([], 3, 0.0),
    ],
)
def test_p95_by_nearest_rank_with_errors_ranked_slowest(
    values: list[float], errors: int, expected: float
) -> None:
    assert guidellm.p95(values, errors) == expected


def test_the_scenario_steps_concurrency_and_sends_each_step_enough_requests(
    tmp_path: Path,
) -> None:
    requests = load_requests(REQUESTS)
    data, report = tmp_path / "d.jsonl", tmp_path / "r.json"
    scenario = guidellm.scenario("http://arm", requests, [1, 8], data, report, 60.0)
    assert scenario["benchmarks"] == [
        {"profile.streams": 1, "constraints[0].count": len(requests)},
        {"profile.streams": 8, "constraints[0].count": 8 * guidellm.REQUESTS_PER_STREAM},
    ]
    spec = scenario["spec"]
    assert spec["backend"] == {
        "kind": "openai_http",
        "target": "http://arm",
        "request_format": "/v1/chat/completions",
    }
    assert spec["data"] == [{"kind": "json_file", "path": str(data)}]
    assert spec["outputs"] == [{"kind": "json", "path": str(report)}]


def test_the_dataset_replays_the_file_round_after_round() -> None:
    requests = load_requests(REQUESTS)
    rows = guidellm.dataset(requests, len(requests) + 2)
    assert (
        rows[len(requests)]
        == rows[0]
        == {
            "messages": [{"role": "user", "content": "chat request 0: write a short answer"}],
            "output_tokens_count": 12,
        }
    )
    assert rows[1]["output_tokens_count"] == 24


def test_completion_requests_use_the_completions_api(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text('{"class": "a", "prompt": "say hi", "max_completion_tokens": 5}\n')
    requests = load_requests(path)
    assert guidellm.dataset(requests, 1) == [{"prompt": "say hi", "output_tokens_count": 5}]
    scenario = guidellm.scenario("http://arm", requests, [1], path, path, 1.0)
    assert scenario["spec"]["backend"]["request_format"] == "/v1/completions"


@pytest.mark.parametrize(
    ("lines", "problem"),
    [
        (['{"messages": [{"role": "user", "content": "x"}]}'], "line 1: class: Field required"),
        (['{"class": "a"}'], "give `messages` (chat) or `prompt`"),
        (['{"class": "a", "prompt": "x", "messages": [{"content": "x"}]}'], "one of them"),
        (['{"class": "a", "prompt": "x"}', '{"class": "b", "prompt": "x"}'], "classes a, b"),
        (['{"class": "a", "prompt": "x"}', '{"class": "a", "messages": [{}]}'], "mixed"),
        (["", "  "], "no request to replay"),
        (['{"class": "a", "prompt": "x", "max_tokens": 0}'], "line 1: max_tokens"),
    ],
)
def test_a_request_file_that_cannot_be_replayed_is_refused(
    tmp_path: Path, lines: list[str], problem: str
) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError) as caught:
        load_requests(path)
    assert any(problem in p for p in caught.value.problems), caught.value.problems


def test_the_same_prompt_twice_in_one_class_is_fine(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text('{"class": "a", "prompt": "x"}\n{"class": "a", "prompt": "x"}\n')
    assert len(load_requests(path)) == 2


def test_concurrency_steps_are_evenly_spaced_up_to_the_maximum() -> None:
    assert concurrency_steps(64, 8) == [8, 16, 24, 32, 40, 48, 56, 64]
    assert concurrency_steps(4, 2) == [2, 4]
    assert concurrency_steps(3, 8) == [1, 2, 3]
    assert concurrency_steps(5, 1) == [5]


FAKE = """\
import json, shutil, sys
scenario = json.load(open(sys.argv[sys.argv.index("--scenario") + 1]))
json.dump(scenario, open(sys.argv[0] + ".scenario.json", "w"))
shutil.copyfile(sys.argv[0] + ".report.json", scenario["spec"]["outputs"][0]["path"])
"""


def fake_guidellm(tmp_path: Path) -> Path:
    """A stand-in that writes the recorded report where the scenario asks for it."""
    script = tmp_path / "guidellm"
    script.write_text(f"#!{sys.executable}\n{FAKE}")
    script.chmod(0o755)
    Path(f"{script}.report.json").write_text(json.dumps(recorded()))
    return script


def invoke(tmp_path: Path, slo: str, *extra: str) -> Any:
    args = ["experiment", "capacity", "--url", "http://127.0.0.1:1", "--requests", str(REQUESTS)]
    args += ["--slo", slo, "--max-concurrency", "4", "--steps", "2", *extra]
    env = {"SPECFLEET_GUIDELLM": str(fake_guidellm(tmp_path))}
    return CliRunner().invoke(main, args, env=env)


def test_the_command_prints_the_capacity_and_writes_the_compact_result(tmp_path: Path) -> None:
    slo = '{"chat": {"maxP95TtftSeconds": 10}, "code": {"maxP95TpotSeconds": 1}}'
    out = tmp_path / "termination-log"
    result = invoke(tmp_path, slo, "--result-file", str(out))
    assert result.exit_code == 0, result.output
    printed = json.loads(result.stdout)
    # the refused chat request is 2 of 9 at the first step: over the error budget
    assert printed["throughputAtSlo"] == 0.0
    assert printed["misses"] == [
        {"concurrency": 2, "class": "chat", "signal": "errorRate", "value": 0.2, "limit": 0.05}
    ]
    assert [s["concurrency"] for s in printed["steps"]] == [2, 4]
    compact = json.loads(out.read_text())
    assert compact == {k: v for k, v in printed.items() if k != "steps"}
    sent = json.loads((tmp_path / "guidellm.scenario.json").read_text())
    assert [b["profile.streams"] for b in sent["benchmarks"]] == [2, 4]


def test_code_alone_is_inside_at_every_step(tmp_path: Path) -> None:
    result = invoke(tmp_path, '{"code": {"maxP95TpotSeconds": 1}}')
    assert result.exit_code == 0, result.output
    printed = json.loads(result.stdout)
    best = max(s["throughput"] for s in printed["steps"])
    assert (printed["throughputAtSlo"], printed["concurrency"]) == (best, 4)
    assert not math.isnan(best)


@pytest.mark.parametrize(
    ("slo", "problem"),
    [
        ('{"chat": {"maxP95TtftSeconds": -1}}', "greater than 0"),
        ('{"other": {}}', "names classes the requests lack"),
        ("not json", "Invalid JSON"),
    ],
)
def test_an_slo_that_cannot_be_judged_is_refused(tmp_path: Path, slo: str, problem: str) -> None:
    result = invoke(tmp_path, slo)
    assert result.exit_code == 2 and problem in result.output, result.output
