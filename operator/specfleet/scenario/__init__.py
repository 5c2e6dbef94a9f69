"""The scenario file: how a simulated fleet behaves over time.

Shared by `specfleet-testbed engine` (per-request acceptance, output lengths, tool
calls), the e2e traffic generator (`traffic_rps`, class `share`) and the offline
`specfleet simulate` (everything); it lives in the product because the product
cannot import the testbed. Times are seconds from the scenario's start;
a *schedule* is piecewise constant: `[[t0, v0], [t1, v1], ...]` means `v0` from
`t0`, `v1` from `t1`, ... (the first value also holds before `t0`). A bare
number is shorthand for `[[0, number]]`.

```yaml
duration_s: 1800
seed: 7                         # optional, default 0
traffic_rps: [[0, 8]]
classes:                        # order matters: the first class is the fallback
  code: {share: 0.5, acceptance: [[0, 0.80], [600, 0.20]], output_tokens: 256}
  chat: {share: 0.5, acceptance: [[0, 0.60]], output_tokens: 400, tool_call_rate: 0.3}
rollouts:
  - t: 300
    spec: {quantization: {method: awq}}
    match_args: ["--quantization awq"]       # optional, see `Rollout`
    effects: {tool_call_validity: 0.90, tpot_factor: 0.8, truncation_rate: {chat: 0.3}}
timing: {target_forward_ms: 15}  # optional, see specfleet.scenario.timing
prometheus_down: [[600, 900]]    # optional: [from, until) Prometheus answers nothing
```

`load_scenario(path)` raises `ScenarioError` whose message names the offending
field (`classes.code.acceptance[1]: ...`).
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Annotated, Any, TypeVar

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

__all__ = [
    "DEFAULT_DRAFT_MATCH_RATE",
    "ClassProfile",
    "Effects",
    "Rollout",
    "Scenario",
    "ScenarioError",
    "Schedule",
    "TimingOverrides",
    "load_scenario",
    "load_scenario_as",
    "parse_scenario",
    "parse_scenario_as",
]


# Prompt lookup drafts on a minority of steps in ordinary chat; repetitive classes
# (code edits, extraction) set their own rate.
DEFAULT_DRAFT_MATCH_RATE = 0.3


class ScenarioError(ValueError):
    """An invalid scenario; the message starts with the field path."""


def _coerce_schedule(value: Any) -> Any:
    if isinstance(value, bool):
        return value  # let validation reject it
    if isinstance(value, int | float):
        return [[0, value]]
    return value


class Schedule(BaseModel):
    """A piecewise-constant value over time: `points` are `(t, value)`, t ascending."""

    model_config = ConfigDict(frozen=True)

    points: tuple[tuple[float, float], ...]

    @model_validator(mode="before")
    @classmethod
    def _from_list(cls, data: Any) -> Any:
        data = _coerce_schedule(data)
        if isinstance(data, Schedule | dict):
            return data
        if not isinstance(data, list | tuple):
            raise ValueError("expected a number or a list of [t, value] pairs")
        for i, point in enumerate(data):
            ok = isinstance(point, list | tuple) and len(point) == 2
            if not ok or any(isinstance(x, bool) or not isinstance(x, int | float) for x in point):
                raise ValueError(f"[{i}]: expected a [t, value] pair of numbers, got {point!r}")
        return {"points": data}

    @field_validator("points")
    @classmethod
    def _ordered(cls, points: tuple[tuple[float, float], ...]) -> tuple[tuple[float, float], ...]:
        if not points:
            raise ValueError("a schedule needs at least one [t, value] point")
        for i, (t, _) in enumerate(points):
            if t < 0:
                raise ValueError(f"[{i}]: t must be >= 0, got {t}")
            if i and t <= points[i - 1][0]:
                raise ValueError(
                    f"[{i}]: t must be strictly ascending ({points[i - 1][0]} then {t})"
                )
        return points

    def at(self, t: float) -> float:
        """The value in force at time `t` (the first value before the first point)."""
        times = [p[0] for p in self.points]
        i = bisect.bisect_right(times, t) - 1
        return self.points[max(i, 0)][1]

    def values(self) -> list[float]:
        return [v for _, v in self.points]


ScheduleField = Annotated[Schedule, BeforeValidator(_coerce_schedule)]
Share = Annotated[float, Field(ge=0.0, le=1.0)]


def _check_range(schedule: Schedule, lo: float, hi: float | None, what: str) -> Schedule:
    for i, v in enumerate(schedule.values()):
        if v < lo or (hi is not None and v > hi):
            bound = f"[{lo}, {hi}]" if hi is not None else f">= {lo}"
            raise ValueError(f"[{i}]: {what} must be {bound}, got {v}")
    return schedule


class ClassProfile(BaseModel):
    """One prompt class: its traffic share and how the engine behaves on it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    share: float = Field(ge=0.0, le=1.0, description="fraction of traffic (traffic generator)")
    acceptance: ScheduleField = Field(description="per-draft-token acceptance probability alpha")
    output_tokens: ScheduleField = Field(
        default_factory=lambda: Schedule(points=((0.0, 128.0),)),
        description="natural answer length in tokens (finish_reason stop)",
    )
    prompt_tokens: int = Field(default=200, ge=1, description="prompt length (traffic generator)")
    tool_call_rate: float = Field(
        default=0.0, ge=0.0, le=1.0, description="P(answer is a tool call | request offers tools)"
    )
    tool_call_validity: float = Field(
        default=1.0, ge=0.0, le=1.0, description="P(a tool call / JSON answer is valid)"
    )
    truncation_rate: float = Field(
        default=0.0,
        ge=0.0,
        le=1.0,
        description="P(an answer is cut off at max_tokens: finish_reason length)",
    )
    position_decay: float = Field(
        default=1.0,
        gt=0.0,
        le=1.0,
        description="draft position j is accepted with alpha·decay^j (1.0 = i.i.d.)",
    )
    draft_match_rate: float = Field(
        default=DEFAULT_DRAFT_MATCH_RATE,
        ge=0.0,
        le=1.0,
        description="n-gram / suffix drafters: P(a decode step finds a match and drafts)",
    )

    @field_validator("acceptance")
    @classmethod
    def _acceptance_range(cls, v: Schedule) -> Schedule:
        return _check_range(v, 0.0, 1.0, "acceptance")

    @field_validator("output_tokens")
    @classmethod
    def _output_range(cls, v: Schedule) -> Schedule:
        return _check_range(v, 1.0, None, "output_tokens")


class Effects(BaseModel):
    """How a revision changes behaviour (applied process-wide by the simulator)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tool_call_validity: float | None = Field(
        default=None, ge=0.0, le=1.0, description="replaces every class's tool_call_validity"
    )
    truncation_rate: dict[str, Share] = Field(
        default_factory=dict, description="replaces the named classes' truncation_rate"
    )
    tpot_factor: float = Field(default=1.0, gt=0.0, description="multiplies decode step time")
    ttft_factor: float = Field(default=1.0, gt=0.0, description="multiplies prefill time")
    acceptance_factor: float = Field(default=1.0, ge=0.0, description="multiplies every alpha")
    error_rate: float = Field(
        default=0.0, ge=0.0, le=1.0, description="fraction of requests answered with HTTP 500"
    )

    def merged(self, other: Effects) -> Effects:
        """`other`'s explicitly set fields override ours."""
        data = self.model_dump()
        data.update(other.model_dump(exclude_unset=True))
        return Effects(**data)


class Rollout(BaseModel):
    """A spec change at time `t` and how the fleet behaves under it.

    How a simulator process knows it *is* this revision: when `match_args` is
    given, the effects apply iff every string in it occurs in the engine's own
    command line (args joined by single spaces, plus for TensorRT-LLM the text
    of the `--extra_llm_api_options` YAML), regardless of time; a rollback
    restarts the pod with the old args, which no longer match. Without
    `match_args` the effects apply to every process from scenario time `t` on.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    t: float = Field(ge=0.0)
    spec: dict[str, Any] = Field(default_factory=dict, description="SpecModel spec patch")
    effects: Effects = Field(default_factory=Effects)
    match_args: tuple[str, ...] | None = None

    @field_validator("match_args")
    @classmethod
    def _non_empty(cls, v: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if v is not None and (not v or any(not s for s in v)):
            raise ValueError("match_args must be a non-empty list of non-empty strings")
        return v


class TimingOverrides(BaseModel):
    """Optional overrides of `specfleet.scenario.timing.TimingModel` defaults."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    target_forward_ms: float | None = Field(default=None, gt=0.0)
    per_token_compute: float | None = Field(default=None, ge=0.0)
    prefill_ms_per_token: float | None = Field(default=None, ge=0.0)
    draft_cost: dict[str, float] = Field(default_factory=dict)
    step_overhead: float | None = Field(default=None, ge=0.0, le=1.0)

    @field_validator("draft_cost")
    @classmethod
    def _costs(cls, v: dict[str, float]) -> dict[str, float]:
        for method, c in v.items():
            if c < 0:
                raise ValueError(f"{method}: draft cost must be >= 0, got {c}")
        return v


class Scenario(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    duration_s: float = Field(gt=0.0)
    seed: int = 0
    traffic_rps: ScheduleField
    classes: dict[str, ClassProfile]
    rollouts: tuple[Rollout, ...] = ()
    timing: TimingOverrides = Field(default_factory=TimingOverrides)
    prometheus_down: tuple[tuple[float, float], ...] = Field(
        default=(),
        description="[from, until) stretches in which Prometheus neither scrapes nor answers "
        "(`specfleet simulate`: the guard's telemetry is blind; the fleet serves on)",
    )

    @field_validator("traffic_rps")
    @classmethod
    def _rps(cls, v: Schedule) -> Schedule:
        return _check_range(v, 0.0, None, "traffic_rps")

    @field_validator("classes")
    @classmethod
    def _classes(cls, v: dict[str, ClassProfile]) -> dict[str, ClassProfile]:
        if not v:
            raise ValueError("at least one class is required")
        total = sum(c.share for c in v.values())
        if abs(total - 1.0) > 0.01:
            raise ValueError(f"shares must sum to 1 (±0.01), got {total:g}")
        return v

    @field_validator("rollouts")
    @classmethod
    def _rollouts(cls, v: tuple[Rollout, ...]) -> tuple[Rollout, ...]:
        for i in range(1, len(v)):
            if v[i].t < v[i - 1].t:
                raise ValueError(f"[{i}]: rollouts must be ordered by t")
        return v

    @field_validator("prometheus_down")
    @classmethod
    def _outages(cls, v: tuple[tuple[float, float], ...]) -> tuple[tuple[float, float], ...]:
        for i, (down, up) in enumerate(v):
            if not 0 <= down < up:
                raise ValueError(f"[{i}]: expected 0 <= from < until, got [{down}, {up}]")
            if i and down < v[i - 1][1]:
                raise ValueError(f"[{i}]: outages must be ordered and apart")
        return v

    # -- queries shared by the server, the traffic generator and `simulate` --

    @property
    def default_class(self) -> str:
        return next(iter(self.classes))

    def resolve_class(self, name: str | None) -> str:
        """The class named `name` if the scenario has it, else the first class."""
        return name if name in self.classes else self.default_class

    def acceptance(self, cls: str, t: float) -> float:
        return self.classes[self.resolve_class(cls)].acceptance.at(t)

    def output_tokens(self, cls: str, t: float) -> int:
        return max(1, round(self.classes[self.resolve_class(cls)].output_tokens.at(t)))

    def rps(self, t: float) -> float:
        return self.traffic_rps.at(t)

    def prometheus_since(self, t: float) -> float | None:
        """Since when Prometheus has scraped without a break at `t` (0: from the start); None
        while it is down."""
        since = 0.0
        for down, up in self.prometheus_down:
            if down <= t < up:
                return None
            if up <= t:
                since = up
        return since

    def sample_class(self, rng: random.Random) -> str:
        names = list(self.classes)
        return rng.choices(names, weights=[self.classes[n].share for n in names])[0]

    def arrivals(
        self, rng: random.Random, start: float = 0.0, end: float | None = None
    ) -> Iterator[tuple[float, str]]:
        """Request arrivals `(t, class)` in `[start, end)`: a Poisson process whose
        rate follows `traffic_rps`, classes drawn by `share` (traffic generator)."""
        end = self.duration_s if end is None else end
        bounds = [t for t, _ in self.traffic_rps.points if start < t < end] + [end]
        t = start
        for bound in bounds:
            rate = self.rps(t)
            while rate > 0:
                t += rng.expovariate(rate)
                if t >= bound:
                    break
                yield t, self.sample_class(rng)
            t = bound

    def effects_for(self, engine_args: Sequence[str], config_text: str, t: float) -> Effects:
        """Effects in force for a process with these args at scenario time `t`."""
        haystack = " ".join(engine_args) + "\n" + config_text
        effects = Effects()
        for rollout in self.rollouts:
            if rollout.match_args is not None:
                applies = all(s in haystack for s in rollout.match_args)
            else:
                applies = t >= rollout.t
            if applies:
                effects = effects.merged(rollout.effects)
        return effects


S = TypeVar("S", bound=Scenario)


def _loc(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if part in ("points", "function-before[_coerce_schedule(), Schedule]"):
            continue
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "<root>"


def _format(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        msg = e["msg"].removeprefix("Value error, ")
        where = _loc(tuple(e["loc"]))
        if msg.startswith("["):  # our own "[i]: ..." messages refine the location
            idx, _, rest = msg.partition(": ")
            lines.append(f"{where}{idx}: {rest}")
        else:
            lines.append(f"{where}: {msg}")
    return "; ".join(lines)


def parse_scenario(data: Any) -> Scenario:
    """Validate an already-loaded mapping; raises `ScenarioError`."""
    return parse_scenario_as(data, Scenario)


def parse_scenario_as(data: Any, model: type[S]) -> S:
    """Validate a mapping as `model`, a Scenario or one that extends it (an experiment's)."""
    if not isinstance(data, dict):
        raise ScenarioError("<root>: a scenario must be a mapping")
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise ScenarioError(_format(err)) from None


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario YAML (or JSON) file; raises `ScenarioError`."""
    return load_scenario_as(path, Scenario)


def load_scenario_as(path: str | Path, model: type[S]) -> S:
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as err:
        raise ScenarioError(f"{path}: {err}") from None
    return parse_scenario_as(data, model)
