"""Which alerts a SpecModel fires, as a pure function of its status (level-based: an alert fires
while its cause holds and resolves when it clears), plus one-shot alerts for guard decisions."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from specfleet.api import SpecModelStatus
from specfleet.api.status import (
    ConditionType,
    Decision,
    DecisionReason,
    SpeculationSource,
)
from specfleet.guard.actions import ActionKind

ONE_SHOT_SECONDS = 900
ONE_SHOT_ACTIONS = {
    ActionKind.ALERT,
    ActionKind.QUALITY_BREACH,
    ActionKind.TRIAL_FAILED,
    ActionKind.CLASS_BREACH,
    ActionKind.CLASS_SPECULATION_OFF,
    ActionKind.CLASS_TRIAL_FAILED,
}
DEADLINES = {
    DecisionReason.STEP_DEADLINE,
    DecisionReason.TRIAL_DEADLINE,
    DecisionReason.PROBATION_DEADLINE,
    DecisionReason.CLASS_TRIAL_DEADLINE,
}
"""A pending judgement its deadline ended, whatever it did then: someone should know."""
CLASS_LABELS = ("class", "signal")
"""Labels a one-shot alert takes from its decision's evidence: one alert per class breach (or
class switched off)."""
AlertKey = tuple[str, ...]


@dataclass(frozen=True)
class Alert:
    name: str
    namespace: str
    specmodel: str
    severity: str
    summary: str
    evidence: dict[str, object] = field(default_factory=dict)
    starts_at: str | None = None
    ends_at: str | None = None
    extra_labels: dict[str, str] = field(default_factory=dict)
    """What tells apart alerts of one name on one SpecModel (a class breach: class, signal)."""

    @property
    def key(self) -> AlertKey:
        extra = (f"{label}={value}" for label, value in sorted(self.extra_labels.items()))
        return self.name, self.namespace, self.specmodel, *extra

    def labels(self) -> dict[str, str]:
        return {
            "alertname": self.name,
            "namespace": self.namespace,
            "specmodel": self.specmodel,
            "severity": self.severity,
            "source": "specfleet",
            **self.extra_labels,
        }

    def annotations(self) -> dict[str, str]:
        return {"summary": self.summary, "evidence": json.dumps(self.evidence, sort_keys=True)}


def firing(namespace: str, name: str, status: SpecModelStatus, now: datetime) -> list[Alert]:
    """Alerts that hold now. Their evidence is the last decision that caused each."""
    last = {d.reason: d for d in status.decisions}
    conditions = {c.type: c for c in status.conditions if c.status == "True"}
    alerts = []
    # The guard's switch only (in a trial too: the fleet is still without); a human's override
    # is intended, not an incident. The chart's SpecfleetKillSwitchEngagedLong agrees.
    if status.kill_switch and status.speculation_held_off_by == SpeculationSource.GUARD:
        alerts.append(
            _from(
                namespace,
                name,
                "SpecfleetKillSwitchEngaged",
                status.kill_switch.reason,
                last,
                DecisionReason.SPECULATION_NOT_PAYING,
                DecisionReason.TRIAL_FAILED,
                DecisionReason.FLAPPING,
            )
        )
    for kind, alertname, reasons in (
        (
            ConditionType.ROLLED_BACK,
            "SpecfleetRolledBack",
            (
                DecisionReason.ROLLED_BACK,
                DecisionReason.ROLLOUT_ABORTED,
                DecisionReason.STEP_DEADLINE,
            ),
        ),
        (ConditionType.METRICS_BLIND, "SpecfleetMetricsBlind", (DecisionReason.METRICS_BLIND,)),
        (ConditionType.FLAPPING, "SpecfleetFlapping", (DecisionReason.FLAPPING,)),
    ):
        if kind in conditions:
            message = conditions[kind].message
            alerts.append(_from(namespace, name, alertname, message, last, *reasons))
    alerts += [
        _one_shot(namespace, name, d, now)
        for d in status.decisions
        if (d.action in ONE_SHOT_ACTIONS or d.reason in DEADLINES)
        and now - datetime.fromisoformat(d.time) < timedelta(seconds=ONE_SHOT_SECONDS)
    ]
    return alerts


def _from(
    namespace: str,
    name: str,
    alertname: str,
    summary: str,
    last: dict[str, Decision],
    *reasons: DecisionReason,
) -> Alert:
    decision = next((last[r] for r in reasons if r in last), None)
    return Alert(
        alertname,
        namespace,
        name,
        "warning",
        summary or (decision.message if decision else alertname),
        dict(decision.evidence or {}) if decision else {},
        starts_at=decision.time if decision else None,
    )


def _one_shot(namespace: str, name: str, decision: Decision, now: datetime) -> Alert:
    ends = datetime.fromisoformat(decision.time) + timedelta(seconds=ONE_SHOT_SECONDS)
    evidence = decision.evidence or {}
    labels = {label: str(evidence[label]) for label in CLASS_LABELS if label in evidence}
    return Alert(
        f"Specfleet{decision.reason}",
        namespace,
        name,
        "warning",
        decision.message,
        dict(evidence),
        starts_at=decision.time,
        ends_at=ends.isoformat(),
        extra_labels=labels,
    )
