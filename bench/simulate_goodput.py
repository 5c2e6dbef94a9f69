"""The guard against its alternatives on every example scenario: goodput of the guarded replay
versus always-on, always-off and an oracle (same scenario, same draws), detection latency, false
and missed actions; detection latency over many seeds; the acceptance collapse over collapse
lengths (where a recovery falls between two trials is luck), under the default trial schedule
and under trials every two minutes; and what-if guard settings.

Goodput: valid output tokens per decode-second (see `specfleet.simulate`).

Run: `.venv/bin/python bench/simulate_goodput.py [--seeds 20] [--noisy-seeds 24]
[--write-examples]` (about six minutes); writes bench/results/simulate_goodput.json.
`--write-examples` also rewrites the committed decisions.json / summary.json / timeline.png under
examples/scenarios/<name>/, the tables in examples/scenarios/README.md
(hack/scenario_tables.py) and the README's replay pictures (docs/replay-*.png).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from specfleet.scenario import parse_scenario
from specfleet.simulate import report
from specfleet.simulate.inputs import build_world, load_specmodel_document, load_world
from specfleet.simulate.simulation import Result, SimulationSettings, simulate

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "examples/scenarios"
LLAMA = ROOT / "examples/llama-3.1-8b-eagle3-fp8.yaml"
DAILY = SCENARIOS / "noisy-healthy-24h.specmodel.yaml"
EXAMPLES = {
    "acceptance-collapse": LLAMA,
    "bad-quantization": SCENARIOS / "bad-quantization.specmodel.yaml",
    "noisy-healthy-24h": DAILY,
    "low-acceptance": LLAMA,
    "high-load": DAILY,
    "low-traffic": LLAMA,
    "moderate-acceptance": LLAMA,
    "minor-class-collapse": SCENARIOS / "minor-class-collapse.specmodel.yaml",
    "slow-revision": SCENARIOS / "slow-revision.specmodel.yaml",
    "broken-during-probation": SCENARIOS / "broken-during-probation.specmodel.yaml",
    "canary-rollouts": SCENARIOS / "canary-rollouts.specmodel.yaml",
    "plain-pool": SCENARIOS / "plain-pool.specmodel.yaml",
}
DOCS_PICTURES = {
    "acceptance-collapse": "docs/replay-collapse.png",
    "canary-rollouts": "docs/replay-canary-rollouts.png",
}
"""The README's replay pictures: copies of these examples' timelines."""
SCHEDULES = [{}, {"maxCooldownSeconds": 900}, {"maxCooldownSeconds": 120}]
"""Trial schedules the collapse sweeps run under: the default backoff (cooldown 60 s doubling
to 1800 s), capped at 900 s, and capped at 120 s (the default until 2026-11-23), which gets
back soonest and starts a canary every ~3 minutes on a drafter that never fits."""
WHAT_IF = [
    {"maxCooldownSeconds": 3600},
    {"cooldownSeconds": 300, "maxCooldownSeconds": 3600},
    {"consecutiveBreaches": 2},
]
"""More guard settings, beside the schedules, for the example collapse and low acceptance."""
COLLAPSE_LENGTHS = range(300, 1800, 150)
"""Seconds the collapse lasts in `collapse_lengths`: where a recovery falls between two
trials decides how long speculation stays off after it, so one scenario's length is luck."""


def row(name: str, result: Result, wall: float) -> dict[str, Any]:
    rates = {k: g.rate for k, g in result.goodput.items()}
    goodput = {k: round(rate, 2) for k, rate in rates.items()}
    latencies = [e.latency for e in result.episodes if e.latency is not None]
    return {
        "scenario": name,
        "actions": [f"{d['t']:.0f}s {d['action']}" for d in result.run.decisions],
        "acting": len(result.acting),
        "trials": sum(d["action"] == "trial_started" for d in result.run.decisions),
        "detectionLatencySeconds": latencies,
        "rollbackLatencySeconds": [r["latencySeconds"] for r in report.rollbacks(result)],
        "falseActions": len(result.false_actions),
        "missed": len(result.missed),
        "goodput": goodput,
        "vsOracle": round(rates["guarded"] / rates["oracle"], 4),
        "vsOracleRollout": round(rates["guarded"] / rates["oracle_rollout"], 4),
        "vsAlwaysOn": round(rates["guarded"] / rates["always_on"], 4),
        "vsAlwaysOff": round(rates["guarded"] / rates["always_off"], 4),
        "notBelowBoth": not _below_both(result),
        "wallSeconds": round(wall, 2),
    }


def examples(write: bool) -> list[dict[str, Any]]:
    rows = []
    for name, specmodel in EXAMPLES.items():
        began = time.perf_counter()
        result = simulate(load_world(specmodel, SCENARIOS / f"{name}.yaml"))
        rows.append(row(name, result, time.perf_counter() - began))
        if write:
            from specfleet.simulate.plot import draw_timeline

            report.write(result, SCENARIOS / name)
            draw_timeline(result, SCENARIOS / name / "timeline.png")
    if write:  # the README's tables and pictures from the outputs just written
        subprocess.run([sys.executable, str(ROOT / "hack/scenario_tables.py")], check=True)
        for name, picture in DOCS_PICTURES.items():
            shutil.copyfile(SCENARIOS / name / "timeline.png", ROOT / picture)
    return rows


def scenario_set(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Guarded / oracle over the example set, each scenario weighing the same (the goal is
    0.95 across the set), and the runs below both fixed policies (the goal: none)."""
    ratios = {key: [r[key] for r in rows] for key in ("vsOracle", "vsOracleRollout")}
    return {
        "scenarios": len(rows),
        **{
            key: {"min": min(values), "mean": round(statistics.fmean(values), 4)}
            for key, values in ratios.items()
        },
        "belowBoth": sum(not r["notBelowBoth"] for r in rows),
    }


def seed_sweep(
    name: str, seeds: int, traffic_rps: float | None = None, guard: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Detection / rollback latency, false actions and guarded / oracle over many seeds."""
    document = yaml.safe_load((SCENARIOS / f"{name}.yaml").read_text())
    if traffic_rps is not None:
        document["traffic_rps"] = traffic_rps
    specmodel = load_specmodel_document(EXAMPLES[name])
    specmodel["spec"]["guard"] = {**specmodel["spec"].get("guard", {}), **(guard or {})}
    world = build_world(specmodel, parse_scenario(document))
    latencies, rollbacks, results, false = [], [], [], 0
    for seed in range(seeds):
        result = simulate(world, SimulationSettings(seed=seed))
        latencies += [e.latency for e in result.episodes if e.latency is not None]
        rollbacks += [r["latencySeconds"] for r in report.rollbacks(result)]
        results.append(result)
        false += len(result.false_actions)
    return {
        "scenario": name,
        "trafficRps": traffic_rps,
        "guard": guard or {},
        "seeds": seeds,
        "detected": len(latencies),
        "latencySeconds": _spread(latencies),
        "rollbacks": len(rollbacks),
        "rollbackLatencySeconds": _spread(rollbacks),
        "falseActions": false,
        **_versus(results),
    }


def collapse_lengths(
    traffic_rps: float, seeds: int, guard: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Guarded / oracle of the acceptance collapse recovering after each of COLLAPSE_LENGTHS
    (900 s in the example), with 900 s of recovered traffic after it."""
    document = yaml.safe_load((SCENARIOS / "acceptance-collapse.yaml").read_text())
    specmodel = load_specmodel_document(EXAMPLES["acceptance-collapse"])
    specmodel["spec"]["guard"] = {**specmodel["spec"].get("guard", {}), **(guard or {})}
    results = []
    for length in COLLAPSE_LENGTHS:
        document["traffic_rps"] = traffic_rps
        document["classes"]["code"]["acceptance"] = [[0, 0.8], [600, 0.2], [600 + length, 0.8]]
        document["duration_s"] = 600 + length + 900
        world = build_world(specmodel, parse_scenario(document))
        results += [simulate(world, SimulationSettings(seed=seed)) for seed in range(seeds)]
    return {
        "trafficRps": traffic_rps,
        "guard": guard or {},
        "lengths": list(COLLAPSE_LENGTHS),
        "seeds": seeds,
        **_versus(results),
    }


def trial_rate(guard: dict[str, Any], hours: int = 4) -> dict[str, Any]:
    """Canaries started on a drafter that never fits (low-acceptance, `hours` long): in the
    first hour and per hour after it, when the backoff has reached its cap."""
    document = yaml.safe_load((SCENARIOS / "low-acceptance.yaml").read_text())
    document["duration_s"] = hours * 3600
    specmodel = load_specmodel_document(EXAMPLES["low-acceptance"])
    specmodel["spec"]["guard"] = {**specmodel["spec"].get("guard", {}), **guard}
    result = simulate(build_world(specmodel, parse_scenario(document)))
    starts = [d["t"] for d in result.run.decisions if d["action"] == "trial_started"]
    first = sum(t < 3600 for t in starts)
    return {
        "guard": guard,
        "firstHour": first,
        "perHourAfter": round((len(starts) - first) / (hours - 1), 1),
        "vsOracle": round(result.goodput["guarded"].rate / result.goodput["oracle"].rate, 3),
    }


def _versus(results: list[Result]) -> dict[str, Any]:
    """Guarded / oracle (min and mean) and the runs that did worse than both fixed policies."""
    ratios = [r.goodput["guarded"].rate / r.goodput["oracle"].rate for r in results]
    return {
        "vsOracle": {"min": round(min(ratios), 3), "mean": round(statistics.fmean(ratios), 3)},
        "belowBoth": sum(_below_both(r) for r in results),
    }


def _below_both(result: Result) -> bool:
    """The guarded run did worse than always-on and always-off alike."""
    rate = {k: g.rate for k, g in result.goodput.items()}
    return rate["guarded"] < min(rate["always_on"], rate["always_off"])


def _spread(values: list[float]) -> dict[str, float | None]:
    return {
        "min": min(values, default=None),
        "median": statistics.median(values) if values else None,
        "max": max(values, default=None),
    }


def what_if(name: str, guard: dict[str, Any]) -> dict[str, Any]:
    specmodel = load_specmodel_document(EXAMPLES[name])
    specmodel["spec"]["guard"] = {**specmodel["spec"].get("guard", {}), **guard}
    scenario = parse_scenario(yaml.safe_load((SCENARIOS / f"{name}.yaml").read_text()))
    result = simulate(build_world(specmodel, scenario))
    return row(name, result, 0.0) | {"guard": guard}


def print_table(rows: list[dict[str, Any]]) -> None:
    print(
        f"{'scenario':<21}{'acting':>7}{'detect s':>9}{'rollback s':>11}{'false':>6}{'missed':>7}"
        f"{'guarded':>9}{'on':>8}{'off':>8}{'oracle':>8}{'/oracle':>8}{'/orc+ro':>8}"
        f"{'/on':>7}{'/off':>7}"
    )
    for r in rows:
        g = r["goodput"]
        detect = ",".join(f"{x:.0f}" for x in r["detectionLatencySeconds"]) or "-"
        rollback = ",".join(f"{x:.0f}" for x in r["rollbackLatencySeconds"]) or "-"
        print(
            f"{r['scenario']:<21}{r['acting']:>7}{detect:>9}{rollback:>11}{r['falseActions']:>6}"
            f"{r['missed']:>7}{g['guarded']:>9.2f}{g['always_on']:>8.2f}{g['always_off']:>8.2f}"
            f"{g['oracle']:>8.2f}{r['vsOracle']:>8.4f}{r['vsOracleRollout']:>8.4f}"
            f"{r['vsAlwaysOn']:>7.3f}{r['vsAlwaysOff']:>7.3f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--noisy-seeds", type=int, default=24)
    parser.add_argument("--write-examples", action="store_true")
    args = parser.parse_args()
    rows = examples(args.write_examples)
    print("goodput: valid output tokens per decode-second; latency: detection (rollback)")
    print_table(rows)
    summary = scenario_set(rows)
    print(
        f"the set of {summary['scenarios']}: guarded / oracle min {summary['vsOracle']['min']}, "
        f"mean {summary['vsOracle']['mean']}; / oracle with rollouts min "
        f"{summary['vsOracleRollout']['min']}, mean {summary['vsOracleRollout']['mean']}; "
        f"below both always-on and always-off {summary['belowBoth']}"
    )
    sweeps = [
        seed_sweep("acceptance-collapse", args.seeds, traffic_rps=rps, guard=guard)
        for guard in (SCHEDULES[0], SCHEDULES[-1])
        for rps in (4.0, 8.0)
    ]
    sweeps += [
        seed_sweep("bad-quantization", args.seeds),
        seed_sweep("noisy-healthy-24h", args.noisy_seeds),
    ]
    print("\nover seeds (latency min/median/max s, guarded / oracle min and mean):")
    for s in sweeps:
        lat, back = s["latencySeconds"], s["rollbackLatencySeconds"]
        rps = f" at {s['trafficRps'] / 2:g} req/s per class" if s["trafficRps"] else ""
        print(
            f"  {s['scenario']}{rps} {json.dumps(s['guard'])}, {s['seeds']} seeds: detected "
            f"{s['detected']} ({lat['min']}/{lat['median']}/{lat['max']}), rolled back "
            f"{s['rollbacks']} ({back['min']}/{back['median']}/{back['max']}), false actions "
            f"{s['falseActions']}, vs oracle {s['vsOracle']['min']} / {s['vsOracle']['mean']}, "
            f"below both always-on and always-off {s['belowBoth']}"
        )
    lengths = [
        collapse_lengths(rps, max(args.seeds // 10, 1), guard)
        for guard in SCHEDULES
        for rps in (4.0, 8.0)
    ]
    print(f"\nacceptance collapse lasting {COLLAPSE_LENGTHS.start}-{COLLAPSE_LENGTHS[-1]} s:")
    for length in lengths:
        ratio = length["vsOracle"]
        print(
            f"  {length['trafficRps'] / 2:g} req/s per class {json.dumps(length['guard'])}, "
            f"{length['seeds']} seeds per length: guarded / oracle min {ratio['min']}, "
            f"mean {ratio['mean']}, below both always-on and always-off {length['belowBoth']}"
        )
    rates = [trial_rate(guard) for guard in SCHEDULES + WHAT_IF[:2]]
    print("\ncanaries on a drafter that never fits (low-acceptance, 4 hours):")
    for rate in rates:
        print(
            f"  {json.dumps(rate['guard']):<50} first hour {rate['firstHour']:>2}, then "
            f"{rate['perHourAfter']} an hour; guarded / oracle {rate['vsOracle']}"
        )
    variants = [
        what_if(name, guard)
        for name in ("acceptance-collapse", "low-acceptance")
        for guard in SCHEDULES + WHAT_IF
    ]
    print("\nwhat if (guard settings changed in the SpecModel):")
    for v in variants:
        print(
            f"  {v['scenario']:<21} {json.dumps(v['guard']):<50} acting {v['acting']:>2}, "
            f"trials {v['trials']:>2}, false {v['falseActions']}, guarded / oracle "
            f"{v['vsOracle']:.3f}, latency {v['detectionLatencySeconds']}"
        )
    out = ROOT / "bench/results/simulate_goodput.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    results = {
        "examples": rows,
        "exampleSet": summary,
        "seeds": sweeps,
        "collapseLengths": lengths,
        "trialRates": rates,
        "whatIf": variants,
    }
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
