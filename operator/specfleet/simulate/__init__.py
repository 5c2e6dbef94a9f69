"""`specfleet simulate`: the real guard policy in a closed loop against a simulated fleet.

    specfleet simulate --specmodel FILE --scenario FILE --out DIR [--seed N] [--tick SECONDS]
        [--rollout-seconds 60] [--no-plot]

On a virtual clock the fleet serves the scenario (the format `specfleet-testbed engine` reads) in
slices; every tick the operator's own path (`tick.guarding.situation`, `guard.decide`,
`tick.guarding.apply_decision`, `tick.plan`, `tick.status.next_status`) judges
the last window, built per class the way telemetry builds it; a plan change (kill switch,
trial, rollback, new revision) reaches the fleet after `rollout_seconds`, and the guard judges
again only a whole window after the rollout completed (`settled`). What the fleet serves follows
the plan: speculation off means no drafts and plain-decoding TPOT; a revision's rollout effects
apply only while it serves. The classes set off speculation (`spec.guard.classesOff`) go to the
plain pool the operator sizes, once it has a pod ready; its pods decode plain at their own load,
its readings are left out of the guard's, its requests count in goodput and its GPUs in the cost.

API::

    world = load_world(specmodel_path, scenario_path)   # or build_world(document, scenario)
    result = simulate(world, SimulationSettings(seed=..., tick_seconds=..., rollout_seconds=...))
    report.write(result, out_dir); plot.draw_timeline(result, out_dir / "timeline.png")

Goodput (the comparison metric): valid output tokens per decode-second. A request's output
tokens count when it did not fail, its tool call or JSON answer (if any) is valid, it was not
cut off at max_tokens, and its class is served within its quality SLOs (minToolCallValidity /
minStructuredOutputValidity / maxTruncationRate; a class past its limit delivers nothing its
consumers can rely on). Every request, failed ones
included, is charged its decode time: output tokens x the mean TPOT of the slice it was served
in. So speculation that halves TPOT doubles goodput, broken answers count as wasted time.
The guarded run is compared, on the same scenario and the same random draws (common random
numbers), with always-on and always-off (both follow Git's revisions, with the same rollout
time) and an oracle that switches at once to the best setting (speculation on/off and any
revision that exists by then) among those meeting every quality SLO; `oracle_rollout` is the
same oracle paying the rollout time.

Truth, for detection latency and false actions (see `truth`, `analysis`): speculation truly stops
paying when the guard's speedup function at the scenario's true α, weighted by expected output
tokens, falls below minSpeedup, or a critical class's true acceptance rate (the engines'
accepted / drafted, in expectation) falls below its floor.
"""

from specfleet.simulate.inputs import build_world, load_world
from specfleet.simulate.simulation import Result, SimulationSettings, simulate

__all__ = [
    "Result",
    "SimulationSettings",
    "build_world",
    "load_world",
    "simulate",
]
