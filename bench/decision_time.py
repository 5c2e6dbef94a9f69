"""How long the guard takes to decide, and how often it decides wrongly, against per-class traffic.

Replays (`specfleet.simulate`, the guard's real tick on a virtual clock) over many seeds:

1. time to a correct decision at 0.05, 0.15, 0.5, 2 and 8 requests/s per class, for five cases:
   a broken revision on a canary rollout (half its tool calls invalid: abort), a 2.5x slower
   revision on a canary rollout (abort), an acceptance collapse on the live fleet (kill switch
   engaged, SpeculationNotPaying), a recovery after the kill switch engaged (released after
   a trial) and the same recovery with guard.routeClasses (the class alone routed off, back
   after a class trial on half of it). Per case and rate: median and p90 time from the change
   to the correct decision, and the share of seeds whose first judgement was the correct one
   on evidence, one a deadline made (StepDeadline, TrialDeadline), a wrong one, or none within
   the run; one png;
2. false actions per simulated week of healthy, noisy traffic at each rate, on a fleet that
   rolls out a good revision every two hours as canaries, and on one that rolls them out
   directly (probation): every kill switch engaged, rollout aborted, rollback, quality breach
   and class breach is one that should not happen;
3. goodput / oracle on every example scenario (bench/simulate_goodput.py's list, and the
   probation examples replayed as canaries), today's tree against a base commit (default
   9cfaab5, the commit before the canary step became one judgement on accumulating evidence)
   run from its own tree in a subprocess, same inputs.

Run: `.venv/bin/python bench/decision_time.py [--seeds 20] [--healthy-hours 48]
[--goodput-seeds 5] [--base 9cfaab5] [--base-tree DIR] [--only times|healthy|goodput]
[--replot]` (about five minutes at the defaults on a 2-vCPU VM, one process; `--replot` redraws
the png from the json).
Without --base-tree the base's operator/ and testbed/ are exported with `git archive` into a
temporary directory. Writes bench/results/decision_time.json and decision_time.png.
The numbers are what the guard's code does when this runs: rerun after guard changes.
"""

from __future__ import annotations

import argparse
import copy
import io
import json
import math
import os
import random
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# specfleet is imported inside functions: `--goodput-worker` runs this file against another
# tree's specfleet, which may lack anything but `specfleet.simulate`'s API.

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "examples/scenarios"
CANARY_SPECMODEL = SCENARIOS / "canary-rollouts.specmodel.yaml"
"""Four replicas, code (critical, acceptance floor 0.5) / tools (validity 0.97) / chat, canary
rollouts: 1 pod, then 2."""
LIVE_SPECMODEL = ROOT / "examples/llama-3.1-8b-eagle3-fp8.yaml"
"""The acceptance-collapse example's SpecModel, run on REPLICAS replicas."""
REPLICAS = 4
"""Both fleets run four replicas: at 8 req/s per class two replicas of the live fleet would be
so loaded that speculation never pays (true speedup 0.58; 1.42 on four)."""
RATES = (0.05, 0.15, 0.5, 2.0, 8.0)
"""Requests per second per class, the fleet's (a step-1 canary takes 1/4 of it, a trial's
canary 1/5)."""
HORIZON = 3600.0
"""Seconds a run lasts after the change (a recovery's at 0.5 req/s per class and more): a
decision later than its run's end is 'none'."""
CLASS_REQUESTS_PER_RUN = 2160.0
"""A recovery's run lasts until the fleet has served this many requests of each class, at least
HORIZON (12 h at 0.05 req/s): a trial's canary sees a fifth of them, enough to show a critical
class's acceptance a few points over its floor (`guard.verdict.requests_to_show`)."""


def horizon(rate: float) -> float:
    """Seconds a recovery's run at `rate` requests/s per class lasts after its change."""
    return max(HORIZON, CLASS_REQUESTS_PER_RUN / rate)


ROLLOUT_AT = 900.0
"""A canary case's commit: after the first revision's probation (600 s) at the higher rates."""
COLLAPSE_AT = 600.0
RECOVERY_AT = 690.0
"""The recovery case: the collapse at COLLAPSE_AT is detected at DETECTION_RATE per class (the
kill switch engages at 615-630 s), then at RECOVERY_AT acceptance returns and the traffic
falls to the rate measured. The first trial is due 60 s (the cooldown) after the kill switch's
rollout, at about 735 s: it sees the recovery."""
DETECTION_RATE = 4.0
ROUTED_RECOVERY_AT = 660.0
HEALTHY_PERIOD = 7200.0
"""The healthy fleets roll out a good revision every two hours, the first at ROLLOUT_AT."""
WEEK = 7 * 24 * 3600.0

ABORTED, STEP_PASSED, PROMOTED = "rollout_aborted", "rollout_step_passed", "rollout_promoted"
ENGAGED, RELEASED = "kill_switch_engaged", "kill_switch_released"
TRIAL_FAILED = "trial_failed"
CLASS_OFF, CLASS_ON = "class_speculation_off", "class_speculation_on"
CLASS_TRIAL_FAILED = "class_trial_failed"
ROLLED_BACK, QUALITY_BREACH, CLASS_BREACH = "rolled_back", "quality_breach", "class_breach"
STEP_DEADLINE, NOT_PAYING = "StepDeadline", "SpeculationNotPaying"
KEPT = "revision_kept"
"""Probation's deadline passed undecided (ProbationDeadline): the revision serves on, unproven."""
SHOULD_NOT_HAPPEN = (ENGAGED, TRIAL_FAILED, ABORTED, ROLLED_BACK, QUALITY_BREACH, CLASS_BREACH)
"""On healthy traffic with good revisions (a trial fails only after a kill switch engaged)."""
ACTING = (ENGAGED, RELEASED, TRIAL_FAILED, ROLLED_BACK, STEP_PASSED, PROMOTED, ABORTED)
ACTING += (CLASS_OFF, CLASS_ON, CLASS_TRIAL_FAILED)
OUTCOMES = ("evidence", "deadline", "wrong", "none")
"""A seed's first judgement after the change: the correct one on evidence; one a deadline made
(a canary step's StepDeadline abort, the correct action; a trial's TrialDeadline, failed
inconclusive, not the release); a wrong one; or none within the run."""

THIRD = 1 / 3
CANARY_CLASSES: dict[str, dict[str, Any]] = {
    "code": {"share": THIRD, "acceptance": 0.8, "output_tokens": 256, "prompt_tokens": 300},
    "tools": {
        "share": THIRD,
        "acceptance": 0.7,
        "output_tokens": 120,
        "prompt_tokens": 900,
        "tool_call_rate": 0.9,
        "tool_call_validity": 0.99,
    },
    "chat": {"share": THIRD, "acceptance": 0.6, "output_tokens": 400},
}
"""The canary-rollouts example's classes, with equal shares: each gets the rate measured."""


# -- the cases -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    name: str
    title: str
    label: str
    """Short, for the plot's legend."""
    correct: str
    change: float
    build: Callable[[float], tuple[dict[str, Any], dict[str, Any]]]
    """rate -> (SpecModel document, scenario document)."""
    verdict: Verdict
    """Which decision is the correct one (`first_judgement`)."""
    deadline_words: str = "by the deadline"
    """What the 'deadline' outcome means here, for the plot."""
    first: str | None = None
    """The action the case needs before its change (else its seeds are 'setup'): the kill
    switch engaged, or the class switched off."""


def _specmodel(path: Path) -> dict[str, Any]:
    from specfleet.simulate.inputs import load_specmodel_document

    document = load_specmodel_document(path)
    document["spec"]["pod"]["replicas"] = REPLICAS
    return document


def _canary_case(effects: dict[str, Any]) -> Callable[[float], tuple[dict, dict]]:
    def build(rate: float) -> tuple[dict[str, Any], dict[str, Any]]:
        scenario = {
            "duration_s": ROLLOUT_AT + HORIZON,
            "traffic_rps": 3 * rate,
            "classes": copy.deepcopy(CANARY_CLASSES),
            "rollouts": [
                {
                    "t": ROLLOUT_AT,
                    "spec": {"model": {"source": "example-org/Llama-3.1-8B-Instruct-changed"}},
                    "effects": effects,
                }
            ],
        }
        return _specmodel(CANARY_SPECMODEL), scenario

    return build


def _live_classes(code_acceptance: Any) -> dict[str, Any]:
    return {
        "code": {
            "share": 0.5,
            "acceptance": code_acceptance,
            "output_tokens": 256,
            "prompt_tokens": 300,
        },
        "chat": {
            "share": 0.5,
            "acceptance": 0.6,
            "output_tokens": 400,
            "tool_call_rate": 0.3,
            "tool_call_validity": 0.99,
        },
    }


def _collapse(rate: float) -> tuple[dict[str, Any], dict[str, Any]]:
    scenario = {
        "duration_s": COLLAPSE_AT + HORIZON,
        "traffic_rps": 2 * rate,
        "classes": _live_classes([[0, 0.8], [COLLAPSE_AT, 0.2]]),
    }
    return _specmodel(LIVE_SPECMODEL), scenario


def _recovery(rate: float, at: float = RECOVERY_AT) -> tuple[dict[str, Any], dict[str, Any]]:
    scenario = {
        "duration_s": at + horizon(rate),
        "traffic_rps": [[0, 2 * DETECTION_RATE], [at, 2 * rate]],
        "classes": _live_classes([[0, 0.8], [COLLAPSE_AT, 0.2], [at, 0.8]]),
    }
    return _specmodel(LIVE_SPECMODEL), scenario


def _routed(rate: float) -> tuple[dict[str, Any], dict[str, Any]]:
    """The recovery with the guard routing code alone to the plain pool (at 615-630 s): back at
    ROUTED_RECOVERY_AT, before its first class trial is due (the cooldown after it)."""
    specmodel, scenario = _recovery(rate, ROUTED_RECOVERY_AT)
    specmodel["spec"].setdefault("guard", {})["routeClasses"] = True
    return specmodel, scenario


CORRECT, WRONG, INCONCLUSIVE = "correct", "wrong", "inconclusive"
Verdict = Callable[[dict[str, Any], float], str | None]
"""(acting decision, change) -> what it is to the case: CORRECT; WRONG; INCONCLUSIVE (a trial
ended at its deadline: the time runs on to the correct decision); None: not one it looks at."""


def _aborted_bad_revision(d: dict[str, Any], change: float) -> str | None:
    """Revision 2 is bad: aborted is correct; passing a step, or any other acting decision
    (the kill switch, a rollback) after the change, is wrong."""
    if d["t"] < change:
        return None
    aborted = d["action"] == ABORTED and (d.get("evidence") or {}).get("revision") == 2
    return CORRECT if aborted else WRONG


def _engaged_not_paying(d: dict[str, Any], change: float) -> str:
    """The kill switch engaged for SpeculationNotPaying after the change; any acting decision
    before it (from the start: one before the change leaves nothing to detect) is wrong."""
    engaged = d["action"] == ENGAGED and d["reason"] == NOT_PAYING and d["t"] >= change
    return CORRECT if engaged else WRONG


def _released(d: dict[str, Any], change: float) -> str | None:
    """The kill switch released once acceptance is back (the guard releases only by a trial);
    a release before it, or a trial failed or a rollback after it, is wrong; a trial ended at
    its deadline (TrialDeadline) is inconclusive. Engaging before it is the case's setup."""
    if d["t"] < change:
        return WRONG if d["action"] == RELEASED else None
    if d["action"] == RELEASED:
        return CORRECT
    if d["action"] not in (TRIAL_FAILED, ROLLED_BACK, ABORTED):
        return None
    return INCONCLUSIVE if d["reason"].endswith("Deadline") else WRONG


def _class_back(d: dict[str, Any], change: float) -> str | None:
    """Code's speculation back on by its class trial once acceptance is back; before it, or a
    class trial failed on evidence or the fleet's switch after it, is wrong; a class trial ended
    at its deadline (ClassTrialDeadline) is inconclusive. Switching it off is the setup."""
    if d["t"] < change:
        return WRONG if d["action"] == CLASS_ON else None
    if d["action"] == CLASS_ON:
        return CORRECT
    if d["action"] not in (CLASS_TRIAL_FAILED, ENGAGED, TRIAL_FAILED, ROLLED_BACK, ABORTED):
        return None
    return INCONCLUSIVE if d["reason"].endswith("Deadline") else WRONG


def first_judgement(
    decisions: list[dict[str, Any]], change: float, verdict: Verdict
) -> tuple[str, float | None, str | None]:
    """(outcome, seconds from the change to the correct decision, what was wrong): the acting
    decisions in order, as `verdict` reads them. The correct one ends the scan: 'evidence', or
    'deadline' if a canary step's deadline made it; the first other one before it makes the
    outcome 'deadline' if inconclusive, else 'wrong'."""
    outcome, wrong = None, None
    for d in decisions:
        meaning = verdict(d, change) if d["action"] in ACTING else None
        if meaning == CORRECT:
            first = "deadline" if d["reason"] == STEP_DEADLINE else "evidence"
            return outcome or first, d["t"] - change, wrong
        if meaning is None or outcome is not None:
            continue
        if meaning == INCONCLUSIVE:
            outcome = "deadline"
        else:
            outcome, wrong = "wrong", f"{d['action']} ({d['reason']}) at {d['t'] - change:.0f} s"
    return outcome or "none", None, wrong


def judge(case: Case, decisions: list[dict[str, Any]]) -> tuple[str, float | None, str | None]:
    """first_judgement by the case's predicate; 'setup' when a case that needs an action before
    its change (the recoveries) did not get it."""
    if case.first and not any(
        d["action"] == case.first and d["t"] < case.change for d in decisions
    ):
        return "setup", None, f"no {case.first} before the {case.name}"
    return first_judgement(decisions, case.change, case.verdict)


CASES = (
    Case(
        "broken",
        "broken revision (half its tool calls invalid), canary",
        "broken revision on a canary",
        "rollout aborted",
        ROLLOUT_AT,
        _canary_case({"tool_call_validity": 0.5}),
        _aborted_bad_revision,
        "aborted by the step deadline",
    ),
    Case(
        "slow",
        "2.5x slower revision, canary",
        "2.5x slower revision on a canary",
        "rollout aborted",
        ROLLOUT_AT,
        _canary_case({"tpot_factor": 2.5}),
        _aborted_bad_revision,
        "aborted by the step deadline",
    ),
    Case(
        "collapse",
        "acceptance collapse (code α 0.8 → 0.2), live fleet",
        "acceptance collapse",
        "kill switch engaged (SpeculationNotPaying)",
        COLLAPSE_AT,
        _collapse,
        _engaged_not_paying,
    ),
    Case(
        "recovery",
        "recovery (code α back to 0.8) after the kill switch engaged",
        "recovery after the kill switch",
        "kill switch released after a trial",
        RECOVERY_AT,
        _recovery,
        _released,
        "first trial ran out its deadline",
        first=ENGAGED,
    ),
    Case(
        "routed",
        "recovery of the class alone (guard.routeClasses: code routed to the plain pool, its "
        "trial half of it on the fleet)",
        "recovery of a routed class",
        "class speculating again after its trial",
        ROUTED_RECOVERY_AT,
        _routed,
        _class_back,
        "first class trial ran out its deadline",
        first=CLASS_OFF,
    ),
)


def world_of(specmodel: dict[str, Any], scenario: dict[str, Any]) -> Any:
    from specfleet.scenario import parse_scenario
    from specfleet.simulate import build_world

    return build_world(specmodel, parse_scenario(scenario))


def decision_times(case: Case, rate: float, seeds: int) -> dict[str, Any]:
    from specfleet.simulate import SimulationSettings, simulate

    world = world_of(*case.build(rate))
    runs = []
    for seed in range(seeds):
        result = simulate(world, SimulationSettings(seed=seed))
        outcome, seconds, wrong = judge(case, result.run.decisions)
        episodes = [e for e in result.episodes if e.start >= case.change]
        runs.append(
            {
                "seed": seed,
                "outcome": outcome,
                "seconds": seconds,
                "wrong": wrong,
                "falseActions": len(result.false_actions),
                "undetectable": any(not e.detectable for e in episodes),  # the simulator's
            }
        )
    counted = [r for r in runs if r["outcome"] != "setup"]
    times = sorted(math.inf if r["seconds"] is None else r["seconds"] for r in counted)
    shares = Counter(r["outcome"] for r in counted)
    return {
        "case": case.name,
        "rate": rate,
        "seeds": seeds,
        "counted": len(counted),
        "setupFailed": seeds - len(counted),
        "median": _finite(_rank(times, 0.5)),
        "p90": _finite(_rank(times, 0.9)),
        "shares": {k: round(shares[k] / max(len(counted), 1), 3) for k in OUTCOMES},
        "counts": {k: shares[k] for k in OUTCOMES},
        "correct": round(sum(t < math.inf for t in times) / max(len(counted), 1), 3),
        # seeds whose episode of speculation not paying the simulator calls undetectable (fewer
        # than minRequests a window in expectation): the collapse case only
        "simulatorUndetectable": sum(r["undetectable"] for r in counted),
        "wrong": [f"seed {r['seed']}: {r['wrong']}" for r in counted if r["outcome"] == "wrong"],
        "perWindow": _per_window(case, rate),
        "runs": runs,
    }


def defaults() -> dict[str, float]:
    """The SpecModel's defaults the cases run with (read, so that the labels follow the code):
    spec.guard.errorRate, spec.rollout.stepDeadlineSeconds and, where this tree has one,
    spec.guard.trialDeadlineSeconds."""
    from specfleet.api.spec import GuardSpec, RolloutSpec

    fields = GuardSpec.model_fields
    trial = fields["trial_deadline_seconds"].default if "trial_deadline_seconds" in fields else None
    return {
        "errorRate": fields["error_rate"].default,
        "stepDeadline": RolloutSpec.model_fields["step_deadline_seconds"].default,
        "trialDeadline": trial,
    }


def _per_window(case: Case, rate: float) -> dict[str, float]:
    """Expected requests per class the judged side sees: per 60-s window for the kill switch
    (the fleet's; a trial's canary, 1 pod of REPLICAS + 1), by the step deadline for a canary
    step (1 pod of REPLICAS)."""
    if case.name in ("broken", "slow"):
        return {"canaryByDeadline": round(rate / REPLICAS * defaults()["stepDeadline"], 1)}
    if case.name == "recovery":
        return {"trialCanaryPerWindow": round(rate / (REPLICAS + 1) * 60, 1)}
    if case.name == "routed":
        return {"classTrialPerWindow": round(rate / 2 * 60, 1)}
    return {"fleetPerWindow": round(rate * 60, 1)}


def _runs() -> str:
    """How long the runs last, in words: '3600 s; a recovery's 43200 s at 0.05 req/s, ...'."""
    longer = [
        f"a recovery's {horizon(r):.0f} s at {r:g} req/s" for r in RATES if horizon(r) > HORIZON
    ]
    return "; ".join([f"{HORIZON:.0f} s", *longer])


def _rank(values: list[float], q: float) -> float:
    """Nearest-rank quantile (undecided seeds count as infinitely late)."""
    if not values:
        return math.inf
    return values[max(math.ceil(q * len(values)) - 1, 0)]


def _finite(value: float) -> float | None:
    return None if math.isinf(value) else value


# -- healthy traffic -------------------------------------------------------------------------


def _noisy(rng: random.Random, mean: float, seconds: float) -> list[list[float]]:
    """A new level every 10 minutes, sd 0.03 clipped at ±0.06 (make_noisy_healthy.py's
    noise)."""
    return [
        [t, round(min(max(rng.gauss(mean, 0.03), mean - 0.06), mean + 0.06), 3)]
        for t in range(0, int(seconds), 600)
    ]


HEALTHY_ACCEPTANCE = {"code": 0.85, "tools": 0.75, "chat": 0.7}
"""Mean α per class on healthy traffic, each ± 0.03 (clipped at ± 0.06): code's engine
acceptance stays above its 0.5 floor (0.58 at α 0.79) and every class's true speedup above 1
at 8 req/s per class on four replicas (the canary example's α 0.6 for chat falls to 0.94
there: its class breaches would be true ones)."""


def healthy_world(rate: float, seconds: float, seed: int, strategy: str) -> Any:
    """Healthy noisy acceptance (HEALTHY_ACCEPTANCE) and a good revision every
    HEALTHY_PERIOD."""
    rng = random.Random(f"healthy-{seed}")
    classes = copy.deepcopy(CANARY_CLASSES)
    for name, mean in HEALTHY_ACCEPTANCE.items():
        classes[name]["acceptance"] = _noisy(rng, mean, seconds)
    rollouts, t, n = [], ROLLOUT_AT, 0
    while t < seconds:
        n += 1  # a new engine config each time, no effects
        rollouts.append({"t": t, "spec": {"model": {"maxModelLen": 8192 + 16 * n}}})
        t += HEALTHY_PERIOD
    scenario = {
        "duration_s": seconds,
        "seed": seed,
        "traffic_rps": 3 * rate,
        "classes": classes,
        "rollouts": rollouts,
    }
    specmodel = _specmodel(CANARY_SPECMODEL)
    specmodel["spec"]["rollout"] = {"strategy": strategy}
    return world_of(specmodel, scenario)


def false_actions(rate: float, hours: float, strategy: str) -> dict[str, Any]:
    """`hours` of healthy traffic in runs of at most a day (seeds 0, 1, ...)."""
    from specfleet.simulate import SimulationSettings, simulate

    counts: Counter[str] = Counter()
    rollouts, truly_false, bad_episodes, started = 0, 0, 0, time.perf_counter()
    to_promotion: list[float] = []
    lowest, unjudged, kept = math.inf, 0, 0
    remaining, seed = hours * 3600.0, 0
    while remaining > 0:
        seconds = min(remaining, 86400.0)
        world = healthy_world(rate, seconds, seed, strategy)
        result = simulate(world, SimulationSettings(seed=seed))
        rollouts += len(world.scenario.rollouts)
        since = {r.number: r.since for r in world.revisions.values()}
        promoted_now = set()
        for d in result.run.decisions:
            if d["action"] in SHOULD_NOT_HAPPEN:
                deadline = d["reason"].endswith("Deadline")
                counts[f"{d['action']} ({d['reason']})" if deadline else d["action"]] += 1
            if d["action"] == KEPT:
                kept += 1
            promoted = d["evidence"].get("revision") if d["action"] == PROMOTED else None
            if d["action"] == "revision_promoted" and strategy == "direct":
                promoted = d["revision"]
            if promoted and promoted > 1:  # the first revision is not rolled out
                to_promotion.append(d["t"] - since[promoted])
                promoted_now.add(promoted)
        if strategy == "canary":  # revisions the fleet served that no step promoted
            number = {r.config: r.number for r in world.revisions.values()}
            served = {number[setting.config] for setting in result.run.serving}
            unjudged += len(served - promoted_now - {1})
        lowest = min([lowest, *(min(t.speedups.values()) for t in result.truths if t.speedups)])
        truly_false += len(result.false_actions)
        bad_episodes += len(result.episodes)
        remaining -= seconds
        seed += 1
    scale = WEEK / (hours * 3600.0)
    aborts = counts[ABORTED] + counts[f"{ABORTED} ({STEP_DEADLINE})"]
    canary = strategy == "canary"
    return {
        "strategy": strategy,
        "rate": rate,
        "hours": hours,
        "rollouts": rollouts,
        "promoted": len(to_promotion),
        "secondsToPromotion": _spread(to_promotion),
        "counts": dict(counts),
        "perWeek": round(sum(counts.values()) * scale, 1),
        "perWeekByAction": {k: round(v * scale, 1) for k, v in counts.items()},
        "fleetUnjudged": unjudged if strategy == "canary" else None,
        "keptUnproven": kept,
        "falseBySimulator": truly_false,
        "trulyBadEpisodes": bad_episodes,
        "minTrueClassSpeedup": round(lowest, 3),
        "falsePerRollout": round((aborts if canary else counts[ROLLED_BACK]) / rollouts, 3),
        "evidenceAbortsPerRollout": round(counts[ABORTED] / rollouts, 3) if canary else None,
        "wallSeconds": round(time.perf_counter() - started, 1),
    }


def _spread(values: list[float]) -> dict[str, float | None]:
    ordered = sorted(values)
    return {
        "min": ordered[0] if ordered else None,
        "median": _finite(_rank(ordered, 0.5)),
        "max": ordered[-1] if ordered else None,
    }


# -- goodput against the oracle, today and the base -------------------------------------------


def examples() -> list[list[Any]]:
    """Every example scenario with the SpecModel bench/simulate_goodput.py replays it against
    (a scenario file it does not list is replayed against the llama example, and named), then
    the examples whose SpecModel rolls out `direct` again as canaries (that line dropped, as
    examples/scenarios/README.md replays them): only canary steps changed in this cycle.
    Each: [name, SpecModel path, scenario path, as canaries]."""
    sys.path.insert(0, str(ROOT / "bench"))
    from simulate_goodput import EXAMPLES

    listed = [
        [name, str(path), str(SCENARIOS / f"{name}.yaml"), False] for name, path in EXAMPLES.items()
    ]
    files = sorted(p for p in SCENARIOS.glob("*.yaml") if not p.name.endswith(".specmodel.yaml"))
    extra = [[p.stem, str(LIVE_SPECMODEL), str(p), False] for p in files if p.stem not in EXAMPLES]
    for name, *_ in extra:
        print(f"note: {name} is not in simulate_goodput.EXAMPLES; replayed on the llama example")
    direct = [
        [f"{name} as canaries", specmodel, scenario, True]
        for name, specmodel, scenario, _ in listed + extra
        if "strategy: direct" in Path(specmodel).read_text()
    ]
    return listed + extra + direct


def goodput_rows(job: dict[str, Any]) -> dict[str, Any]:
    """Guarded / oracle of each example on each seed, with this process's specfleet."""
    import specfleet
    from specfleet.scenario import load_scenario
    from specfleet.simulate import SimulationSettings, build_world, simulate
    from specfleet.simulate.inputs import load_specmodel_document

    rows: dict[str, Any] = {}
    for name, specmodel, scenario, canaries in job["examples"]:
        try:
            document = load_specmodel_document(Path(specmodel))
            if canaries:
                document["spec"].get("rollout", {}).pop("strategy", None)
            world = build_world(document, load_scenario(Path(scenario)))
        except Exception as exc:  # an input the other tree cannot read: say so, go on
            rows[name] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        seeds = sorted({world.scenario.seed, *range(job["extraSeeds"])})
        runs, decisions = {}, []
        for seed in seeds:
            result = simulate(world, SimulationSettings(seed=seed))
            rate = {k: g.rate for k, g in result.goodput.items()}
            runs[str(seed)] = {
                "vsOracle": round(rate["guarded"] / rate["oracle"], 4),
                "vsOracleRollout": round(rate["guarded"] / rate["oracle_rollout"], 4),
                "belowBoth": rate["guarded"] < min(rate["always_on"], rate["always_off"]),
                "false": len(result.false_actions),
                "missed": len(result.missed),
                "acting": sum(d["action"] in ACTING for d in result.run.decisions),
            }
            if seed == world.scenario.seed:
                decisions = [f"{d['t']:.0f} {d['action']}" for d in result.run.decisions]
        ratios = [r["vsOracle"] for r in runs.values()]
        rows[name] = {
            "ownSeed": world.scenario.seed,
            "decisions": decisions,
            "runs": runs,
            "mean": round(sum(ratios) / len(ratios), 4),
            "min": min(ratios),
            "false": sum(r["false"] for r in runs.values()),
            "missed": sum(r["missed"] for r in runs.values()),
            "belowBoth": sum(r["belowBoth"] for r in runs.values()),
        }
    return {"specfleet": str(Path(specfleet.__file__).parent), "rows": rows}


def base_rows(job: dict[str, Any], base: str, tree: Path | None) -> dict[str, Any]:
    """goodput_rows in a subprocess on the base's own code (this file, its PYTHONPATH)."""
    with tempfile.TemporaryDirectory(prefix="decision-time-base-") as scratch:
        if tree is None:
            tree = Path(scratch)
            archive = subprocess.run(
                ["git", "-C", str(ROOT), "archive", base, "operator", "testbed"],
                check=True,
                capture_output=True,
            ).stdout
            with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
                tar.extractall(tree, filter="data")
        env = {**os.environ, "PYTHONPATH": f"{tree / 'operator'}{os.pathsep}{tree / 'testbed'}"}
        done = subprocess.run(
            [sys.executable, __file__, "--goodput-worker"],
            input=json.dumps(job),
            capture_output=True,
            text=True,
            env=env,
            cwd=ROOT,
        )
        if done.returncode != 0:
            raise SystemExit(f"the base's replay failed:\n{done.stderr[-4000:]}")
        return json.loads(done.stdout)


def _git(*args: str) -> str:
    done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)
    return done.stdout.strip()


# -- output ----------------------------------------------------------------------------------


def _seconds(value: float | None) -> str:
    return "none" if value is None else f"{value:.0f}"


def print_times(rows: list[dict[str, Any]]) -> None:
    print(
        f"\n{'case':<9}{'req/s':>7}{'median s':>10}{'p90 s':>8}{'evidence':>10}{'deadline':>10}"
        f"{'wrong':>7}{'none':>6}{'correct':>9}  judged side sees (expected requests/class)"
    )
    for r in rows:
        s = r["shares"]
        seen = ", ".join(f"{k} {v:g}" for k, v in r["perWindow"].items())
        setup = (
            f" ({r['setupFailed']} seeds: kill switch never engaged)" if r["setupFailed"] else ""
        )
        print(
            f"{r['case']:<9}{r['rate']:>7g}{_seconds(r['median']):>10}{_seconds(r['p90']):>8}"
            f"{s['evidence']:>10.0%}{s['deadline']:>10.0%}{s['wrong']:>7.0%}{s['none']:>6.0%}"
            f"{r['correct']:>9.0%}  {seen}{setup}"
        )
        for wrong in r["wrong"][:3]:
            print(f"{'':<16}wrong: {wrong}")
    print(
        "  evidence / deadline / wrong / none: the first judgement after the change (deadline: a "
        "canary step's StepDeadline abort, the correct action; a trial's TrialDeadline, failed "
        "inconclusive); correct: seeds with the correct decision within the run, at any point"
    )
    short = [r for r in rows if r["correct"] < 1]
    print("no correct decision within the run, in some seeds:")
    for r in short:
        firsts = ", ".join(f"{k} {v}" for k, v in r["counts"].items() if v)
        missing = r["counted"] - round(r["correct"] * r["counted"])
        print(
            f"  {r['case']} at {r['rate']:g} req/s per class: {missing} of {r['counted']} seeds"
            f" (first judgements: {firsts}; the simulator calls "
            f"{r['simulatorUndetectable']} undetectable)"
        )
    if not short:
        print("  none")


def print_healthy(rows: list[dict[str, Any]]) -> None:
    print(
        f"\n{'fleet':<8}{'req/s':>7}{'hours':>7}{'rollouts':>9}{'promoted':>9}{'median s':>9}"
        f"{'per week':>9}{'false/rollout':>14}  should not happen (count in the run)"
    )
    for r in rows:
        counts = ", ".join(f"{k} {v}" for k, v in sorted(r["counts"].items())) or "none"
        if r["keptUnproven"]:
            counts += f"; kept unproven at probation's deadline {r['keptUnproven']}"
        if r["fleetUnjudged"]:
            counts += f"; on the whole fleet without a canary judgement {r['fleetUnjudged']}"
        print(
            f"{r['strategy']:<8}{r['rate']:>7g}{r['hours']:>7g}{r['rollouts']:>9}"
            f"{r['promoted']:>9}{_seconds(r['secondsToPromotion']['median']):>9}"
            f"{r['perWeek']:>9g}{r['falsePerRollout']:>14.3f}  {counts}; simulator's false "
            f"{r['falseBySimulator']}, truly bad episodes {r['trulyBadEpisodes']}, lowest true "
            f"class speedup {r['minTrueClassSpeedup']}"
        )
    print(
        "  promoted / median s: good revisions promoted (canary: every step passed; direct: "
        "probation passed), seconds from the commit; false/rollout: aborts (canary) or "
        "rollbacks (direct) per rollout"
    )


def print_goodput(today: dict[str, Any], base: dict[str, Any], base_name: str) -> list[str]:
    print(
        f"\n{'scenario':<36}{'today':>8}{'base':>8}{'diff':>9}{'today min':>10}{'base min':>9}"
        f"  false/missed today | base; the scenario's own seed: decisions"
    )
    worse = []
    for name, now in today["rows"].items():
        then = base["rows"].get(name, {"error": "missing"})
        if "error" in now or "error" in then:
            print(f"{name:<36}  today: {now.get('error', 'ok')}; base: {then.get('error', 'ok')}")
            continue
        diff = now["mean"] - then["mean"]
        if diff < -0.002:
            worse.append(name)
        changed = [d for d in now["decisions"] if d not in then["decisions"]]
        same = (
            "the same"
            if now["decisions"] == then["decisions"]
            else (
                f"today's differ: {', '.join(changed[:4]) or 'fewer'}; base's "
                f"{', '.join(d for d in then['decisions'] if d not in now['decisions'])[:80]}"
            )
        )
        print(
            f"{name:<36}{now['mean']:>8.4f}{then['mean']:>8.4f}{diff:>+9.4f}{now['min']:>10.3f}"
            f"{then['min']:>9.3f}  {now['false']}/{now['missed']} | {then['false']}/"
            f"{then['missed']}; {same}"
        )
    rows = base["rows"]
    both = [n for n, r in today["rows"].items() if "mean" in r and "mean" in rows.get(n, {})]
    for label, side in (("today", today), (base_name, base)):
        values = [side["rows"][n]["mean"] for n in both]
        print(
            f"  {label}: mean over the {len(both)} {sum(values) / len(values):.4f}, worst "
            f"{min(values):.3f} ({both[values.index(min(values))]})"
        )
    print(f"  worse than {base_name} by more than 0.002: {', '.join(worse) or 'none'}")
    return worse


def plot(rows: list[dict[str, Any]], seeds: int, commit: str, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {"broken": "tab:red", "slow": "tab:orange", "collapse": "tab:blue"}
    colours["recovery"] = "tab:green"
    colours["routed"] = "tab:purple"
    longest = max(horizon(rate) for rate in RATES)
    band = longest * 1.5  # where "not decided within the run" is drawn, a row per case
    fig, ax = plt.subplots(figsize=(9.5, 7.2))
    for index, case in enumerate(CASES):
        mine = [r for r in rows if r["case"] == case.name]
        rates = [r["rate"] for r in mine]
        colour, shift = colours[case.name], 1.09 ** (index - (len(CASES) - 1) / 2)  # side by side
        for key, style in (("median", "-"), ("p90", "--")):
            values = [math.nan if r[key] is None else r[key] for r in mine]
            ax.plot(
                rates,
                values,
                style,
                color=colour,
                marker="o" if key == "median" else None,
                linewidth=2 if key == "median" else 1.2,
                label=f"{case.label} → {case.correct}" if key == "median" else None,
            )
            undecided = [r["rate"] for r in mine if r[key] is None]
            ax.scatter(
                [rate * shift for rate in undecided],
                [band * (1.0 if key == "median" else 1.18)] * len(undecided),
                marker="X" if key == "median" else "o",
                s=60 if key == "median" else 40,
                color=colour if key == "median" else "none",
                edgecolors=colour,
                zorder=3,
            )
        for r in mine:  # a median not decided: how many seeds were, or ran out a deadline
            words = f"{r['correct']:.0%} decided" if r["correct"] else ""
            if r["shares"]["deadline"] and not r["correct"]:
                words = f"{r['shares']['deadline']:.0%} ran out\ntheir deadline"
            if r["median"] is None and words:
                ax.annotate(
                    words,
                    (r["rate"] * shift, band),
                    textcoords="offset points",
                    xytext=(0, -10),
                    ha="center",
                    va="top",
                    fontsize=7,
                    color=colour,
                )
        for r in mine:  # a share decided by the deadline, labelled at its median
            by_deadline = r["shares"]["deadline"]
            if by_deadline >= 0.05 and r["median"] is not None:
                ax.annotate(
                    f"{by_deadline:.0%} {case.deadline_words}",
                    (r["rate"], r["median"]),
                    textcoords="offset points",
                    xytext=(6, 7),
                    fontsize=8,
                    color=colour,
                )
    known = defaults()
    error_rate, deadline = known["errorRate"], known["stepDeadline"]
    what = "canary step / trial" if known["trialDeadline"] == deadline else "canary step"
    ax.axhline(deadline, color="grey", linestyle=":", linewidth=1)
    ax.text(0.7, deadline * 1.07, f"{what} deadline ({deadline:.0f} s)", fontsize=8, color="grey")
    ax.axhspan(longest * 1.3, band * 1.6, color="0.92")
    ax.text(
        9.6,
        band * 1.42,
        f"no correct decision within the run ({_runs()} after the change): X median, o p90",
        fontsize=8,
        ha="right",
    )
    ax.plot([], [], "k-", marker="o", linewidth=2, label="solid: median over seeds")
    ax.plot([], [], "k--", linewidth=1.2, label="dashed: p90 over seeds")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(0.04, 10)
    ax.set_ylim(8, band * 1.6)
    ax.set_xticks(RATES, [f"{r:g}" for r in RATES])
    ax.set_xlabel(f"traffic per class (requests/s to the whole fleet of {REPLICAS} replicas)")
    ax.set_ylabel("time from the change (commit, collapse, recovery) to the correct decision (s)")
    ax.set_title(
        f"specfleet guard: time to the correct decision vs traffic\n({seeds} seeds per point, "
        f"errorRate {error_rate:g}, guard code at {commit}, bench/decision_time.py)",
        fontsize=11,
    )
    ax.grid(True, which="both", alpha=0.3)
    fig.legend(loc="lower center", ncol=2, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.09, 1, 1))
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20, help="seeds per case and rate")
    parser.add_argument("--healthy-hours", type=float, default=48.0, help="per rate and fleet")
    parser.add_argument("--goodput-seeds", type=int, default=5, help="seeds 0..N-1 (+ own)")
    parser.add_argument("--base", default="9cfaab5", help="commit to compare goodput with")
    parser.add_argument("--base-tree", type=Path, help="a checkout of --base (else exported)")
    parser.add_argument("--only", choices=("times", "healthy", "goodput"), action="append")
    parser.add_argument("--replot", action="store_true", help="redraw the png from the json")
    parser.add_argument("--goodput-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.replot:
        found = json.loads((ROOT / "bench/results/decision_time.json").read_text())
        times = found["times"]
        plot(
            times["rows"], times["seeds"], found["commit"], ROOT / "bench/results/decision_time.png"
        )
        return
    if args.goodput_worker:  # in the base's tree: a job on stdin, the rows on stdout
        print(json.dumps(goodput_rows(json.loads(sys.stdin.read()))))
        return
    parts = args.only or ["times", "healthy", "goodput"]
    commit = _git("log", "-1", "--format=%h", "--", "operator")  # the code replayed
    out = ROOT / "bench/results"
    out.mkdir(parents=True, exist_ok=True)
    path = out / "decision_time.json"
    results: dict[str, Any] = json.loads(path.read_text()) if args.only and path.exists() else {}
    results.update({"commit": commit, "dirty": bool(_git("status", "--porcelain", "operator"))})
    began = time.perf_counter()

    if "times" in parts:
        began_part = time.perf_counter()
        rows = []
        for case in CASES:
            for rate in RATES:
                rows.append(decision_times(case, rate, args.seeds))
        print(f"time to the correct decision, {args.seeds} seeds per row (runs {_runs()}")
        print("past the change; median / p90 nearest rank, undecided seeds count as never):")
        print_times(rows)
        plot(rows, args.seeds, commit, out / "decision_time.png")
        results["times"] = {
            "seeds": args.seeds,
            "horizonSeconds": {f"{r:g}": horizon(r) for r in RATES},
            "rows": rows,
        }
        results["times"]["wallSeconds"] = round(time.perf_counter() - began_part, 1)
        print(f"wrote {(out / 'decision_time.png').relative_to(ROOT)}")

    if "healthy" in parts:
        began_part = time.perf_counter()
        healthy = [
            false_actions(rate, args.healthy_hours, strategy)
            for strategy in ("canary", "direct")
            for rate in RATES
        ]
        print(
            f"\nhealthy noisy traffic, a good revision every {HEALTHY_PERIOD / 3600:g} h, "
            f"{args.healthy_hours:g} h per row scaled to a week (errorRate asked: "
            f"{defaults()['errorRate']:g} per judgement):"
        )
        print_healthy(healthy)
        results["healthy"] = {"hours": args.healthy_hours, "rows": healthy}
        results["healthy"]["wallSeconds"] = round(time.perf_counter() - began_part, 1)

    if "goodput" in parts:
        began_part = time.perf_counter()
        job = {"examples": examples(), "extraSeeds": args.goodput_seeds}
        today = goodput_rows(job)
        base = base_rows(job, args.base, args.base_tree)
        worse = print_goodput(today, base, args.base)
        results["goodput"] = {"base": args.base, "today": today, "baseRows": base, "worse": worse}
        results["goodput"]["wallSeconds"] = round(time.perf_counter() - began_part, 1)

    results["wallSeconds"] = round(time.perf_counter() - began, 1)
    path.write_text(json.dumps(results, indent=2) + "\n")
    walls = ", ".join(f"{k} {results[k]['wallSeconds']:.0f} s" for k in parts)
    print(f"\nwrote {path.relative_to(ROOT)} ({results['wallSeconds']:.0f} s: {walls})")


if __name__ == "__main__":
    main()
