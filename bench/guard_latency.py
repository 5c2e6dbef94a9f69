"""What one guard tick costs: `decide` for N SpecModels x 4 prompt classes.

Each SpecModel gets its own policy (floors, critical class, thresholds vary) and its own
observation every tick; state (guard memory, kill switch, revision verdict) is carried from tick
to tick as the operator would. A mix of healthy, collapsing and thin windows exercises every
branch: engage, trials, probation, inconclusive. Every window carries the per-request sums a
gateway exports (accepted², drafted², accepted·drafted), so the acceptance rate is bounded as the
guard bounds it now (`ratio_confidence_sequence`). Telemetry and status writes are not included.

The garbage collector is tuned as `specfleet run` tunes it (`tune_collector`: startup heap
frozen, young generation collected every 50 000 net allocations); `--default-collector` keeps
CPython's defaults, to see what the tuning buys.

Reports the wall time of a whole tick (all SpecModels' `decide` calls, their inputs built
beforehand; target < 50 ms at 1000), its CPU time (less sensitive to a busy machine) and per-call
p50 / p99.
Run: `.venv/bin/python bench/guard_latency.py [--specmodels 1000] [--ticks 40]
[--default-collector]`; writes
bench/results/guard_latency.json.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from specfleet.api import SpecModel
from specfleet.api.status import GuardStatus, KillSwitchStatus, RevisionRecord
from specfleet.controller.run import tune_collector
from specfleet.guard import Decision, Policy, Situation, decide
from specfleet.simulate.outcome import ALPHA_SPREAD, moments
from specfleet.telemetry.model import ClassWindow, Observation

ROOT = Path(__file__).resolve().parent.parent
CLASSES = ("code", "tools", "json", "chat")
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def specmodel_policy(index: int, rng: random.Random) -> Policy:
    document = {
        "apiVersion": "specfleet.dev/v1alpha1",
        "kind": "SpecModel",
        "metadata": {"name": f"m{index}", "namespace": "bench", "generation": 1},
        "spec": {
            "engine": {"name": "vllm"},
            "model": {"source": "org/model"},
            "speculative": {"method": "eagle3", "draftModel": "d", "numSpeculativeTokens": 4},
            "classes": [
                {"name": "code", "critical": True, "slo": {"minAcceptanceRate": 0.3}},
                {"name": "tools", "slo": {"minToolCallValidity": rng.choice([0.95, 0.97])}},
                {"name": "json", "slo": {"minStructuredOutputValidity": 0.98}},
                {"name": "chat", "slo": {"maxP95TpotSeconds": 0.06}},
            ],
            "defaultClass": "chat",
            "guard": {"minSpeedup": rng.choice([1.0, 1.05, 1.1])},
        },
    }
    return Policy.of(SpecModel.model_validate(document), None)  # valid by construction


def class_window(alpha: float, requests: float, rng: random.Random) -> ClassWindow:
    steps = requests * 60
    accepted = steps * 4 * alpha * rng.uniform(0.95, 1.05)
    # The per-request sums a gateway exports, for requests ALPHA_SPREAD apart (the simulator's).
    sums = moments(requests, steps * 4, accepted, ALPHA_SPREAD)
    return ClassWindow(
        requests=requests,
        errors=0.0,
        draft_tokens=steps * 4,
        accepted_tokens=accepted,
        spec_requests=requests,
        accepted_squares=sums["accepted_squares"],
        drafted_squares=sums["drafted_squares"],
        accepted_by_drafted=sums["accepted_by_drafted"],
        steps=steps,
        output_tokens=steps + accepted,
        p95_ttft_seconds=0.4,
        p95_tpot_seconds=0.03,
        mean_tpot_seconds=0.02,
        tpot_samples=requests,
        request_seconds=requests * rng.uniform(2.0, 8.0),
        tool_calls_valid=requests * 0.98,
        tool_calls_invalid=requests * 0.02,
        structured_valid=requests,
        structured_invalid=0.0,
    )


def observation(index: int, tick: int, speculation: bool, rng: random.Random) -> Observation:
    collapsing = index % 5 == 0 and tick >= 10
    thin = index % 7 == 0
    classes = {
        name: class_window(
            0.05 if collapsing and name == "code" else rng.uniform(0.35, 0.6),
            5.0 if thin else rng.uniform(40, 400),
            rng,
        )
        for name in CLASSES
    }
    return Observation(T0, 60, 1, speculation, classes)


def start(policy: Policy, index: int) -> Situation:
    verdict = "probation" if index % 3 == 0 else "good"
    return Situation(
        policy=policy,
        guard=GuardStatus(),
        kill_switch=KillSwitchStatus(),
        revision=RevisionRecord(number=1, hash="a" * 10, verdict=verdict),
        has_last_good=index % 3 != 0,
        speculation=True,
        settled=True,
        observation=None,
        now=T0,
    )


def run(specmodels: int, ticks: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    situations = [start(specmodel_policy(i, rng), i) for i in range(specmodels)]
    per_call: list[float] = []
    per_tick: list[float] = []
    cpu_per_tick: list[float] = []
    actions = 0
    for tick in range(ticks):
        now = T0 + timedelta(seconds=15 * (tick + 1))
        # Built per tick, as telemetry hands them over: only one tick's windows are alive.
        calls = [windows(s, i, tick, rng, now) for i, s in enumerate(situations)]
        decisions: list[Decision] = []
        began, cpu = time.perf_counter(), time.process_time()
        for call in calls:
            called = time.perf_counter()
            decisions.append(decide(call))
            per_call.append(time.perf_counter() - called)
        per_tick.append(time.perf_counter() - began)
        cpu_per_tick.append(time.process_time() - cpu)
        actions += sum(len(d.actions) for d in decisions)
        situations = [carry(s, d) for s, d in zip(situations, decisions, strict=True)]
    result = summarize(specmodels, ticks, per_tick, per_call, actions)
    result["tickCpuMs"] = {"p50": round(statistics.median(cpu_per_tick) * 1000, 2)}
    return result


def windows(
    situation: Situation, index: int, tick: int, rng: random.Random, now: datetime
) -> Situation:
    """The tick's windows: the fleet's, and during a trial its canary's beside it."""
    fleet = observation(index, tick, situation.speculation, rng)
    trial = situation.kill_switch.state == "trial"
    canary = observation(index, tick, True, rng) if trial else None
    return replace(situation, observation=fleet, canary=canary, now=now)


def carry(situation: Situation, decision: Decision) -> Situation:
    """The next tick's state, as the operator would write it back."""
    return replace(
        situation,
        guard=decision.guard,
        kill_switch=decision.kill_switch,
        revision=situation.revision.model_copy(update={"verdict": decision.verdict}),
        speculation=decision.kill_switch.state == "released",
    )


def summarize(
    specmodels: int, ticks: int, per_tick: list[float], per_call: list[float], actions: int
) -> dict[str, Any]:
    calls = sorted(per_call)
    ms = 1000.0
    return {
        "specmodels": specmodels,
        "classesPerSpecModel": len(CLASSES),
        "ticks": ticks,
        "actions": actions,
        "tickMs": {
            "mean": round(statistics.fmean(per_tick) * ms, 2),
            "p50": round(statistics.median(per_tick) * ms, 2),
            "max": round(max(per_tick) * ms, 2),
        },
        "callUs": {
            "p50": round(calls[len(calls) // 2] * 1e6, 1),
            "p99": round(calls[int(len(calls) * 0.99)] * 1e6, 1),
            "max": round(calls[-1] * 1e6, 1),
        },
        "targetTickMs": 50,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--specmodels", type=int, default=1000)
    parser.add_argument("--ticks", type=int, default=40)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--default-collector", action="store_true")
    args = parser.parse_args()
    if not args.default_collector:
        tune_collector()
    result = run(args.specmodels, args.ticks, args.seed)
    result["collector"] = "default" if args.default_collector else "operator"
    print(
        f"decide x {result['specmodels']} SpecModels x {result['classesPerSpecModel']} classes, "
        f"{result['ticks']} ticks ({result['actions']} actions), {result['collector']} collector\n"
        f"  tick wall time: mean {result['tickMs']['mean']} ms, p50 {result['tickMs']['p50']} ms, "
        f"max {result['tickMs']['max']} ms (target < {result['targetTickMs']} ms); "
        f"CPU p50 {result['tickCpuMs']['p50']} ms\n"
        f"  per call: p50 {result['callUs']['p50']} us, p99 {result['callUs']['p99']} us, "
        f"max {result['callUs']['max']} us"
    )
    out = ROOT / "bench/results/guard_latency.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
