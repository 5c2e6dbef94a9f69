"""guidellm, the capacity phase's load generator, as the runner drives it: one run's scenario
file (a concurrency step after another over the replayed prompts) and its JSON report read back
into each step's throughput and per-class p95 latencies. Pure but for `run`; guidellm itself
lives in its own venv (`hack/guidellm.sh`), never in specfleet's.

Each step sends the file's requests in file order, round after round, at least
`REQUESTS_PER_STREAM` per concurrent stream, so that its first and last rounds (ramping up and
down) are a minority of it. guidellm reports a successful request with the body it sent, whose
prompt tells its class; a failed one without, so a class's errors are its requests sent less
those reported otherwise. TTFT and TPOT are the gateway's: TPOT is guidellm's inter-token
latency, (last token - first token) / (output tokens - 1).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from specfleet.experiment.capacity import ClassStep, ConcurrencyStep
from specfleet.experiment.replay import ReplayRequest, prompt_key

REQUESTS_PER_STREAM = 4
P95 = 0.95
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
"""guidellm never needs a tokenizer for recorded prompts: should it reach for one, it fails at
once instead of waiting on a model hub."""
STARTUP_SECONDS = 120


class ReportError(ValueError):
    pass


def requests_per_step(concurrency: int, file_size: int) -> int:
    return max(file_size, REQUESTS_PER_STREAM * concurrency)


def dataset(requests: Sequence[ReplayRequest], size: int) -> list[dict[str, Any]]:
    """guidellm's rows: the file's prompts round after round, each answer as long as the
    request allowed (guidellm sends `ignore_eos`: the longest answers, a conservative load)."""
    return [_row(requests[i % len(requests)]) for i in range(size)]


def _row(request: ReplayRequest) -> dict[str, Any]:
    row: dict[str, Any] = (
        {"messages": request.messages}
        if request.messages is not None
        else {"prompt": request.prompt}
    )
    if request.output_tokens:
        row["output_tokens_count"] = request.output_tokens
    return row


def scenario(
    url: str,
    requests: Sequence[ReplayRequest],
    concurrencies: Sequence[int],
    data: Path,
    report: Path,
    step_seconds: float,
) -> dict[str, Any]:
    counts = [requests_per_step(c, len(requests)) for c in concurrencies]
    return {
        "spec": {
            "backend": {"kind": "openai_http", "target": url, "request_format": requests[0].api},
            "profile": {"kind": "concurrent", "streams": concurrencies[0]},
            "constraints": [
                {"kind": "max_requests", "count": counts[0]},
                {"kind": "max_duration", "seconds": step_seconds},
            ],
            "data": [{"kind": "json_file", "path": str(data)}],
            "outputs": [{"kind": "json", "path": str(report)}],
        },
        "benchmarks": [
            {"profile.streams": c, "constraints[0].count": n}
            for c, n in zip(concurrencies, counts, strict=True)
        ],
    }


def run(
    guidellm: str,
    url: str,
    requests: Sequence[ReplayRequest],
    concurrencies: Sequence[int],
    workdir: Path,
    step_seconds: float,
) -> dict[str, Any]:
    """guidellm's report of one run; its console output goes to stderr once it is done."""
    data, report, config = (
        workdir / "data.jsonl",
        workdir / "report.json",
        workdir / "scenario.json",
    )
    size = max(requests_per_step(c, len(requests)) for c in concurrencies)
    data.write_text("".join(json.dumps(row) + "\n" for row in dataset(requests, size)))
    config.write_text(
        json.dumps(scenario(url, requests, concurrencies, data, report, step_seconds))
    )
    env = os.environ | OFFLINE | {"HF_HOME": str(workdir / "hf")}
    command = [guidellm, "run", "--scenario", str(config), "--disable-console-interactive"]
    timeout = STARTUP_SECONDS + step_seconds * len(concurrencies)
    try:
        done = subprocess.run(
            command, env=env, capture_output=True, text=True, check=True, timeout=timeout
        )
    except subprocess.CalledProcessError as exc:
        sys.stderr.write(exc.stdout + exc.stderr)
        raise
    sys.stderr.write(done.stdout + done.stderr)
    return dict(json.loads(report.read_text()))


def steps(report: Mapping[str, Any], requests: Sequence[ReplayRequest]) -> list[ConcurrencyStep]:
    """Each benchmark of guidellm's report as a concurrency step of the file's classes."""
    try:
        return [_step(benchmark, requests) for benchmark in report["benchmarks"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise ReportError(f"not a guidellm report of these requests: {exc!r}") from None


def _step(benchmark: Mapping[str, Any], requests: Sequence[ReplayRequest]) -> ConcurrencyStep:
    class_of = {r.key: r.class_name for r in requests}
    sent = Counter(
        requests[i % len(requests)].class_name
        for i in range(benchmark["scheduler_metrics"]["requests_made"]["total"])
    )
    results = benchmark["requests"]
    latencies: dict[str, list[tuple[float | None, float | None]]] = defaultdict(list)
    for result in results["successful"]:
        latencies[_class(result, class_of)].append(_latencies(result))
    cut = Counter(_class(r, class_of) for r in results["incomplete"] if r.get("request_args"))
    classes = {}
    for name, count in sent.items():
        measured = latencies[name]
        errors = count - len(measured) - cut[name]
        if errors < 0:
            raise ValueError(f"class {name}: more results ({count - errors}) than sent ({count})")
        ttfts = [ttft for ttft, _ in measured if ttft is not None]
        tpots = [tpot for _, tpot in measured if tpot is not None]
        classes[name] = ClassStep(
            requests=len(measured),
            errors=errors,
            p95_ttft_seconds=p95(ttfts, errors),
            p95_tpot_seconds=p95(tpots, errors),
        )
    return ConcurrencyStep(
        concurrency=benchmark["config"]["strategy"]["streams"],
        throughput=benchmark["metrics"]["requests_per_second"]["successful"]["mean"],
        classes=classes,
    )


def _class(result: Mapping[str, Any], class_of: Mapping[str, str]) -> str:
    body = json.loads(result["request_args"])["body"]
    key = prompt_key(body["messages"] if "messages" in body else body["prompt"])
    if key not in class_of:
        raise ValueError(f"a result for a prompt not in the file: {key[:80]}")
    return class_of[key]


def _latencies(result: Mapping[str, Any]) -> tuple[float | None, float | None]:
    """TTFT and TPOT in seconds; TPOT is None for an answer of one token."""
    ttft, tpot = result["time_to_first_token_ms"], result["inter_token_latency_ms"]
    return (None if ttft is None else ttft / 1000), (None if tpot is None else tpot / 1000)


def p95(values: Sequence[float], errors: int) -> float:
    """Nearest rank, the errors ranked slowest; past them, the slowest value measured (the
    error rate tells that miss). 0 without a value."""
    if not values:
        return 0.0
    rank = math.ceil(P95 * (len(values) + errors))
    return sorted(values)[min(rank, len(values)) - 1]
