"""`SpecModel.status`: what the operator observed and decided. The operator owns it, not Git."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import Field

from specfleet.api.base import ApiModel
from specfleet.signals import CLASS_SIGNALS

MAX_DECISIONS = 20
MAX_REVISION_HISTORY = 10
NO_SPECULATION = "none"
"""`status.speculation` when the spec declares no speculative decoding."""


class ConditionType(StrEnum):
    READY = "Ready"
    PROGRESSING = "Progressing"
    DEGRADED = "Degraded"
    SPECULATION_ACTIVE = "SpeculationActive"
    ROLLED_BACK = "RolledBack"
    METRICS_BLIND = "MetricsBlind"
    FLAPPING = "Flapping"


class Phase(StrEnum):
    PENDING = "Pending"
    PROGRESSING = "Progressing"
    READY = "Ready"
    DEGRADED = "Degraded"
    INVALID = "Invalid"


class KillSwitchState(StrEnum):
    RELEASED = "released"
    ENGAGED = "engaged"
    TRIAL = "trial"


class SpeculationSource(StrEnum):
    """Who decided speculation: the kill-switch annotation, spec.guard.mode, the guard, or the
    config (none configured)."""

    ANNOTATION = "annotation"
    SPEC = "spec"
    GUARD = "guard"
    CONFIG = "config"


_RELEASED, _TRIAL, _GUARD = KillSwitchState.RELEASED, KillSwitchState.TRIAL, SpeculationSource.GUARD
"""Read once: the guard asks every tick, and on Python 3.11 reading a member through its enum
is slow (the enum's metaclass has a __getattr__)."""


class RevisionVerdict(StrEnum):
    PROBATION = "probation"
    GOOD = "good"
    BAD = "bad"
    KEPT = "kept"
    """Probation's deadline passed undecided: it serves on, unproven, and is no rollback
    target until it served clean."""


class Condition(ApiModel):
    """A standard Kubernetes condition (metav1.Condition)."""

    type: str = Field(description="Condition type, e.g. Ready or SpeculationActive.")
    status: str = Field(description="True, False or Unknown.")
    reason: str = Field(description="CamelCase reason, stable for tooling.")
    message: str = Field(default="", description="Human-readable detail.")
    observed_generation: int | None = Field(
        default=None, description="The spec generation the condition was computed from."
    )
    last_transition_time: str | None = Field(
        default=None, description="When status last changed (RFC 3339)."
    )


class ServingPlanStatus(ApiModel):
    """What runs: the active revision and whether speculation is on. Guard and kill switch act
    only through this; the rendered Deployment follows from spec + plan."""

    revision: int = Field(description="Active revision number.")
    speculation: bool = Field(description="Whether the engine runs with its speculative config.")
    reason: str = Field(default="", description="Why the plan is what it is.")


class ClassSpeculationState(StrEnum):
    SPECULATING = "speculating"
    PLAIN = "plain"
    """Served without speculation: by the plain pool, or by the fleet running without."""
    WAITING = "waiting"
    """Set off, still served with speculation until the plain pool is Ready."""
    TRIAL = "trial"
    """Routed to the plain pool by the guard, a sample of it served with speculation again to
    judge whether it pays."""


class ClassSpeculation(ApiModel):
    """Whether one class is served with speculation, and why not."""

    name: str = Field(description="Class name.")
    state: ClassSpeculationState = Field(
        description="`speculating`, `plain`, `waiting` or `trial`."
    )
    reason: str = Field(default="", description="Who set it off, and what serves it.")


class CanaryState(StrEnum):
    STARTING = "Starting"
    SERVING = "Serving"


class CanaryStatus(ApiModel):
    """A trial's canary: one extra pod, behind the same Service as the fleet, that runs the
    active revision with speculation while the fleet runs without. The trial is judged on the
    canary's windows alone."""

    deployment: str = Field(description="The canary's Deployment (`<name>-canary`).")
    revision: int = Field(description="The revision it runs, with speculation.")
    state: CanaryState = Field(
        description="`Starting` until its pod is available, then `Serving` (its windows count)."
    )
    ready_since: str | None = Field(
        default=None, description="When its pod became available (RFC 3339)."
    )


class RolloutPhase(StrEnum):
    PROGRESSING = "Progressing"
    WAITING = "Waiting"
    PROMOTED = "Promoted"
    ABORTED = "Aborted"


class Evidence(ApiModel):
    """What one pending judgement (a canary step, a trial, a probation, a quiet fleet) has seen
    since it began:
    counts summed over the guard's windows (each tick adds what its window holds that was not
    counted), of the side judged and, for a canary step, of the control over the same time. Its
    deadline ends it whatever it shows."""

    since: str = Field(description="When the judgement began (RFC 3339).")
    deadline: str = Field(description="When it ends inconclusive if nothing decided it.")
    serving: str = Field(default="", description="What served it, when that can change.")
    through: str | None = Field(default=None, description="End of the last window counted.")
    seconds: float = Field(default=0.0, description="Seconds of serving counted.")
    judged: dict[str, dict[str, float]] = Field(
        default_factory=dict,
        description="Per class, the counts of the side judged (requests, drafted and accepted "
        "tokens, valid and invalid answers...), summed; p95s are the last window's.",
    )
    control: dict[str, dict[str, float]] = Field(
        default_factory=dict, description="Per class, the control's counts over the same windows."
    )
    pending: list[str] = Field(
        default_factory=list,
        description="Per class, what the judgement still needs, in words (e.g. `code: 14 of 20 "
        "requests`).",
    )


class RolloutAnalysis(ApiModel):
    """The last window a canary step judged, canary against control."""

    time: str = Field(description="When (RFC 3339).")
    verdict: str = Field(description="good, bad or inconclusive.")
    decisive: bool = Field(default=False, description="Bad enough to abort on its own.")
    breaches: list[str] = Field(
        default_factory=list, description="Per class and signal: canary vs control, both samples."
    )
    unjudged: list[str] = Field(
        default_factory=list,
        description="Classes the control served (or critical ones) with too few requests on the "
        "canary in the window: until they are judged, a window is inconclusive.",
    )
    latency_judged: bool = Field(
        default=True,
        description="False in a step's first two guard windows: a fresh pod's first requests "
        "are slow (warm-up), so only a decisive slowdown (twice the control's) counts and the "
        "window cannot be good.",
    )


class RolloutStatus(ApiModel):
    """A canary rollout: the new revision on a few pods (`<name>-rollout`) beside the fleet on
    the control, behind the same Service, traffic split by pods; step after step, then the whole
    fleet (Promoted), or the canary removed and the fleet untouched (Aborted)."""

    revision: int = Field(description="The new revision, on the canary.")
    control: int = Field(description="The revision the fleet serves, compared with.")
    step: int = Field(description="The step running, from 1.")
    steps: int = Field(description="Steps before promotion.")
    pods: int = Field(description="Canary pods at this step.")
    windows: int = Field(description="Good windows in a row this step needs to pass.")
    phase: RolloutPhase = Field(
        description="`Progressing`, `Waiting` (a kill-switch trial ends first), `Promoted` or "
        "`Aborted`."
    )
    started: str = Field(description="When the rollout started (RFC 3339).")
    step_since: str | None = Field(
        default=None,
        description="When every canary pod of this step was available: its windows count.",
    )
    good_windows: int = Field(default=0, description="Good windows in a row at this step.")
    bad_windows: int = Field(default=0, description="Breaching windows in a row.")
    last_analysis: RolloutAnalysis | None = Field(default=None, description="The last window.")
    evidence: Evidence | None = Field(
        default=None, description="What this step's judgement has seen, and its deadline."
    )
    message: str = Field(default="", description="Where the rollout stands, in words.")


class RevisionRecord(ApiModel):
    """One distinct engine config. Its full config lives in a ControllerRevision."""

    number: int = Field(description="Revision number, increasing.")
    hash: str = Field(description="Hash of the engine config.")
    generation: int | None = Field(
        default=None, description="SpecModel generation that introduced it."
    )
    verdict: str = Field(
        default="probation",
        description="`probation`, `good`, `bad` (rolled back) or `kept` (its probation's "
        "deadline passed undecided: it serves on, unproven).",
    )
    created: str | None = Field(default=None, description="When it was first seen.")
    served_clean: bool = Field(
        default=False,
        description="It served consecutiveBreaches windows in a row judged good, with no "
        "breach: a rollback target even before it passed probation.",
    )


class KillSwitchStatus(ApiModel):
    state: KillSwitchState = Field(
        default=KillSwitchState.RELEASED,
        description="`released` (speculation as spec says), `engaged` (speculation off) or "
        "`trial` (speculation re-enabled on a canary pod only, on probation).",
    )
    source: str = Field(default="", description="Who set it: `guard`, `annotation` or `spec`.")
    since: str | None = Field(default=None, description="When the state was entered.")
    reason: str = Field(default="", description="Why.")
    failed_trials: int = Field(default=0, description="Trials that failed in a row (backoff).")
    next_trial_after: str | None = Field(
        default=None, description="Earliest time of the next trial re-enable."
    )
    evidence: Evidence | None = Field(
        default=None, description="In a trial: what its canary has shown, and its deadline."
    )

    @property
    def held_by(self) -> str | None:
        """Who holds the fleet's speculation off with this switch: its source (the guard, or a
        human's override: `annotation`, `spec`) while engaged or in a trial (speculation on one
        canary pod, the fleet still without); None while released."""
        return None if self.state == _RELEASED else self.source or None

    @property
    def engaged(self) -> bool:
        """The guard holds the fleet's speculation off: engaged, or in a trial. An override's
        switch is a human's decision, intended, not the guard's (`held_by` names it)."""
        return self.held_by == _GUARD

    @property
    def trial(self) -> bool:
        """The guard's switch is in a trial: speculation on a canary pod, the fleet still without
        (an override's switch is engaged or released, never in a trial)."""
        return self.state == _TRIAL and self.engaged


class LatencyBaseline(ApiModel):
    """One class's latency under the last good revision, in the window that promoted it."""

    p95_ttft_seconds: float | None = Field(default=None, description="p95 time to first token.")
    p95_tpot_seconds: float | None = Field(default=None, description="p95 time per output token.")
    requests: float = Field(default=0.0, description="Requests in that window: the samples.")
    speculation: bool = Field(
        default=True, description="Whether it ran with speculation: compared only alike."
    )


class QualityBaseline(ApiModel):
    """Quality and latency of the last good revision, what a revision on probation is compared
    with."""

    tool_call_validity: float | None = Field(default=None, description="Valid tool-call share.")
    structured_output_validity: float | None = Field(
        default=None, description="Valid structured-output share."
    )
    error_rate: float | None = Field(default=None, description="Upstream error share.")
    latency: dict[str, LatencyBaseline] = Field(
        default_factory=dict, description="Per class p95 TTFT and TPOT."
    )
    truncation_rate: dict[str, float] = Field(
        default_factory=dict,
        description="Per class share of answers cut off at their token limit (classes differ: "
        "long answers are cut more often).",
    )
    empty_answer_rate: dict[str, float] = Field(
        default_factory=dict,
        description="Per class share of answers with no content and no tool call.",
    )


class ClassState(StrEnum):
    OK = "ok"
    BREACHING = "breaching"


class ClassGuardStatus(ApiModel):
    """The guard's state of one prompt class, critical or not: breaching from the decision that
    named it until one that says it recovered."""

    name: str = Field(description="Class name.")
    state: ClassState = Field(default=ClassState.OK, description="`ok` or `breaching`.")
    since: str | None = Field(default=None, description="When the state was entered.")
    signals: list[str] = Field(
        default_factory=list,
        description=f"What it breaches: {', '.join(CLASS_SIGNALS)}.",
    )
    bad: int = Field(default=0, description="Windows in a row with a breach.")
    good: int = Field(default=0, description="Conclusive windows in a row without one.")


class ClassSwitchState(StrEnum):
    OFF = "off"
    TRIAL = "trial"


class ClassSwitch(ApiModel):
    """The guard's switch of one class (guard.routeClasses): speculation off for it alone, its
    requests routed to the plain pool, until a trial shows it pays again."""

    name: str = Field(description="Class name.")
    state: ClassSwitchState = Field(
        default=ClassSwitchState.OFF,
        description="`off` (routed to the plain pool) or `trial` (a sample of it served by the "
        "speculative fleet, judged there).",
    )
    since: str = Field(description="When the state was entered (RFC 3339).")
    reason: str = Field(default="", description="The decision that put it there, in words.")
    failed_trials: int = Field(default=0, description="Trials that failed in a row (backoff).")
    next_trial_after: str = Field(description="Earliest time of its next trial (RFC 3339).")
    evidence: Evidence | None = Field(
        default=None,
        description="In a trial: what its sample has shown on the speculative fleet, and the "
        "deadline; kept from a trial its deadline ended, for the next to add to.",
    )


class GuardStatus(ApiModel):
    """The guard's memory between evaluations."""

    consecutive_bad: int = Field(default=0, description="Bad evaluations in a row.")
    consecutive_good: int = Field(default=0, description="Good evaluations in a row.")
    quality_bad: int = Field(
        default=0,
        description="Evaluations in a row where the revision breached its quality floors or "
        "latency SLOs.",
    )
    quality_good: int = Field(
        default=0, description="Conclusive evaluations in a row where the revision met them."
    )
    last_evaluation: str | None = Field(default=None, description="Last evaluation time.")
    last_data: str | None = Field(default=None, description="Last time any data was seen.")
    blind: bool = Field(default=False, description="No data for longer than blindAfterSeconds.")
    flapping: bool = Field(
        default=False, description="Too many actions in an hour: latched with speculation off."
    )
    action_times: list[str] = Field(
        default_factory=list, max_length=100, description="Times of actions in the last hour."
    )
    tpot_without_speculation: dict[str, float] | None = Field(
        default=None, description="Per class mean TPOT measured with speculation off, seconds."
    )
    tpot_measured_at: str | None = Field(
        default=None, description="When tpotWithoutSpeculation was last measured (expires)."
    )
    tpot_revision: int | None = Field(
        default=None,
        description="The revision tpotWithoutSpeculation was measured on: evidence for it alone.",
    )
    baseline: QualityBaseline | None = Field(
        default=None, description="Quality of the last good revision."
    )
    probation_revision: int | None = Field(
        default=None, description="Revision whose probation started at probationSince."
    )
    probation_since: str | None = Field(default=None, description="When probation started.")
    probation_evidence: Evidence | None = Field(
        default=None, description="What the revision on probation has shown, and its deadline."
    )
    fleet_evidence: Evidence | None = Field(
        default=None,
        description="While a window holds too few requests of a class to judge it: what the "
        "fleet has shown since its judgement began.",
    )
    trial_since: str | None = Field(default=None, description="When the trial re-enable began.")
    trial_max_in_flight: float | None = Field(
        default=None,
        description="Set when speculation lost to load, not to acceptance: trials wait until "
        "the requests in flight per replica fall to this many.",
    )
    classes: list[ClassGuardStatus] = Field(
        default_factory=list, description="Each class's state: ok or breaching, and why."
    )
    class_switches: list[ClassSwitch] = Field(
        default_factory=list,
        max_length=64,
        description="The classes the guard serves without speculation (guard.routeClasses).",
    )


class JudgedOn(StrEnum):
    """What a class's verdict in `status.classes` was judged on."""

    WINDOW = "window"
    ACCUMULATED = "accumulated"
    """A quiet fleet's evidence (`guard.fleetEvidence`): the window held too few requests."""
    PLAIN_POOL = "plainPool"
    """The window's requests the plain pool served: the class is routed there."""


class ClassObservation(ApiModel):
    """One prompt class as the guard last judged it: its verdict and the numbers behind it."""

    name: str = Field(description="Class name.")
    judged_on: JudgedOn = Field(
        default=JudgedOn.WINDOW,
        description="`window`: the latest window; `accumulated`: the window held too few "
        "requests to judge the class, so it was judged on the fleet's evidence summed since its "
        "judgement began (`guard.fleetEvidence`), with no p95s (they do not add up); "
        "`plainPool`: routed, judged on what the plain pool served it in the window.",
    )
    seconds: float | None = Field(
        default=None, description="Seconds of serving the numbers hold (the window's or the sum's)."
    )
    requests: float | None = Field(default=None, description="Requests the numbers hold.")
    plain_pool_requests: float | None = Field(
        default=None,
        description="Of the window's requests, those the plain pool served (a routed class's; "
        "some of one moving, or on trial): what sizes the pool.",
    )
    draft_tokens: float | None = Field(default=None, description="Drafted tokens.")
    accepted_tokens: float | None = Field(default=None, description="Accepted draft tokens.")
    acceptance_rate: float | None = Field(default=None, description="Accepted / drafted tokens.")
    mean_acceptance_length: float | None = Field(
        default=None, description="1 + accepted / verify steps."
    )
    p95_ttft_seconds: float | None = Field(default=None, description="p95 time to first token.")
    p95_tpot_seconds: float | None = Field(default=None, description="p95 time per output token.")
    tool_call_validity: float | None = Field(default=None, description="Valid tool-call share.")
    expected_speedup: float | None = Field(
        default=None, description="Modelled speedup of speculation for this class."
    )
    verdict: str = Field(default="inconclusive", description="good, bad or inconclusive.")


class DecisionReason(StrEnum):
    """Why the guard or the operator acted: a `Decision`'s reason, also its Event's. Stable
    CamelCase: alerts take their names from it (`Specfleet<reason>`)."""

    SPECULATION_NOT_PAYING = "SpeculationNotPaying"
    SPECULATION_PAYS = "SpeculationPays"
    TRIAL_STARTED = "TrialStarted"
    TRIAL_FAILED = "TrialFailed"
    FLAPPING = "Flapping"
    QUALITY_BREACH = "QualityBreach"
    ROLLED_BACK = "RolledBack"
    REVISION_PROMOTED = "RevisionPromoted"
    ROLLOUT_STEP_PASSED = "RolloutStepPassed"
    ROLLOUT_PROMOTED = "RolloutPromoted"
    ROLLOUT_ABORTED = "RolloutAborted"
    STEP_DEADLINE = "StepDeadline"
    TRIAL_DEADLINE = "TrialDeadline"
    PROBATION_DEADLINE = "ProbationDeadline"
    CLASS_BREACH = "ClassBreach"
    CLASS_RECOVERED = "ClassRecovered"
    CLASS_NOT_PAYING = "ClassNotPaying"
    CLASS_PAYS = "ClassPays"
    CLASS_TRIAL_STARTED = "ClassTrialStarted"
    CLASS_TRIAL_FAILED = "ClassTrialFailed"
    CLASS_TRIAL_DEADLINE = "ClassTrialDeadline"
    METRICS_BLIND = "MetricsBlind"
    METRICS_RESTORED = "MetricsRestored"


class Decision(ApiModel):
    """One guard or operator action, with the evidence that caused it."""

    time: str = Field(description="When (RFC 3339).")
    action: str = Field(description="e.g. kill_switch_engaged, rolled_back, alert.")
    # A DecisionReason when the operator writes it, but a string in the API (and the CRD): a
    # status another version of the operator wrote, with a reason this one lacks, still reads.
    reason: str = Field(description="Stable CamelCase reason (also the Event reason).")
    message: str = Field(default="", description="What happened, in words.")
    evidence: dict[str, Any] | None = Field(
        default=None,
        description="The numbers behind the decision: values, thresholds, samples, window.",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )


class ReplicaStatus(ApiModel):
    desired: int = Field(default=0, description="Replicas the Deployment wants.")
    updated: int = Field(default=0, description="Replicas on the current pod template.")
    ready: int = Field(default=0, description="Ready replicas.")
    available: int = Field(default=0, description="Available replicas.")


class SpecModelStatus(ApiModel):
    observed_generation: int | None = Field(
        default=None, description="The spec generation this status describes."
    )
    phase: Phase | None = Field(default=None, description="Summary state.")
    conditions: list[Condition] = Field(
        default_factory=list,
        description="Ready, Progressing, Degraded, SpeculationActive, RolledBack, MetricsBlind.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    speculation: str | None = Field(
        default=None, description=f"Declared speculation as `method/k`, or `{NO_SPECULATION}`."
    )
    speculation_active: bool | None = Field(
        default=None,
        description="Whether the fleet's pods run with speculation now (a trial's canary aside).",
    )
    acceptance: str | None = Field(
        default=None, description="Traffic-weighted acceptance rate of the last window."
    )
    classes_speculating: str | None = Field(
        default=None, description="Classes served with speculation, of all (`3/4`)."
    )
    class_speculation: list[ClassSpeculation] = Field(
        default_factory=list,
        description="Each class: served with speculation, without (plain), or waiting for the "
        "plain pool, and why.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    plain_pool: ReplicaStatus | None = Field(
        default=None, description="The plain pool's pods (`<name>-plain`), when it runs."
    )
    serving_plan: ServingPlanStatus | None = Field(default=None, description="What runs.")
    desired_revision: int | None = Field(default=None, description="Revision spec asks for.")
    active_revision: int | None = Field(default=None, description="Revision being served.")
    last_good_revision: int | None = Field(
        default=None, description="Newest revision that passed probation."
    )
    revisions: list[RevisionRecord] = Field(
        default_factory=list,
        max_length=MAX_REVISION_HISTORY,
        description="Recent revisions, newest last.",
    )
    kill_switch: KillSwitchStatus | None = Field(default=None, description="Kill switch.")
    canary: CanaryStatus | None = Field(
        default=None, description="The canary of a running trial; absent between trials."
    )
    rollout: RolloutStatus | None = Field(
        default=None, description="The last canary rollout of a new revision."
    )
    rollout_override: str | None = Field(
        default=None, description="Last `specfleet.dev/rollout` value seen (acts when it changes)."
    )
    guard: GuardStatus | None = Field(default=None, description="The guard's memory.")
    retry_token: str | None = Field(
        default=None, description="Last `specfleet.dev/retry` value acted on."
    )
    replicas: ReplicaStatus | None = Field(default=None, description="Rollout progress.")
    classes: list[ClassObservation] = Field(
        default_factory=list,
        description="Per class, the verdict of the last evaluation and the numbers it was "
        "judged on: the window's, or the quiet fleet's evidence (`judgedOn`).",
    )
    decisions: list[Decision] = Field(
        default_factory=list,
        max_length=MAX_DECISIONS,
        description="Recent decisions, newest last.",
    )

    @property
    def speculation_held_off_by(self) -> str | None:
        """Who holds the fleet's declared speculation off with the kill switch
        (`KillSwitchStatus.held_by`): the guard, or a human's override. None when the spec
        declares no speculation: nothing is switched off then (the guard's switch, kept for
        when it is declared again, holds nothing)."""
        if self.kill_switch is None or self.speculation == NO_SPECULATION:
            return None
        return self.kill_switch.held_by
