"""decisions.json, summary.json and the printed summary of a replay."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from specfleet.guard.actions import ActionKind
from specfleet.signals import SPEEDUP
from specfleet.simulate.analysis import describe
from specfleet.simulate.replay import Goodput
from specfleet.simulate.simulation import Result
from specfleet.simulate.truth import Truth

GOODPUT_DEFINITION = (
    "valid output tokens per decode-second: output tokens of requests that neither failed nor "
    "answered with an invalid tool call or broken JSON, divided by the decode time of every "
    "request (output tokens x mean TPOT of its slice, failed requests included)"
)


def decisions(result: Result) -> list[dict[str, Any]]:
    return [_jsonable(d) for d in result.run.decisions]


def summary(result: Result) -> dict[str, Any]:
    world, guard = result.world, result.guard
    latencies = [e.latency for e in result.episodes if e.latency is not None]
    return {
        "specmodel": world.changes[0].specmodel.metadata.name,
        "seed": result.seed,
        "durationSeconds": world.scenario.duration_s,
        "tickSeconds": guard.interval_seconds,
        "windowSeconds": guard.window_seconds,
        "sliceSeconds": result.base.slice_seconds,
        "rolloutSeconds": result.base.rollout_seconds,
        "actions": [_action(d, result) for d in result.run.decisions],
        "actingActions": len(result.acting),
        "canaryServedSeconds": result.base.slice_seconds
        * sum(1 for served in result.run.canary if served is not None),
        "plainPoolRequests": plain_pool_requests(result),
        "episodes": [e.to_json() for e in result.episodes],
        "detectionLatencySeconds": latencies,
        "maxDetectionLatencySeconds": max(latencies) if latencies else None,
        "rollbacks": rollbacks(result),
        "badRevisions": bad_revisions(result),
        "trueTpotSpeedup": _range([t.tpot_speedup for t in result.truths]),
        "guardSpeedup": _range([t.speedup for t in result.run.ticks]),
        "falseActions": result.false_actions,
        "missed": result.missed,
        "goodput": goodput(result.goodput),
        "revisions": [
            {"number": r.number, "config": r.config, "since": r.since, "k": r.k}
            for r in world.revisions.values()
        ],
        "notes": list(world.notes),
    }


SPECULATION_RULES = (
    ActionKind.KILL_SWITCH_ENGAGED,
    ActionKind.TRIAL_FAILED,
    ActionKind.KILL_SWITCH_RELEASED,
)
"""Decisions about speculation itself: their summary names the rule that acted."""
RULES = {
    "criticalFloor": "a critical class under its acceptance floor",
    "notPaying": "speedup under minSpeedup",
    "notPayingAndCriticalFloor": "speedup under minSpeedup and a critical class under its floor",
    "pays": "speedup over minSpeedup + releaseMargin, floors met",
}


def _action(decision: dict[str, Any], result: Result) -> dict[str, Any]:
    out = {"t": decision["t"], "action": decision["action"], "reason": decision["reason"]}
    found = basis(decision, result)
    return out | {"basis": found} if found else out


def basis(decision: dict[str, Any], result: Result) -> dict[str, Any] | None:
    """For a kill switch or trial decision, the rule that acted (`RULES`), the guard's
    breaches and speedup, and the true speedup at that tick beside them: the guard's reason
    `SpeculationNotPaying` also covers a critical class under its acceptance floor while
    speculation pays."""
    if decision["action"] not in SPECULATION_RULES:
        return None
    evidence = decision["evidence"]
    breaches = [b for b in evidence.get("breaches", []) if isinstance(b, str)]
    floors = any(": acceptance " in b for b in breaches)
    speedup, needed = evidence.get(SPEEDUP), evidence.get("minSpeedup")
    slow = any(": speedup " in b for b in breaches) or (
        speedup is not None and needed is not None and speedup < needed
    )
    if decision["action"] == ActionKind.KILL_SWITCH_RELEASED:
        rule = "pays"
    elif floors:
        rule = "notPayingAndCriticalFloor" if slow else "criticalFloor"
    else:
        rule = "notPaying"
    truth = _truth_at(result, decision["t"])
    return {
        "rule": rule,
        "breaches": breaches,
        "guardSpeedup": speedup,
        "minSpeedup": needed,
        "trueSpeedup": _round(truth.speedup if truth else None),
        "trueTpotSpeedup": _round(truth.tpot_speedup if truth else None),
    }


def _truth_at(result: Result, t: float) -> Truth | None:
    return next(
        (tr for tick, tr in zip(result.run.ticks, result.truths, strict=True) if tick.t == t), None
    )


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _basis_text(found: dict[str, Any]) -> str:
    guard = found["guardSpeedup"]
    judged = (
        f"; guard's speedup {guard:.2f} vs {found['minSpeedup']:.2f} needed"
        if guard is not None and found["minSpeedup"] is not None
        else ""
    )
    true = found["trueSpeedup"]
    tpot = found["trueTpotSpeedup"]
    truly = (
        f"; true speedup {true:.2f} (TPOT {tpot:.2f})"
        if true is not None and tpot is not None
        else ""
    )
    on = f" ({'; '.join(found['breaches'])})" if found["breaches"] else ""
    return f"rule: {RULES[found['rule']]}{on}{judged}{truly}"


def goodput(runs: dict[str, Goodput]) -> dict[str, Any]:
    guarded = runs["guarded"].rate
    out: dict[str, Any] = {"definition": GOODPUT_DEFINITION}
    for name, run in runs.items():
        out[name] = {
            "validTokens": round(run.valid_tokens),
            "decodeSeconds": round(run.decode_seconds, 1),
            "tokensPerDecodeSecond": round(run.rate, 3),
            "sloViolationSeconds": run.slo_violation_seconds,
            "gpuSeconds": round(run.gpu_seconds),
        }
    out["ratios"] = {
        f"guardedVs{name.title().replace('_', '')}": round(guarded / run.rate, 4)
        for name, run in runs.items()
        if name != "guarded" and run.rate
    }
    return out


def plain_pool_requests(result: Result) -> dict[str, int]:
    """Requests the plain pool served, per class it served."""
    served = [s for s in result.run.plain if s is not None]
    totals = {n: sum(s[n].requests for s in served) for n in result.world.scenario.classes}
    return {n: count for n, count in totals.items() if count}


def rollbacks(result: Result) -> list[dict[str, Any]]:
    """Each rollback with the time since the bad revision began serving."""
    out = []
    for d in result.run.decisions:
        if d["action"] != ActionKind.ROLLED_BACK:
            continue
        config = result.world.by_number(d["revision"]).config
        first = next(i for i, s in enumerate(result.run.serving) if s.config == config)
        since = result.base.time(first)
        out.append(
            {
                "t": d["t"],
                "revision": d["revision"],
                "servingSince": since,
                "latencySeconds": d["t"] - since,
            }
        )
    return out


ENDED_BAD = (ActionKind.ROLLED_BACK, ActionKind.ROLLOUT_ABORTED)


def bad_revisions(result: Result) -> list[dict[str, Any]]:
    """Each revision rolled back or aborted on its canary: from the first request it served to
    the decision, and its share of the requests the run served from its change on."""
    out = []
    requests = result.run.requests
    for d in result.run.decisions:
        if d["action"] not in ENDED_BAD or d["dryRun"]:
            continue
        aborted = d["action"] == ActionKind.ROLLOUT_ABORTED
        revision = result.world.by_number(d["evidence"]["revision"] if aborted else d["revision"])
        end = result.base.index(d["t"])
        first = next(i for i, r in enumerate(requests) if r.get(revision.config))
        served = sum(r.get(revision.config, 0) for r in requests[:end])
        after = sum(sum(r.values()) for r in requests[result.base.index(revision.since) :])
        out.append(
            {
                "t": d["t"],
                "action": d["action"],
                "revision": revision.number,
                "firstServedAt": result.base.time(first),
                "secondsToDecision": d["t"] - result.base.time(first),
                "requestsServed": served,
                "shareOfRequestsAfterChange": round(served / after, 4) if after else None,
            }
        )
    return out


def write(result: Result, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "decisions.json").write_text(json.dumps(decisions(result), indent=2) + "\n")
    (out / "summary.json").write_text(json.dumps(summary(result), indent=2) + "\n")


def text(result: Result) -> str:
    data = summary(result)
    lines = [
        f"{data['specmodel']}: {data['durationSeconds']:.0f}s simulated, seed {data['seed']}, "
        f"tick {data['tickSeconds']}s, window {data['windowSeconds']}s",
        "actions:" if data["actions"] else "actions: none",
    ]
    for a in data["actions"]:
        lines.append(f"  t={a['t']:>7.0f}s  {a['action']:<22} {a['reason']}")
        if "basis" in a:
            lines.append(f"  {'':>9}  {_basis_text(a['basis'])}")
    for e in result.episodes:
        if not e.speculation_at_start:
            found = "speculation already off"
        elif e.detected_at is None and not e.detectable:
            most = max(e.requests_per_window.values(), default=0.0)
            found = (
                f"not acted on: undetectable, ≤{most:.0f} requests per class per window "
                f"< minRequests {result.guard.min_requests}"
            )
        elif e.detected_at is None:
            found = "not acted on"
        else:
            found = f"detected at t={e.detected_at:.0f}s ({e.action}), latency {e.latency:.0f}s"
        lines.append(f"t={e.start:.0f}-{e.end:.0f}s {describe(e)}: {found}")
    lines += [
        f"rollback of revision {r['revision']}: {r['latencySeconds']:.0f}s after it began serving"
        for r in data["rollbacks"]
    ]
    lines += [
        f"revision {b['revision']} {_ended(b['action'])} {b['secondsToDecision']:.0f}s after "
        f"its first request, having served {b['requestsServed']} requests, "
        f"{b['shareOfRequestsAfterChange']:.1%} of the run's from its change on"
        for b in data["badRevisions"]
    ]
    if data["canaryServedSeconds"]:
        lines.append(f"trial canaries took traffic for {data['canaryServedSeconds']}s")
    if data["plainPoolRequests"]:
        served = ", ".join(f"{n} {c}" for n, c in data["plainPoolRequests"].items())
        lines.append(f"the plain pool served requests of {served}")
    lines.append(f"false actions: {len(data['falseActions'])}, missed: {len(data['missed'])}")
    lines += [f"  false t={f['t']:.0f}s {f['action']}: {f['why']}" for f in data["falseActions"]]
    lines += [f"  missed t={m['t']:.0f}s: {m['what']}" for m in data["missed"]]
    lines.append("goodput (valid output tokens per decode-second), GPU-hours:")
    for name in ("guarded", "always_on", "always_off", "oracle", "oracle_rollout"):
        run = data["goodput"][name]
        violation = run["sloViolationSeconds"]
        note = f"  (quality SLO violated for {violation:.0f}s)" if violation else ""
        hours = run["gpuSeconds"] / 3600
        lines.append(f"  {name:<14} {run['tokensPerDecodeSecond']:9.2f} {hours:7.2f}{note}")
    ratios = data["goodput"]["ratios"]
    lines.append(
        "  guarded / oracle {:.3f} (/ oracle with rollouts {:.3f}), / always-on {:.3f}, "
        "/ always-off {:.3f}".format(
            ratios.get("guardedVsOracle", 0),
            ratios.get("guardedVsOracleRollout", 0),
            ratios.get("guardedVsAlwaysOn", 0),
            ratios.get("guardedVsAlwaysOff", 0),
        )
    )
    return "\n".join(lines)


def _ended(action: str) -> str:
    return "aborted on its canary" if action == ActionKind.ROLLOUT_ABORTED else "rolled back"


def _range(values: list[float | None]) -> dict[str, float] | None:
    """Min and max of the known values (per tick), rounded."""
    known = [v for v in values if v is not None]
    return {"min": round(min(known), 3), "max": round(max(known), 3)} if known else None


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))
