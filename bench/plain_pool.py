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
from specfleet.scenario import parse_scenario
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


def replay(variant: dict[str, Any], seed: int) -> Result:
    document = yaml.safe_load((SCENARIOS / "plain-pool.yaml").read_text())
    document["rollouts"][0]["spec"] = variant["change"]
    specmodel = load_specmodel_document(SCENARIOS / "plain-pool.specmodel.yaml")
    specmodel = merge(specmodel, {"spec": variant.get("start", {})})
    world = build_world(specmodel, parse_scenario(document))
    return simulate(world, SimulationSettings(seed=seed))


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
    text = json.dumps(rows, indent=2) + "\n"
    print(text, end="")
    out = ROOT / "bench/results/plain_pool.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
