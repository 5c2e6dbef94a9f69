"""The guard in the production tick (`tick.step`), window after window: the decision, the
plan that follows it, the status the operator writes, and what the children become. The pods
roll out the moment they are planned; `tests/test_guard.py` judges `decide` alone."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from conftest import specmodel_doc
from specfleet.api import KILL_SWITCH_ANNOTATION, EngineConfig, SpecModel, parse_specmodel
from specfleet.api.status import ReplicaStatus, SpecModelStatus
from specfleet.guard.actions import PER_CLASS, Action
from specfleet.render import RenderSettings, revision_hash
from specfleet.telemetry.model import Observation
from specfleet.tick.observed import Observed, Rollout
from specfleet.tick.step import GuardTick, Step, step
from test_guard import observe

T0 = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
CLASSES = [
    {"name": "code", "critical": True, "slo": {"minAcceptanceRate": 0.5}},
    {"name": "chat", "slo": {"minToolCallValidity": 0.9}},
]


def specmodel(
    k: int = 4,
    classes: list[dict[str, Any]] = CLASSES,
    strategy: str = "canary",
    **metadata: Any,
) -> SpecModel:
    doc = specmodel_doc(
        speculative={"method": "eagle3", "draftModel": "d", "numSpeculativeTokens": k},
        classes=classes,
        defaultClass="chat",
        pod={"replicas": 2},
        rollout={"strategy": strategy},
    )
    doc["metadata"] |= metadata
    return parse_specmodel(doc)


def deployment(replicas: int, speculation: bool) -> Rollout:
    """A Deployment whose rollout is complete."""
    counts = ReplicaStatus(desired=replicas, updated=replicas, ready=replicas, available=replicas)
    return Rollout(counts, complete=True, speculation_running=speculation)


@dataclass
class Loop:
    """One SpecModel under the operator, a guard tick every 15 s."""

    specmodel: SpecModel
    now: datetime = T0 - timedelta(minutes=10)
    status: SpecModelStatus = field(default_factory=SpecModelStatus)
    configs: dict[str, EngineConfig] = field(default_factory=dict)
    actions: list[str] = field(default_factory=list)
    """The fleet-wide actions; `named`, the per-class decisions."""
    named: list[Action] = field(default_factory=list)
    last: Step | None = None

    def __post_init__(self) -> None:
        self.change(self.specmodel)
        self.now = T0  # serving, Ready for ten minutes

    def change(self, specmodel: SpecModel) -> None:
        """Git applies a spec; the operator reconciles it."""
        self.specmodel = specmodel
        config = specmodel.engine_config()
        self.configs[revision_hash(config)] = config
        self._step(None)

    def tick(self, *observations: Observation) -> None:
        for observation in observations:
            self.now += timedelta(seconds=15)
            self._step(GuardTick(observation))

    def _step(self, tick: GuardTick | None) -> None:
        self.last = step(
            self.specmodel, self.status, self._observed(), tick, self.configs, self.now
        )
        self.status = self.last.status
        self.actions += [a.action for a in self.last.actions if a.action not in PER_CLASS]
        self.named += [a for a in self.last.actions if a.action in PER_CLASS]
        # the watch shows the planned pods serving: the reconcile it triggers
        self.last = step(
            self.specmodel, self.status, self._observed(), None, self.configs, self.now
        )
        self.status = self.last.status

    def _observed(self) -> Observed:
        if self.last is None:
            return Observed()
        the_plan = self.last.plan
        replicas = self.specmodel.spec.pod.replicas - the_plan.rollout_pods
        canary = deployment(1, True) if the_plan.canary else Rollout()
        pods = the_plan.rollout_pods
        rollout = deployment(pods, the_plan.speculation) if pods else Rollout()
        return Observed(
            fleet=deployment(replicas, the_plan.speculation), canary=canary, rollout=rollout
        )

    def condition(self, kind: str) -> tuple[str, str]:
        found = next(c for c in self.status.conditions if c.type == kind)
        return found.status, found.reason


def beside(canary: Observation) -> Observation:
    """The fleet's window without speculation, a trial's canary window beside it."""
    fleet = observe(0.8, 0.8, speculation=False)
    return Observation(T0, 60, 1, False, fleet.classes, canary=canary)


def test_a_collapse_engages_a_trial_runs_on_a_canary_and_a_recovery_releases() -> None:
    loop = Loop(specmodel())
    loop.tick(observe(0.8, 0.8))
    assert loop.actions == [] and loop.condition("SpeculationActive") == ("True", "Enabled")
    loop.tick(observe(0.1, 0.1))
    assert loop.actions == ["kill_switch_engaged"]
    assert loop.last and not loop.last.plan.speculation
    assert loop.condition("SpeculationActive") == ("False", "KillSwitchEngaged")
    loop.tick(*[observe(0.8, 0.8, speculation=False)] * 4)  # the 60 s cooldown
    assert loop.actions[-1] == "trial_started"
    assert loop.status.canary and loop.status.canary.state == "Serving"
    canary_children = {m["metadata"]["name"] for m in loop.last.children(RenderSettings())}
    assert "m-canary" in canary_children
    loop.tick(*[beside(observe(0.8, 0.8, tpot=0.008))] * 4)  # 2.5x the fleet's TPOT
    assert loop.actions == ["kill_switch_engaged", "trial_started", "kill_switch_released"]
    assert loop.last.plan.speculation and not loop.last.plan.canary
    assert loop.status.canary is None
    assert loop.condition("SpeculationActive") == ("True", "Enabled")


def test_a_human_override_is_never_fought_the_guard_alerts_instead() -> None:
    loop = Loop(specmodel(annotations={KILL_SWITCH_ANNOTATION: "release"}))
    loop.tick(*[observe(0.1, 0.1)] * 3)
    assert loop.actions == ["alert"]
    assert loop.last and loop.last.plan.speculation
    assert loop.status.kill_switch and loop.status.kill_switch.source == "annotation"


def test_a_broken_revision_rolls_back_to_the_last_good_one_and_serves_its_config() -> None:
    loop = Loop(specmodel(k=4, strategy="direct"))
    loop.tick(*[observe(0.8, 0.8)] * 41)  # probation: 600 s of good windows
    assert loop.actions == ["revision_promoted"]
    loop.change(specmodel(k=3, strategy="direct"))
    assert loop.last and loop.last.plan.desired.number == 2
    broken = observe(0.8, 0.8, tool_calls_valid=70.0, tool_calls_invalid=30.0)
    loop.tick(broken, broken, broken)
    assert loop.actions == ["revision_promoted", "rolled_back"]
    assert loop.last.plan.active.number == 1
    assert loop.condition("RolledBack") == ("True", "RolledBackToLastGood")
    engine = next(m for m in loop.last.children(RenderSettings()) if m["kind"] == "Deployment")
    args = "".join(engine["spec"]["template"]["spec"]["containers"][0]["args"])
    assert '"num_speculative_tokens":4' in args.replace(" ", "")


def test_a_revision_broken_during_probation_rolls_back_to_the_one_that_served_clean() -> None:
    loop = Loop(specmodel(k=4, strategy="direct"))
    loop.tick(*[observe(0.8, 0.8)] * 3)  # three good windows, far from passing probation
    assert loop.actions == [] and loop.status.revisions[0].served_clean
    loop.change(specmodel(k=3, strategy="direct"))  # the next commit, revision 1 on probation
    loop.tick(*[observe(0.8, 0.8)] * 3)  # it serves clean too, then breaks
    broken = observe(0.8, 0.8, tool_calls_valid=70.0, tool_calls_invalid=30.0)
    loop.tick(broken, broken, broken)
    assert loop.actions == ["rolled_back"]
    assert loop.last and loop.last.plan.active.number == 1
    records = [(r.number, r.verdict, r.served_clean) for r in loop.status.revisions]
    assert records == [(1, "probation", True), (2, "bad", False)]  # rolled back: no target
    status, _ = loop.condition("RolledBack")
    [rolled_back] = [c for c in loop.status.conditions if c.type == "RolledBack"]
    assert status == "True" and "serving revision 1" in rolled_back.message
    assert "on probation, it served clean" in rolled_back.message


def test_a_slow_revision_rolls_back_and_never_engages_the_kill_switch() -> None:
    slo = [CLASSES[0], {**CLASSES[1], "slo": {"maxP95TpotSeconds": 0.05}}]
    loop = Loop(specmodel(k=4, strategy="direct", classes=slo))
    loop.tick(*[observe(0.8, 0.8, p95_tpot_seconds=0.02)] * 41)
    assert loop.actions == ["revision_promoted"] and loop.status.guard
    # revision 1 was once measured without speculation at 0.025 s a token
    measured = {"code": 0.025, "chat": 0.025}
    memory = {"tpot_without_speculation": measured, "tpot_measured_at": loop.now.isoformat()}
    guard = loop.status.guard.model_copy(update={**memory, "tpot_revision": 1})
    loop.status = loop.status.model_copy(update={"guard": guard})
    loop.change(specmodel(k=3, strategy="direct", classes=slo))
    slow = observe(0.8, 0.8, tpot=0.05, p95_tpot_seconds=0.125)  # 2.5x, outputs fine
    loop.tick(slow, slow, slow)
    assert loop.actions == ["revision_promoted", "rolled_back"]
    assert loop.last and loop.last.plan.active.number == 1 and loop.last.plan.speculation
    assert loop.status.kill_switch is None or loop.status.kill_switch.state == "released"


def test_a_minor_class_collapse_is_named_once_and_the_fleet_keeps_speculating() -> None:
    loop = Loop(specmodel())
    loop.tick(*[observe(0.8, 0.0)] * 5)  # chat drafts and never matches
    [breach] = loop.named
    assert breach.action == "class_breach" and not breach.acts
    assert breach.evidence["class"] == "chat" and breach.evidence["signal"] == "speedup"
    assert loop.actions == [] and loop.last and loop.last.plan.speculation
    assert loop.status.guard is not None
    chat = next(c for c in loop.status.guard.classes if c.name == "chat")
    assert chat.state == "breaching" and chat.signals == ["speedup"]
    loop.tick(*[observe(0.8, 0.8)] * 3)
    assert [a.action for a in loop.named] == ["class_breach", "class_recovered"]
    assert {c.state for c in loop.status.guard.classes} == {"ok"}
