"""Per-class verdicts for one window: good, bad or inconclusive, per signal, with evidence.

Too few samples or no data is inconclusive, never bad. Bounds are always valid at the stated
`guard.errorRate` (`guard.sequential`). A window whose bounds lie outside
the hysteresis band (`decisive`) is evidence enough on its own; a marginal one needs company.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from specfleet.api.spec import ClassSlo
from specfleet.api.status import LatencyBaseline, QualityBaseline
from specfleet.guard.policy import (
    LATENCY_MARGIN,
    MIN_ERROR_RATE_BREACH,
    MIN_ERRORS,
    QUALITY_MARGIN,
    ClassPolicy,
    Policy,
)
from specfleet.guard.sequential import (
    Bounds,
    confidence_sequence,
    excludes,
    ratio_confidence_sequence,
    ratio_spread,
    requests_to_decide,
    trials_to_decide,
)
from specfleet.guard.speedup import (
    decode_steps,
    expected_tokens_per_step,
    load_factor,
    speedup,
)
from specfleet.signals import (
    ACCEPTANCE_RATE,
    P95_TPOT,
    P95_TTFT,
    QUALITY,
    SPEEDUP,
    Rule,
    Signal,
)
from specfleet.telemetry.model import ClassWindow, Observation

MULTIPLE = Rule.MULTIPLE
"""Read once (as `killswitch.TRIAL`)."""


class Judged(NamedTuple):
    """What one family of signals showed for a class: breaches and the raw readings."""

    breaches: list[str]
    readings: dict[str, Any]


class ClassVerdict(NamedTuple):
    """A NamedTuple, not a frozen dataclass: one is built per class, SpecModel and tick, and a
    frozen dataclass's __init__ would cost as much as the judgement."""

    name: str
    conclusive: bool
    weight: float
    """Output tokens (or requests) in the window: the class's share of traffic."""
    window: ClassWindow | None
    """The window, when it had enough requests to judge."""
    slo: ClassSlo
    critical: bool
    policy: Policy
    baseline: QualityBaseline | None
    speedup: float | None = None
    """Set when speculation was judged."""
    source: str | None = None
    """Where the speedup comes from: the model, the rate, or measured TPOT."""
    speculation_breaches: Sequence[str] = ()
    load: float = 1.0
    """The model's load factor at the window's requests in flight (1: no load term)."""
    speedup_bounds: Bounds | None = None
    """The speedup's bounds, from the acceptance rate's."""
    acceptance_bounds: Bounds | None = None
    """The acceptance rate's bounds (over the window's requests)."""
    drafts_per_step: float | None = None
    """δ: draft tokens per decode step, steps that drafted nothing included (None: unknown,
    the acceptance rate was read as an i.i.d. α at depth k)."""
    latency_baseline: LatencyBaseline | None = None
    """The last good revision's latency for this class, when it ran with speculation as this
    window did."""

    @property
    def below_acceptance_floor(self) -> bool:
        """The acceptance rate is confidently below the class's floor."""
        return self._upper_acceptance_under(1.0)

    @property
    def far_below_acceptance_floor(self) -> bool:
        """Confidently below the floor by the hysteresis band: a decisive breach."""
        return self._upper_acceptance_under(1.0 - self.policy.band)

    def shown_short(self, minimum: float) -> bool:
        """Its speedup's upper bound is under `minimum`, or its acceptance under its floor."""
        bounds = self.speedup_bounds
        return (bounds is not None and bounds[1] < minimum) or self.below_acceptance_floor

    def shown_paying(self, minimum: float) -> bool:
        """Judged, its speedup's lower bound at `minimum` or over, and its acceptance at or
        over its floor (no floor: nothing to show): what releasing the kill switch needs of a
        critical class, the converse of what engages it."""
        speedup, floor, acceptance = self.speedup_bounds, self.slo.min_acceptance_rate, None
        if self.acceptance_bounds is not None:
            acceptance = self.acceptance_bounds[0]
        if not self.conclusive or speedup is None or speedup[0] < minimum:
            return False
        return floor is None or (acceptance is not None and acceptance >= floor)

    def _upper_acceptance_under(self, share_of_floor: float) -> bool:
        floor = self.slo.min_acceptance_rate
        bounds = self.acceptance_bounds
        return floor is not None and bounds is not None and bounds[1] < floor * share_of_floor

    @property
    def verdict(self) -> str:
        if not self.conclusive:
            return "inconclusive"
        bad = self.speculation_breaches or self.quality_breaches or self.latency().breaches
        return "bad" if bad else "good"

    # Quality, latency and evidence are judged when asked, not stored: only a revision on
    # probation needs quality on every tick, the rest is read for status and actions.
    @property
    def quality_breaches(self) -> list[str]:
        """`quality().breaches`, without reading the signals nothing limits."""
        if self.window is None:
            return []
        return _judge_quality(self.name, self.slo, self.window, self.baseline, self.policy, None)

    def quality(self) -> Judged:
        if self.window is None:
            return Judged([], {})
        readings: dict[str, Any] = {}
        window, baseline = self.window, self.baseline
        breaches = _judge_quality(self.name, self.slo, window, baseline, self.policy, readings)
        return Judged(breaches, readings)

    def unproven(self) -> list[str]:
        """Quality signals neither past their limits nor shown within them (the limit less the
        hysteresis band, at the guard's error rate): what promoting a revision still needs.
        Asked only then: it costs a bound per signal."""
        if self.window is None:
            return []
        return _unproven_quality(self.name, self.slo, self.window, self.baseline, self.policy)

    def latency(self, plain: float = 1.0) -> Judged:
        """Against the stricter of the SLO and the last good revision's p95 (LATENCY_MARGIN
        above it); `plain` scales the window's p95s to what plain decoding would show."""
        if self.window is None:
            return Judged([], {})
        return _judge_latency(self.slo, self.window, self.latency_baseline, plain)

    def revision_breaches(self, speculation_bad: bool | None) -> list[str]:
        """What the revision is to blame for: its quality breaches, and its latency breaches
        unless speculation that does not pay explains them (the latency plain decoding would
        show, the window's scaled by the speedup, meets the limit)."""
        plain = min(self.speedup, 1.0) if speculation_bad and self.speedup is not None else 1.0
        return [*self.quality_breaches, *self.latency(plain).breaches]

    def evidence(self) -> dict[str, Any]:
        window = self.window
        if window is None:
            return {}
        evidence: dict[str, Any] = {"requests": _round(window.requests)}
        if self.speedup is not None:
            evidence["draftTokens"] = _round(window.draft_tokens or 0.0)
            evidence[ACCEPTANCE_RATE] = _round(window.acceptance_rate)
            evidence["meanAcceptanceLength"] = _round(window.mean_acceptance_length)
            evidence["k"] = self.policy.k
            evidence["draftsPerStep"] = _round(self.drafts_per_step)
            evidence["draftCost"] = self.policy.draft_cost
            if self.policy.step_overhead:  # the model's o, shown where it is not 0
                evidence["stepOverhead"] = self.policy.step_overhead
            evidence["loadFactor"] = round(self.load, 4)
            evidence[SPEEDUP] = round(self.speedup, 4)
            evidence["speedupSource"] = self.source
            evidence["acceptanceRateBounds"] = _rounded(self.acceptance_bounds)
            evidence["speedupBounds"] = _rounded(self.speedup_bounds)
        for measured in (self.quality().readings, self.latency().readings):
            for name, value in measured.items():
                evidence[name] = round(value, 4)
        for signal in QUALITY:
            unjudged = signal.unjudged(window) if signal.unjudged else None
            if unjudged:  # checks left out of the signal above, by reason
                evidence[signal.unjudged_key] = {
                    reason: round(n, 4) for reason, n in sorted(unjudged.items())
                }
        return evidence


class Evaluation(NamedTuple):
    classes: list[ClassVerdict]
    speedup: float | None
    threshold: float
    speculation_bad: bool | None
    """None: inconclusive (or speculation off)."""
    in_flight: float | None = None
    """Mean requests in flight per replica over the window."""
    load: float = 1.0
    """The speedup model's load factor at `in_flight` (1 with speculation off)."""
    drafts_per_step: float = 0.0
    """δ over every class's window (k when none says): the tokens a decode step verifies per
    request beyond its own, which the load factor charges."""
    critical_breach: bool = False
    """A critical class breached its speculation floors (acceptance rate or speedup)."""
    below_acceptance_floor: bool = False
    """A critical class's acceptance rate is confidently below its floor."""
    speedup_bounds: Bounds | None = None
    """The traffic-weighted speedup's bounds."""
    error_rate: float = 0.05
    """The error rate the bounds hold at (`guard.errorRate`)."""
    decisive: bool = False
    """This window alone settles `speculation_bad`: bad with the speedup's upper bound under
    minSpeedup - releaseMargin or a critical class's acceptance as far under its floor, good
    with the lower bound at minSpeedup + releaseMargin and every critical class judged."""

    @property
    def bound(self) -> float | None:
        """The bound on the side of the verdict: the upper when bad, else the lower."""
        if self.speedup_bounds is None:
            return None
        return self.speedup_bounds[1] if self.speculation_bad else self.speedup_bounds[0]

    @property
    def critical_judged(self) -> bool:
        """Every critical class's window was conclusive."""
        return all(v.conclusive for v in self.classes if v.critical)

    def critical_short(self, minimum: float) -> bool:
        """A critical class is shown short (`ClassVerdict.shown_short`)."""
        return any(v.shown_short(minimum) for v in self.classes if v.critical)

    def critical_paying(self, minimum: float) -> bool:
        """Every critical class is shown paying (`ClassVerdict.shown_paying`)."""
        return all(v.shown_paying(minimum) for v in self.classes if v.critical)

    @property
    def revision_unproven(self) -> list[str]:
        """Each judged class's quality signals not yet shown within their limits."""
        return [
            f"{v.name}: {words}" for v in self.classes if v.conclusive for words in v.unproven()
        ]

    @property
    def revision_bad(self) -> bool | None:
        """Whether the revision breached a class's quality floors or latency SLOs
        (`ClassVerdict.revision_breaches`); None: no class was conclusive."""
        conclusive = [v for v in self.classes if v.conclusive]
        if not conclusive:
            return None
        return any(v.revision_breaches(self.speculation_bad) for v in conclusive)

    def evidence(self) -> dict[str, Any]:
        return {
            SPEEDUP: _round(self.speedup),
            "speedupBounds": _rounded(self.speedup_bounds),
            "decisive": self.decisive,
            "minSpeedup": self.threshold,
            "inFlightPerReplica": _round(self.in_flight),
            "classes": {c.name: c.evidence() for c in self.classes if c.conclusive},
        }


def evaluate(
    policy: Policy,
    observation: Observation,
    threshold: float,
    tpot_without_speculation: dict[str, float],
    baseline: QualityBaseline | None,
) -> Evaluation:
    in_flight = _in_flight_per_replica(policy, observation)
    speculation = observation.speculation
    load = 1.0
    drafting = _fleet_drafts_per_step(observation, policy.k)
    if in_flight is not None and speculation:
        load = load_factor(in_flight, drafting, policy.per_token_compute)
    windows = observation.classes
    verdicts = [
        judge(
            policy,
            c,
            windows.get(c.name),
            speculation,
            threshold,
            tpot_without_speculation.get(c.name),
            baseline,
            load,
        )
        for c in policy.classes
    ]
    if baseline is not None and baseline.latency:
        verdicts = [_with_latency_baseline(v, baseline, speculation) for v in verdicts]
    return _concluded(policy, verdicts, threshold, speculation, in_flight, load, drafting)


def excluding(
    evaluation: Evaluation, names: frozenset[str], policy: Policy, speculation: bool
) -> Evaluation:
    """The evaluation of the fleet's speculation without the classes `names` (ones the guard
    judges apart, `guard.class_switch`): out of its speedup and its critical classes."""
    judged = [v for v in evaluation.classes if v.name not in names]
    return _concluded(
        policy,
        judged,
        evaluation.threshold,
        speculation,
        evaluation.in_flight,
        evaluation.load,
        evaluation.drafts_per_step,
    )


def _concluded(
    policy: Policy,
    verdicts: list[ClassVerdict],
    threshold: float,
    speculation: bool,
    in_flight: float | None,
    load: float,
    drafting: float,
) -> Evaluation:
    """What the classes' verdicts make of the fleet's speculation."""
    speedup, bounds = _weighted_speedup(verdicts)
    speculation_bad: bool | None = None
    critical = [v for v in verdicts if v.critical]
    critical_breach = any(v.speculation_breaches for v in critical)
    if speculation and speedup is not None:
        speculation_bad = speedup < threshold or critical_breach
    below_floor = any(v.below_acceptance_floor for v in critical)
    decisive = speculation_bad is not None and _decisive(policy, speculation_bad, bounds, critical)
    return Evaluation(
        verdicts,
        speedup,
        threshold,
        speculation_bad,
        in_flight,
        load,
        drafting,
        critical_breach,
        below_floor,
        bounds,
        policy.guard.error_rate,
        decisive,
    )


def _with_latency_baseline(
    verdict: ClassVerdict, baseline: QualityBaseline, speculation: bool
) -> ClassVerdict:
    """Latency is compared with the last good revision's only alike: with speculation or
    without."""
    latency = baseline.latency.get(verdict.name)
    if latency is None or latency.speculation != speculation:
        return verdict
    return verdict._replace(latency_baseline=latency)


def _weighted_speedup(verdicts: list[ClassVerdict]) -> tuple[float | None, Bounds | None]:
    """The traffic-weighted speedup over the classes judged, and their bounds weighted alike:
    a conservative interval of the mean. (One pass: this runs per SpecModel and tick.)"""
    total = speedup = low = high = 0.0
    for v in verdicts:
        if v.speedup is None or v.speedup_bounds is None or not v.weight:
            continue
        total += v.weight
        speedup += v.speedup * v.weight
        low += v.speedup_bounds[0] * v.weight
        high += v.speedup_bounds[1] * v.weight
    if total <= 0:
        return None, None
    return speedup / total, (low / total, high / total)


def _decisive(
    policy: Policy, bad: bool, bounds: Bounds | None, critical: list[ClassVerdict]
) -> bool:
    guard = policy.guard
    if bad:
        clearly_slow = bounds is not None and bounds[1] < guard.min_speedup - guard.release_margin
        return clearly_slow or any(v.far_below_acceptance_floor for v in critical)
    clearly_fast = bounds is not None and bounds[0] >= guard.min_speedup + guard.release_margin
    return clearly_fast and all(v.conclusive for v in critical)


def _in_flight_per_replica(policy: Policy, observation: Observation) -> float | None:
    """Little's law: seconds in flight over the window's seconds is the mean batch."""
    seconds = 0.0
    for window in observation.classes.values():
        seconds += window.request_seconds or 0.0
    if not seconds or not observation.window_seconds:
        return None
    return seconds / observation.window_seconds / max(policy.replicas, 1)


def judge(
    policy: Policy,
    klass: ClassPolicy,
    window: ClassWindow | None,
    speculation: bool,
    threshold: float,
    tpot_off: float | None,
    baseline: QualityBaseline | None,
    load: float = 1.0,
) -> ClassVerdict:
    if window is None or not window.requests or window.requests < policy.guard.min_requests:
        return ClassVerdict(
            klass.name, False, 0.0, None, klass.slo, klass.critical, policy, baseline
        )
    conclusive, judged = True, None
    if speculation and policy.k:
        judged = _judge_speculation(policy, klass, window, threshold, tpot_off, load)
        conclusive = judged is not None
    speedup, source, breaches, speedup_bounds, acceptance_bounds, drafting = judged or (
        None,
        None,
        (),
        None,
        None,
        None,
    )
    return ClassVerdict(
        klass.name,
        conclusive,
        (window.output_tokens or window.requests) if conclusive else 0.0,
        window,
        klass.slo,
        klass.critical,
        policy,
        baseline,
        speedup,
        source,
        breaches,
        load,
        speedup_bounds,
        acceptance_bounds,
        drafting,
    )


def _judge_speculation(
    policy: Policy,
    klass: ClassPolicy,
    window: ClassWindow,
    threshold: float,
    tpot_off: float | None,
    load: float,
) -> tuple[float, str, list[str], Bounds, Bounds | None, float | None] | None:
    """The class's speedup, its source, the breaches, the bounds of the speedup and the
    acceptance rate, and δ. Too little drafted is no evidence of a collapse (a drafter that
    drafted nothing matched nothing or was told not to): see `_judge_few_drafts`."""
    alpha = window.acceptance_rate
    if alpha is None or (window.draft_tokens or 0.0) < policy.guard.min_draft_tokens:
        return _judge_few_drafts(policy, window, threshold, tpot_off, load)
    drafting = _drafts_per_step(window)
    per_step = policy.k if drafting is None else drafting
    tokens = _tokens_per_step(drafting, policy.k, alpha)
    modelled = _speedup(policy, tokens, per_step) * load
    # Without step counts the rate is read as an i.i.d. α: an underestimate.
    source = "model" if drafting is not None else "model (rate)"
    modelled, source = _measured_speedup(policy, window, tpot_off) or (modelled, source)
    # Sampling noise in TPOT is the tokens per step's, so every source scales with its bounds.
    requests, (low, high) = acceptance_bounds(window, policy.guard.error_rate)
    speedup_bounds = (
        modelled * _tokens_per_step(drafting, policy.k, low) / tokens,
        modelled * _tokens_per_step(drafting, policy.k, high) / tokens,
    )
    breaches = []
    floor = klass.slo.min_acceptance_rate
    if floor is not None and high < floor:
        breaches.append(
            f"acceptance {alpha:.2f} < {floor:.2f} (upper bound {high:.2f} at error rate "
            f"{policy.guard.error_rate:g}, n={requests:.0f})"
        )
    if modelled < threshold:
        breaches.append(f"speedup {modelled:.2f} < {threshold:.2f}")
    return modelled, source, breaches, speedup_bounds, (low, high), drafting


def acceptance_bounds(window: ClassWindow, error_rate: float) -> tuple[float, Bounds]:
    """The requests behind the acceptance rate and its bounds: as wide as the requests differ
    where the gateway reported their spread; else counting requests as trials, a conservative
    bound (a request's own rate lies in [0, 1], so its variance is at most α(1-α); tokens of one
    request are not independent)."""
    alpha, sums = window.acceptance_rate or 0.0, _request_sums(window)
    if sums is not None:
        requests, drafted, deviations = sums
        bounds = ratio_confidence_sequence(
            alpha * drafted, drafted, deviations, requests, error_rate
        )
        return requests, bounds
    requests = window.requests or 0.0
    return requests, confidence_sequence(alpha * requests, requests, error_rate)


def requests_to_show(window: ClassWindow, limit: float, error_rate: float) -> float | None:
    """About how many requests `acceptance_bounds` needs to put the window's acceptance rate on
    its side of `limit`, were it to stay where it is: what a pending judgement still waits for."""
    rate, sums = window.acceptance_rate, _request_sums(window)
    if rate is None:
        return None
    if sums is not None:
        requests, drafted, deviations = sums
        spread = ratio_spread(deviations, drafted, requests)
        return requests_to_decide(rate, limit, spread, error_rate)
    return trials_to_decide(rate, limit, error_rate)


def _request_sums(window: ClassWindow) -> tuple[float, float, float] | None:
    """The requests that reported drafts, their drafted tokens and their deviations from the
    acceptance rate, where the gateway exported the per-request sums and something drafted."""
    deviations, requests, drafted = (
        window.acceptance_deviations,
        window.spec_requests,
        window.draft_tokens,
    )
    if deviations is None or not requests or not drafted:
        return None
    return requests, drafted, deviations


def _judge_few_drafts(
    policy: Policy,
    window: ClassWindow,
    threshold: float,
    tpot_off: float | None,
    load: float,
) -> tuple[float, str, list[str], Bounds, None, float] | None:
    """Too few drafts to read the acceptance rate: inconclusive, unless speculation being on
    costs every step (o > 0) and the window ran at least minDraftTokens decode steps. Then it
    is judged on speedup alone, between none and every draft accepted; acceptance stays
    unjudged (None bounds), so this is never an acceptance collapse."""
    steps = _decode_steps(window)
    if not policy.step_overhead or steps is None or steps < policy.guard.min_draft_tokens:
        return None
    drafting = (window.draft_tokens or 0.0) / steps
    tokens = 1.0 + (window.accepted_tokens or 0.0) / steps
    modelled, source = _measured_speedup(policy, window, tpot_off) or (
        _speedup(policy, tokens, drafting) * load,
        "model (few drafts)",
    )
    bounds = (modelled / tokens, modelled * (1.0 + drafting) / tokens)
    breaches = [f"speedup {modelled:.2f} < {threshold:.2f}"] if modelled < threshold else []
    return modelled, source, breaches, bounds, None, drafting


def _measured_speedup(
    policy: Policy, window: ClassWindow, tpot_off: float | None
) -> tuple[float, str] | None:
    """TPOT without speculation over this window's, where both are measures."""
    tpot_on = window.measured_tpot(policy.guard.min_requests)
    return (tpot_off / tpot_on, "measured") if tpot_off and tpot_on else None


def _speedup(policy: Policy, tokens_per_step: float, drafts_per_step: float) -> float:
    return speedup(tokens_per_step, drafts_per_step, policy.draft_cost, policy.step_overhead)


def _drafts_per_step(window: ClassWindow) -> float | None:
    """δ from the output tokens, or from the verify steps (as if every decode step drafted)
    where the window has no output tokens; None with neither."""
    steps = _decode_steps(window)
    return (window.draft_tokens or 0.0) / steps if steps else None


def _decode_steps(window: ClassWindow) -> float | None:
    """From the output tokens; the verify steps where the window has none (exact when every
    decode step drafted)."""
    output, accepted = window.output_tokens, window.accepted_tokens
    steps = decode_steps(output, accepted) if output and accepted is not None else None
    return steps or window.steps or None


def _fleet_drafts_per_step(observation: Observation, k: int) -> float:
    """δ over every class (they share the batch); k when no window says."""
    drafted = steps = 0.0
    for window in observation.classes.values():
        if found := _decode_steps(window):
            drafted += window.draft_tokens or 0.0
            steps += found
    return drafted / steps if steps else float(k)


def _tokens_per_step(drafting: float | None, k: int, p: float) -> float:
    """Tokens per decode step at acceptance rate p: 1 + δ·p, or from p as an i.i.d. α at depth
    k when δ is unknown."""
    if drafting is None:
        return expected_tokens_per_step(p, k)
    return 1.0 + drafting * p


def _judge_quality(
    klass: str,
    slo: ClassSlo,
    window: ClassWindow,
    baseline: QualityBaseline | None,
    policy: Policy,
    readings: dict[str, Any] | None,
) -> list[str]:
    """Each quality signal (`signals.QUALITY`) against the stricter of the class's SLO and the
    last good revision's value: the breaches, and each value judged into `readings` (None:
    breaches alone)."""
    breaches = []
    error_rate = policy.guard.error_rate
    for signal in QUALITY:
        good = signal.last_good(baseline, klass) if baseline else None
        if signal.rule is MULTIPLE:
            breach = _judge_multiple(signal, window, good, readings, error_rate)
        else:
            limit = _limit(signal.floor(slo), None if good is None else signal.good(good))
            if readings is None and not limit > 0.0:
                continue  # a limit of 0 is none: no share is shown under 0
            breach = _judge_share(signal, limit, window, policy, readings)
        if breach is not None:
            breaches.append(breach)
    return breaches


def _judge_share(
    signal: Signal,
    limit: float,
    window: ClassWindow,
    policy: Policy,
    readings: dict[str, Any] | None,
) -> str | None:
    """Judged as the share that is good (`Signal.good`) against a floor (`limit`): the SLO's, or
    the last good revision's share less the margin."""
    value, samples = signal.value(window), signal.samples(window)
    if value is None or samples < policy.guard.min_requests:
        return None
    if readings is not None:
        readings[signal.name] = value
    share = signal.good(value)
    if not (share < limit and excludes(limit, share * samples, samples, policy.guard.error_rate)):
        return None
    left_out = sum(signal.unjudged(window).values()) if signal.unjudged else 0.0
    apart = f", {left_out:.0f} unjudged" if left_out else ""
    told = f"{value:.3f} {signal.worse} {signal.good(limit):.3f}"
    return f"{signal.name} {told} (n={samples:.0f}{apart})"


def _unproven_quality(
    klass: str,
    slo: ClassSlo,
    window: ClassWindow,
    baseline: QualityBaseline | None,
    policy: Policy,
) -> list[str]:
    """Each share signal judged whose lower bound is under its limit less the hysteresis band."""
    unproven = []
    for signal in QUALITY:
        value, samples = signal.value(window), signal.samples(window)
        if signal.rule is MULTIPLE or value is None or samples < policy.guard.min_requests:
            continue
        good = signal.last_good(baseline, klass) if baseline else None
        limit = _limit(signal.floor(slo), None if good is None else signal.good(good))
        share, needed = signal.good(value), limit * (1.0 - policy.band)
        if share > needed and excludes(needed, share * samples, samples, policy.guard.error_rate):
            continue
        side = "at or over" if signal.higher_is_better else "at or under"
        shown = f"{signal.name} {value:.3f} not yet shown {side} {signal.good(needed):.3f}"
        unproven.append(f"{shown} (n={samples:.0f})")
    return unproven


def _limit(floor: float | None, good: float | None) -> float:
    """The stricter of the class's floor and the last good revision's value less the margin;
    at least 0. (Explicit rather than max() over the candidates: this runs per class and tick.)"""
    limit = floor
    relative = good - QUALITY_MARGIN if good else None
    if limit is None or (relative is not None and relative > limit):
        limit = relative
    return limit if limit is not None and not limit < 0.0 else 0.0


def _judge_multiple(
    signal: Signal,
    window: ClassWindow,
    good: float | None,
    readings: dict[str, Any] | None,
    error_rate: float,
) -> str | None:
    """The rate's lower bound over twice the last good revision's (at least 1%)."""
    value = signal.value(window)
    if value is None:
        return None
    if readings is not None:
        readings[signal.name] = value
    count = signal.count(window) or 0.0
    if count < MIN_ERRORS:
        return None
    limit = max(MIN_ERROR_RATE_BREACH, 2 * (good or 0.0))
    shown = value > limit and excludes(limit, count, signal.samples(window), error_rate)
    return f"{signal.name} {value:.3f} {signal.worse} {limit:.3f}" if shown else None


def _judge_latency(
    slo: ClassSlo, window: ClassWindow, baseline: LatencyBaseline | None, plain: float
) -> Judged:
    breaches, readings = [], {}
    for name, value, maximum, good in (
        (
            P95_TTFT,
            window.p95_ttft_seconds,
            slo.max_p95_ttft_seconds,
            baseline.p95_ttft_seconds if baseline else None,
        ),
        (
            P95_TPOT,
            window.p95_tpot_seconds,
            slo.max_p95_tpot_seconds,
            baseline.p95_tpot_seconds if baseline else None,
        ),
    ):
        if value is None:
            continue
        readings[name] = value
        relative = good * LATENCY_MARGIN if good else None
        limit = relative if maximum is None or (relative and relative < maximum) else maximum
        if limit is None or value * plain <= limit:
            continue
        without = f" ({value * plain:.3f} without speculation)" if plain != 1.0 else ""
        last_good = ""
        if baseline is not None and limit == relative:
            last_good = f"; last good {good:.3f}, n={baseline.requests:.0f}"
        samples = f"n={window.requests or 0.0:.0f}{last_good}"
        breaches.append(f"{name} {value:.3f} > {limit:.3f}{without} ({samples})")
    return Judged(breaches, readings)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def _rounded(bounds: Bounds | None) -> list[float] | None:
    return None if bounds is None else [round(bounds[0], 4), round(bounds[1], 4)]
