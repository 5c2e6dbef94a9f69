"""What one class did over one slice, sampled in aggregate (never token by token), and the
windows the guard sees, summed from slices the way Prometheus sums counter increases.

Noise: the slice's requests drafted with acceptance α + spread·z/√n (prompts differ: one
request's α varies around the class's with standard deviation `spread`); the number of decode
steps for the slice's decoded tokens has renewal noise (of them, prompt-lookup drafters verify
drafts on their match rate's share); errors, tool calls, invalid outputs and answers cut off
at max_tokens are binomial. TPOT follows from the realised steps and the step time at the
current load.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from specfleet.simulate import physics
from specfleet.simulate.draws import ClassDraw, binomial
from specfleet.simulate.world import ClassConditions, Conditions
from specfleet.telemetry.model import ClassWindow

ALPHA_SPREAD = 0.15
"""Standard deviation of one request's acceptance around its class's."""
PLAIN_TPOT_P95 = 1.1
"""p95 / mean TPOT without speculation (batch composition varies)."""


@dataclass(frozen=True)
class ClassSlice:
    requests: int = 0
    errors: int = 0
    output_tokens: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    steps: int = 0
    accepted_squares: float = 0.0
    drafted_squares: float = 0.0
    accepted_by_drafted: float = 0.0
    """The per-request sums the gateway exports (`moments`)."""
    tpot_seconds_total: float = 0.0
    """Σ over output tokens of their TPOT: mean TPOT = this / output_tokens."""
    tpot_squares: float = 0.0
    """Σ over requests of their TPOT², as the gateway exports it."""
    ttft_seconds_total: float = 0.0
    """Σ over answered requests of their TTFT."""
    ttft_squares: float = 0.0
    """Σ over answered requests of their TTFT², as the gateway exports it."""
    p95_tpot_total: float = 0.0
    p95_ttft_total: float = 0.0
    """Output-token-weighted sums of the slice's p95s."""
    tool_calls_valid: int = 0
    tool_calls_invalid: int = 0
    structured_valid: int = 0
    structured_invalid: int = 0
    choices: int = 0
    """Answers that finished: one per request that did not fail."""
    truncated: int = 0
    """Answers cut off at max_tokens (finish_reason length)."""
    valid_tokens: int = 0
    """Output tokens of requests that neither failed, answered with broken JSON nor were cut
    off, from a class served within its quality SLOs."""
    decode_seconds: float = 0.0
    """Decode time of every request, failed ones included (they have to be asked again)."""

    def __add__(self, other: ClassSlice) -> ClassSlice:
        return ClassSlice(
            *(getattr(self, f.name) + getattr(other, f.name) for f in fields(ClassSlice))
        )


def realize(
    conditions: Conditions, klass: ClassConditions, draw: ClassDraw, spread: float = ALPHA_SPREAD
) -> ClassSlice:
    n = draw.requests
    errors = binomial(n, klass.error_rate, draw.errors)
    ok = n - errors
    tools = binomial(ok, klass.tool_call_rate, draw.tool_calls)
    tools_bad = binomial(tools, 1.0 - klass.validity, draw.invalid_tool_calls)
    structured = ok if klass.structured else 0
    structured_bad = binomial(structured, 1.0 - klass.validity, draw.invalid_structured)
    truncated = binomial(ok, klass.truncation_rate, draw.truncated)
    tokens = ok * klass.output_tokens
    steps, drafted, accepted, tpot, p95 = _decode(conditions, klass, draw, ok, spread)
    return ClassSlice(
        requests=n,
        errors=errors,
        output_tokens=tokens,
        draft_tokens=drafted,
        accepted_tokens=accepted,
        steps=steps,
        **moments(ok if drafted else 0, drafted, accepted, spread),
        tpot_seconds_total=tpot * tokens,
        tpot_squares=n * _squares(tpot, p95),
        ttft_seconds_total=klass.mean_ttft_seconds * ok,
        ttft_squares=ok * _squares(klass.mean_ttft_seconds, klass.p95_ttft_seconds),
        p95_tpot_total=p95 * tokens,
        p95_ttft_total=klass.p95_ttft_seconds * tokens,
        tool_calls_valid=tools - tools_bad,
        tool_calls_invalid=tools_bad,
        structured_valid=structured - structured_bad,
        structured_invalid=structured_bad,
        choices=ok,
        truncated=truncated,
        valid_tokens=_valid(ok - tools_bad - structured_bad - truncated, klass),
        decode_seconds=tpot * n * klass.output_tokens,
    )


def _squares(mean: float, p95: float) -> float:
    """A request's expected latency², its spread read off the p95 as a normal's."""
    return mean * mean + ((p95 - mean) / physics.Z95) ** 2


def moments(requests: float, drafted: float, accepted: float, spread: float) -> dict[str, float]:
    """The sums of accepted², drafted² and accepted·drafted over requests that drafted alike
    and accepted at rates `spread` apart (a standard deviation), each accepting its drafts as
    Bernoulli draws: as expected, not drawn. What makes Σ(accepted - rate·drafted)² the
    (requests - 1) spreads² of a sample plus the draws' binomial variance."""
    if not requests:
        return {}
    each, rate = drafted / requests, accepted / drafted
    between = (requests - 1) * (each * spread) ** 2
    return {
        "accepted_squares": accepted * accepted / requests + between + accepted * (1.0 - rate),
        "drafted_squares": requests * each * each,
        "accepted_by_drafted": each * accepted,
    }


def _valid(requests: int, klass: ClassConditions) -> int:
    """Goodput tokens: none from a class served below its quality SLO."""
    return max(requests, 0) * klass.output_tokens if klass.meets_slo else 0


def _decode(
    conditions: Conditions, klass: ClassConditions, draw: ClassDraw, ok: int, spread: float
) -> tuple[int, int, int, float, float]:
    """Verify (drafting) steps, draft tokens, accepted drafts, mean and p95 TPOT of the
    slice's successful requests."""
    k, step, match = conditions.k, conditions.step_seconds, klass.match_rate
    if not k:
        return 0, 0, 0, step, p95_tpot_seconds(conditions, klass, klass.alpha, spread)
    alpha = _clamp(klass.alpha + spread * draw.alpha_noise / math.sqrt(max(ok, 1)))
    mean, variance = physics.step_moments(alpha, k, klass.decay, match)
    drafts = physics.drafts_per_step(k, match)
    decoded = ok * max(klass.output_tokens - 1, 0)
    expected = decoded / mean
    noise = draw.steps_noise * math.sqrt(decoded * variance / mean**3)
    steps = min(max(round(expected + noise), math.ceil(decoded / (1 + drafts))), decoded)
    tpot = step * steps / decoded if decoded else step / mean
    verify = round(steps * physics.drafting_share(k, match))
    p95 = p95_tpot_seconds(conditions, klass, alpha, spread)
    return verify, round(steps * drafts), decoded - steps, tpot, p95


def p95_tpot_seconds(
    conditions: Conditions, klass: ClassConditions, alpha: float, spread: float = ALPHA_SPREAD
) -> float:
    return tpot_quantile_seconds(conditions, klass, alpha, physics.Z95, spread)


def tpot_quantile_seconds(
    conditions: Conditions,
    klass: ClassConditions,
    alpha: float,
    z: float,
    spread: float = ALPHA_SPREAD,
) -> float:
    """TPOT at the standard normal quantile z of a class whose requests draft at `alpha` on
    average: those requests accept at α less z spreads; without speculation, batch composition
    alone (normal, PLAIN_TPOT_P95 at the p95)."""
    k, step = conditions.k, conditions.step_seconds
    if not k:
        return step * (1.0 + (PLAIN_TPOT_P95 - 1.0) * z / physics.Z95)
    slow = _clamp(alpha - z * spread)
    return step / physics.tokens_per_step(slow, k, klass.decay, klass.match_rate)


def _clamp(alpha: float) -> float:
    return min(max(alpha, 0.0), 1.0)


def window(slices: list[ClassSlice], speculation: bool, tool_calls: bool) -> ClassWindow:
    """The class's counters summed over a window's slices, as telemetry would report them."""
    total = sum(slices, ClassSlice())
    tokens, answered = total.output_tokens, total.choices

    def per_token(value: float) -> float | None:
        return value / tokens if tokens else None

    return ClassWindow(
        requests=float(total.requests),
        errors=float(total.errors),
        draft_tokens=float(total.draft_tokens) if speculation else None,
        accepted_tokens=float(total.accepted_tokens) if speculation else None,
        steps=float(total.steps) if speculation else None,
        spec_requests=float(total.choices) if speculation and total.draft_tokens else None,
        accepted_squares=total.accepted_squares if speculation else None,
        drafted_squares=total.drafted_squares if speculation else None,
        accepted_by_drafted=total.accepted_by_drafted if speculation else None,
        output_tokens=float(tokens),
        request_seconds=total.decode_seconds,
        p95_ttft_seconds=per_token(total.p95_ttft_total),
        p95_tpot_seconds=per_token(total.p95_tpot_total),
        mean_tpot_seconds=per_token(total.tpot_seconds_total),
        tpot_samples=float(total.requests),
        tpot_squares=total.tpot_squares,
        mean_ttft_seconds=total.ttft_seconds_total / answered if answered else None,
        ttft_samples=float(answered),
        ttft_squares=total.ttft_squares,
        tool_calls_valid=float(total.tool_calls_valid) if tool_calls else None,
        tool_calls_invalid=float(total.tool_calls_invalid) if tool_calls else None,
        structured_valid=float(total.structured_valid),
        structured_invalid=float(total.structured_invalid),
        choices=float(total.choices),
        truncated=float(total.truncated),
    )
