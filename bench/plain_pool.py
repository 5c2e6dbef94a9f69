"""A class served by the plain pool against the fleet-wide switch and against every class
speculating, on examples/scenarios/plain-pool.yaml: the same scenario and the same draws, its
change at t=600 being `guard.classesOff: [creative]` (routed: creative to the plain pool, code
speculating on the fleet), `guard.mode: off` (the fleet-wide switch: no class speculates) or
`guard.mode: on` (every class speculates); routed on the same four GPUs (the fleet down to
three pods, the pool at most one); and the guard routing on its own from the start
(`guard.routeClasses`, no change at t=600). Each is the guarded replay (`specfleet simulate`),
so the operator's own tick sizes the pool and routes the class.

Prints, per variant over the seeds: goodput (valid output tokens per decode-second, see
`specfleet.simulate`), GPU-hours (the fleet's pods, a rollout's surge pod, trial canaries and
the plain pool's pods, from their start), valid output tokens per GPU-second, and each class's
mean TPOT from `--after` seconds on (whichever pods served it); writes
bench/results/plain_pool.json.

Then the guard as it ships (the fleet-wide kill switch, a class named) against the same guard
routing classes (`guard.routeClasses: true`) on the example scenarios where one class stops
paying (`EXAMPLES_ONE_CLASS`), with their own SpecModels: goodput, GPU-hours, requests on the
pool and seed 0's actions.

Run: `.venv/bin/python bench/plain_pool.py [--seeds 5] [--after 900]` (a few seconds a seed).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

import yaml

from specfleet.documents import merge
from specfleet.scenario import load_scenario, parse_scenario
from specfleet.simulate import report
from specfleet.simulate.inputs import build_world, load_specmodel_document
from specfleet.simulate.simulation import Result, SimulationSettings, simulate

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "examples/scenarios"
VARIANTS: dict[str, dict[str, Any]] = {
    "routed": {"change": {"guard": {"classesOff": ["creative"]}}},
    "routed, 3+1 pods": {
        "change": {
            "guard": {"classesOff": ["creative"]},
            "pod": {"replicas": 3},
            "plainPool": {"maxReplicas": 1},
        }
    },
    "guard routes": {"start": {"guard": {"routeClasses": True}}, "change": {}},
    "fleet-wide off": {"change": {"guard": {"mode": "off"}}},
    "all speculating": {"change": {"guard": {"mode": "on"}}},
}
"""Per variant, the spec from the start (merged into the SpecModel's) and the change at t=600."""
LLAMA = ROOT / "examples/llama-3.1-8b-eagle3-fp8.yaml"
EXAMPLES_ONE_CLASS = {
    "minor-class-collapse": SCENARIOS / "minor-class-collapse.specmodel.yaml",
    "acceptance-collapse": LLAMA,
    "low-acceptance": LLAMA,
}
"""The examples where one class's speculation stops paying (or never does), and their
SpecModels (as `bench/simulate_goodput.py` replays them); plain-pool's is the table above."""


def replay(variant: dict[str, Any], seed: int) -> Result:
    document = yaml.safe_load((SCENARIOS / "plain-pool.yaml").read_text())
    document["rollouts"][0]["spec"] = variant["change"]
    specmodel = load_specmodel_document(SCENARIOS / "plain-pool.specmodel.yaml")
    specmodel = merge(specmodel, {"spec": variant.get("start", {})})
    world = build_world(specmodel, parse_scenario(document))
    return simulate(world, SimulationSettings(seed=seed))


def replay_example(name: str, route: bool, seed: int) -> Result:
    specmodel = load_specmodel_document(EXAMPLES_ONE_CLASS[name])
    specmodel = merge(specmodel, {"spec": {"guard": {"routeClasses": route}}})
    world = build_world(specmodel, load_scenario(SCENARIOS / f"{name}.yaml"))
    return simulate(world, SimulationSettings(seed=seed))


def example(name: str, seeds: int) -> dict[str, Any]:
    """The example replayed with the guard as it ships and routing classes, same seeds."""
    found: dict[str, Any] = {"scenario": name}
    for label, route in (("fleetWide", False), ("routed", True)):
        runs = [replay_example(name, route, seed) for seed in range(seeds)]
        found[label] = {
            "goodput": round(statistics.fmean(r.run.goodput.rate for r in runs), 2),
            "gpuHours": round(statistics.fmean(r.run.goodput.gpu_seconds for r in runs) / 3600, 3),
            "plainPoolRequests": round(
                statistics.fmean(sum(report.plain_pool_requests(r).values()) for r in runs)
            ),
            "actionsSeed0": [f"{d['t']:.0f}s {d['action']}" for d in runs[0].run.decisions],
        }
    return found


def measured(result: Result, after: float) -> dict[str, Any]:
    run = result.run
    goodput = run.goodput
    first = result.base.index(after)
    parts = [*run.slices[first:], *(p for p in run.plain[first:] if p is not None)]
    parts += [c for c in run.canary[first:] if c is not None]
    tpot = {}
    for name in result.world.scenario.classes:
        tokens = sum(p[name].output_tokens for p in parts)
        tpot[name] = sum(p[name].tpot_seconds_total for p in parts) / tokens if tokens else None
    return {
        "goodput": goodput.rate,
        "gpuHours": goodput.gpu_seconds / 3600,
        "validTokensPerGpuSecond": goodput.valid_tokens / goodput.gpu_seconds,
        "meanTpotSeconds": tpot,
        "plainPoolRequests": sum(report.plain_pool_requests(result).values()),
        "actions": [f"{d['t']:.0f}s {d['action']}" for d in run.decisions],
    }


def variant(name: str, seeds: int, after: float) -> dict[str, Any]:
    runs = [measured(replay(VARIANTS[name], seed), after) for seed in range(seeds)]

    def mean(key: str) -> float:
        return statistics.fmean(r[key] for r in runs)

    classes = runs[0]["meanTpotSeconds"]
    return {
        "variant": name,
        "spec": VARIANTS[name],
        "seeds": seeds,
        "goodput": round(mean("goodput"), 2),
        "goodputRange": [round(f(r["goodput"] for r in runs), 2) for f in (min, max)],
        "gpuHours": round(mean("gpuHours"), 3),
        "validTokensPerGpuSecond": round(mean("validTokensPerGpuSecond"), 1),
        "meanTpotMs": {
            n: round(1000 * statistics.fmean(r["meanTpotSeconds"][n] for r in runs), 2)
            for n in classes
        },
        "plainPoolRequests": round(mean("plainPoolRequests")),
        "actionsSeed0": runs[0]["actions"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--after", type=float, default=900.0)
    args = parser.parse_args()
    rows = [variant(name, args.seeds, args.after) for name in VARIANTS]
    print(
        f"plain-pool.yaml, {args.seeds} seeds; mean TPOT from t={args.after:.0f}s; goodput in "
        "valid output tokens per decode-second"
    )
    row = "{:<18}{:>8}{:>7}{:>13}{:>10}{:>14}{:>15}".format
    print(row("variant", "goodput", "GPU-h", "tokens/GPU-s", "code ms", "creative ms", "on pool"))
    for r in rows:
        tpot = r["meanTpotMs"]
        numbers = (r["goodput"], r["gpuHours"], r["validTokensPerGpuSecond"], *tpot.values())
        print(row(r["variant"], *(f"{n:.2f}" for n in numbers), r["plainPoolRequests"]))
    examples = [example(name, args.seeds) for name in EXAMPLES_ONE_CLASS]
    print(f"\nthe guard as it ships against routeClasses, {args.seeds} seeds")
    line = "{:<22}{:>18}{:>18}{:>10}".format
    print(line("example", "goodput ship/route", "GPU-h ship/route", "on pool"))
    for e in examples:
        ship, routed = e["fleetWide"], e["routed"]
        goodput = f"{ship['goodput']:.2f} / {routed['goodput']:.2f}"
        hours = f"{ship['gpuHours']:.2f} / {routed['gpuHours']:.2f}"
        print(line(e["scenario"], goodput, hours, routed["plainPoolRequests"]))
    text = json.dumps({"variants": rows, "examples": examples}, indent=2) + "\n"
    print(text, end="")
    out = ROOT / "bench/results/plain_pool.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
