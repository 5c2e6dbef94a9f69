"""The scenario model: schedules, field-named errors, effects by args or time."""

from __future__ import annotations

import copy
import random
from pathlib import Path
from typing import Any

import pytest

from specfleet.scenario import ScenarioError, load_scenario, parse_scenario

BASE: dict[str, Any] = {
    "duration_s": 1800,
    "traffic_rps": [[0, 8], [900, 2]],
    "classes": {
        "code": {"share": 0.5, "acceptance": [[0, 0.80], [600, 0.20]], "output_tokens": 256},
        "chat": {
            "share": 0.5,
            "acceptance": [[0, 0.60]],
            "output_tokens": 400,
            "tool_call_rate": 0.3,
        },
    },
    "rollouts": [
        {
            "t": 300,
            "spec": {"quantization": {"method": "awq"}},
            "effects": {"tool_call_validity": 0.90, "tpot_factor": 0.8},
        },
    ],
}


def test_design_card_example_parses_and_schedules_are_piecewise_constant(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(
        """
duration_s: 1800
traffic_rps: [[0, 8]]
classes:
  code: {share: 0.5, acceptance: [[0, 0.80], [600, 0.20]], output_tokens: 256}
  chat: {share: 0.5, acceptance: [[0, 0.60]], output_tokens: 400, tool_call_rate: 0.3}
rollouts:
  - t: 300
    spec: {quantization: {method: awq}}
    effects: {tool_call_validity: 0.90, tpot_factor: 0.8}
"""
    )
    s = load_scenario(path)
    assert s.default_class == "code"
    assert [s.acceptance("code", t) for t in (0, 599.9, 600, 10_000)] == [0.8, 0.8, 0.2, 0.2]
    assert s.output_tokens("chat", 5) == 400
    assert s.classes["chat"].tool_call_rate == 0.3
    assert s.rps(100) == 8


def test_scalar_shorthand_and_class_fallback() -> None:
    s = parse_scenario(
        {"duration_s": 10, "traffic_rps": 3, "classes": {"only": {"share": 1.0, "acceptance": 0.5}}}
    )
    assert s.rps(7) == 3 and s.acceptance("only", 9) == 0.5
    assert s.resolve_class("unknown") == "only" and s.resolve_class(None) == "only"
    assert s.output_tokens("only", 0) == 128  # documented default


def test_sample_class_follows_shares() -> None:
    s = parse_scenario(BASE)
    rng = random.Random(1)
    draws = [s.sample_class(rng) for _ in range(4000)]
    assert abs(draws.count("code") / len(draws) - 0.5) < 0.03


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (
            lambda d: d["classes"]["code"].update(acceptance=[[0, 0.8], [0, 0.2]]),
            "classes.code.acceptance[1]: t must be strictly ascending",
        ),
        (
            lambda d: d["classes"]["code"].update(acceptance=[[0, 1.5]]),
            "classes.code.acceptance[0]: acceptance must be [0.0, 1.0]",
        ),
        (
            lambda d: d["classes"]["code"].update(acceptance=[[0]]),
            "classes.code.acceptance[0]: expected a [t, value] pair",
        ),
        (lambda d: d["classes"]["chat"].update(share=0.9), "classes: shares must sum to 1"),
        (lambda d: d["classes"]["chat"].update(tool_call_rate=2), "classes.chat.tool_call_rate"),
        (lambda d: d["classes"]["chat"].update(colour="red"), "classes.chat.colour"),
        (lambda d: d.update(traffic_rps="lots"), "traffic_rps: expected a number or a list"),
        (lambda d: d.update(classes={}), "classes: at least one class"),
        (
            lambda d: d["rollouts"][0]["effects"].update(tpot_factor=0),
            "rollouts[0].effects.tpot_factor",
        ),
        (lambda d: d["rollouts"][0].update(match_args=[]), "rollouts[0].match_args"),
        (lambda d: d.pop("duration_s"), "duration_s: Field required"),
        (
            lambda d: d.update(prometheus_down=[[600, 300]]),
            "prometheus_down[0]: expected 0 <= from < until",
        ),
        (
            lambda d: d.update(prometheus_down=[[300, 600], [500, 900]]),
            "prometheus_down[1]: outages must be ordered and apart",
        ),
    ],
)
def test_errors_name_the_field(mutate: Any, message: str) -> None:
    data = copy.deepcopy(BASE)
    mutate(data)
    with pytest.raises(ScenarioError) as err:
        parse_scenario(data)
    assert message in str(err.value)


def test_prometheus_is_down_from_until_and_scrapes_again_from_then() -> None:
    s = parse_scenario({**BASE, "prometheus_down": [[300, 600], [900, 1000]]})
    assert [s.prometheus_since(t) for t in (0, 299, 300, 599, 600, 899, 950, 1200)] == [
        *(0.0, 0.0, None, None, 600.0, 600.0, None, 1000.0)
    ]
    assert parse_scenario(BASE).prometheus_since(1200) == 0.0


def test_unreadable_file_is_a_scenario_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("classes: [unclosed\n")
    with pytest.raises(ScenarioError, match=r"bad\.yaml"):
        load_scenario(bad)
    with pytest.raises(ScenarioError, match="<root>"):
        parse_scenario(["not", "a", "mapping"])


def test_effects_by_time_without_match_args() -> None:
    s = parse_scenario(BASE)
    assert s.effects_for([], "", 299).tpot_factor == 1.0
    after = s.effects_for([], "", 300)
    assert after.tpot_factor == 0.8 and after.tool_call_validity == 0.9


def test_effects_by_matching_the_engine_args_regardless_of_time() -> None:
    data = copy.deepcopy(BASE)
    data["rollouts"][0]["match_args"] = ["--quantization awq"]
    data["rollouts"].append(
        {"t": 900, "match_args": ["max_draft_len: 6"], "effects": {"acceptance_factor": 0.5}}
    )
    s = parse_scenario(data)
    bad = ["m", "--quantization", "awq", "--port", "8000"]
    good = ["m", "--port", "8000"]
    assert s.effects_for(bad, "", 0).tool_call_validity == 0.9
    assert s.effects_for(good, "", 10_000).tool_call_validity is None
    # TensorRT-LLM: the YAML text is part of what is matched
    yaml_text = "speculative_config:\n  decoding_type: Eagle\n  max_draft_len: 6\n"
    assert s.effects_for(["m"], yaml_text, 0).acceptance_factor == 0.5
    # later rollouts override earlier ones field by field
    both = s.effects_for(bad, yaml_text, 0)
    assert (both.tool_call_validity, both.acceptance_factor, both.tpot_factor) == (0.9, 0.5, 0.8)


def test_arrivals_follow_the_rate_schedule() -> None:
    s = parse_scenario(BASE)  # 8 rps until t=900, then 2 rps
    arrivals = list(s.arrivals(random.Random(3)))
    times = [t for t, _ in arrivals]
    assert times == sorted(times) and times[0] >= 0 and times[-1] < 1800
    early = sum(1 for t in times if t < 900) / 900
    late = sum(1 for t in times if t >= 900) / 900
    assert abs(early - 8) < 0.5 and abs(late - 2) < 0.3
    assert {c for _, c in arrivals} == {"code", "chat"}
    window = list(s.arrivals(random.Random(3), start=100, end=110))
    assert all(100 <= t < 110 for t, _ in window)


def test_the_shipped_example_scenario_parses() -> None:
    from importlib import resources

    path = resources.files("specfleet.scenario").joinpath("example.yaml")
    s = load_scenario(str(path))
    assert s.classes["chat"].position_decay == 0.9
    assert s.effects_for(["m", "--quantization", "awq"], "", 0).tpot_factor == 0.8
    assert s.effects_for(["m"], "", 1000).tpot_factor == 1.0
