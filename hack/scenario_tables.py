"""The tables in examples/scenarios/README.md that come from the committed replay outputs
(examples/scenarios/<name>/summary.json and decisions.json), written between marker comments,
so no number in them is copied by hand. tests/test_scenario_tables.py fails when they drift.

Run: `.venv/bin/python hack/scenario_tables.py` (rewrites the README), `--check` (exit 1 when it
would change anything). Regenerate the outputs first: `bench/simulate_goodput.py
--write-examples`.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "examples/scenarios"
README = SCENARIOS / "README.md"
ORDER = [
    "acceptance-collapse",
    "bad-quantization",
    "noisy-healthy-24h",
    "low-acceptance",
    "high-load",
    "low-traffic",
    "moderate-acceptance",
    "minor-class-collapse",
    "slow-revision",
    "broken-during-probation",
    "canary-rollouts",
]
"""The README's order; any other scenario with outputs follows, by name."""
BASELINES = {"always_on": "always-on", "always_off": "always-off"}


def scenarios() -> list[str]:
    found = sorted(p.parent.name for p in SCENARIOS.glob("*/summary.json"))
    return [n for n in ORDER if n in found] + [n for n in found if n not in ORDER]


def load(name: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    summary = json.loads((SCENARIOS / name / "summary.json").read_text())
    decisions = json.loads((SCENARIOS / name / "decisions.json").read_text())
    return summary, decisions


def results() -> str:
    """The results table, its footnotes and the line about the set."""
    lines = [
        "| scenario | decisions (s from the start) | acting | detection / rollback latency "
        "| false | missed | guarded | always-on | always-off | oracle | guarded / oracle "
        "| / oracle with rollouts |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    notes: list[str] = []
    ratios: dict[str, tuple[float, float]] = {}
    worse: list[str] = []  # runs below both always-on and always-off
    for name in scenarios():
        summary, decisions = load(name)
        goodput = summary["goodput"]
        marked = []
        for key in BASELINES:
            value = f"{goodput[key]['tokensPerDecodeSecond']:.1f}"
            if goodput[key]["sloViolationSeconds"]:
                value += "*"
            marked.append(value)
        violated = {
            label: goodput[key]["sloViolationSeconds"]
            for key, label in BASELINES.items()
            if goodput[key]["sloViolationSeconds"]
        }
        if violated:
            spans = ", ".join(f"{s:.0f} s {label}" for label, s in violated.items())
            guarded = goodput["guarded"]["sloViolationSeconds"]
            notes.append(f"{name} for {spans} (guarded: {guarded:.0f} s)")
        ratio = goodput["ratios"]
        ratios[name] = (ratio["guardedVsOracle"], ratio["guardedVsOracleRollout"])
        if max(ratio["guardedVsAlwaysOn"], ratio["guardedVsAlwaysOff"]) < 1:
            worse.append(name)
        lines.append(
            "| "
            + " | ".join(
                [
                    name,
                    timeline(decisions),
                    str(summary["actingActions"]),
                    latency(summary),
                    str(len(summary["falseActions"])),
                    str(len(summary["missed"])),
                    f"{goodput['guarded']['tokensPerDecodeSecond']:.1f}",
                    *marked,
                    f"{goodput['oracle']['tokensPerDecodeSecond']:.1f}",
                    f"{ratio['guardedVsOracle']:.3f}",
                    f"{ratio['guardedVsOracleRollout']:.3f}",
                ]
            )
            + " |"
        )
    below = ", ".join(worse) or "none"
    if notes:
        lines += ["", f"\\* served a class below its quality floor: {'; '.join(notes)}."]
    lines += ["", f"{the_set(ratios)} Below both always-on and always-off: {below}."]
    return "\n".join(lines)


def timeline(decisions: list[dict[str, Any]]) -> str:
    """Each kind of decision once, in order of its first, with its times."""
    times: dict[str, list[str]] = {}
    for decision in decisions:
        times.setdefault(decision["action"], []).append(f"{decision['t']:.0f}")
    return "; ".join(f"{action} {', '.join(ts)}" for action, ts in times.items()) or "none"


def latency(summary: dict[str, Any]) -> str:
    parts = [f"detected in {s:.0f} s" for s in summary["detectionLatencySeconds"]]
    parts += [
        f"rolled back {r['latencySeconds']:.0f} s after serving" for r in summary["rollbacks"]
    ]
    parts += [
        f"rev {b['revision']} aborted {b['secondsToDecision']:.0f} s after its first request "
        f"({b['shareOfRequestsAfterChange']:.1%} of the requests)"
        for b in summary["badRevisions"]
        if b["action"] == "rollout_aborted"
    ]
    parts += [
        "undetectable (too few requests a window)"
        for e in summary["episodes"]
        if e["detectedAt"] is None and not e["detectable"] and e["speculationAtStart"]
    ]
    return "; ".join(parts) or "-"


def the_set(ratios: dict[str, tuple[float, float]]) -> str:
    def over(names: list[str]) -> str:
        oracle = [ratios[n][0] for n in names]
        rollouts = [ratios[n][1] for n in names]
        worst = min(names, key=lambda n: ratios[n][0])
        return (
            f"guarded / oracle mean {statistics.fmean(oracle):.3f}, worst {ratios[worst][0]:.3f} "
            f"({worst}); against the oracle with rollouts mean {statistics.fmean(rollouts):.3f}, "
            f"worst {min(rollouts):.3f}"
        )

    names = list(ratios)
    worst = min(names, key=lambda n: ratios[n][0])
    rest = [n for n in names if n != worst]
    return (
        f"Over the set of {len(names)}, each scenario weighing the same: {over(names)}. "
        f"Without {worst}: {over(rest)}."
    )


BLOCKS = {"results": results}
MARKER = re.compile(
    r"(<!-- BEGIN generated by hack/scenario_tables.py: (\w+) -->\n)(.*?)"
    r"(<!-- END generated: \2 -->)",
    re.DOTALL,
)


def rewrite(text: str) -> str:
    def block(match: re.Match[str]) -> str:
        return match.group(1) + BLOCKS[match.group(2)]() + "\n" + match.group(4)

    new, count = MARKER.subn(block, text)
    if count != len(BLOCKS):
        raise SystemExit(f"{README}: expected {len(BLOCKS)} generated blocks, found {count}")
    return new


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the README is stale")
    args = parser.parse_args()
    text = README.read_text()
    new = rewrite(text)
    if args.check:
        if new != text:
            print(f"{README.relative_to(ROOT)} is stale: run hack/scenario_tables.py")
            sys.exit(1)
        return
    README.write_text(new)


if __name__ == "__main__":
    main()
