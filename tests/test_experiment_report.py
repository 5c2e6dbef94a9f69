"""The experiment report states its basis: where the throughput came from, what the cost's
interval covers (never a zero-width one), the price's currency, the SLOs, every exclusion's
reason, and the rule that chose the recommended arm, in the Markdown and in the picture."""

from __future__ import annotations

import re

import pytest

from specfleet.api.spec import ClassSlo
from specfleet.api.verdict import ArmName, ExperimentVerdict, Outcome
from specfleet.experiment.basis import ArmThroughput, Basis, Source, unknown
from specfleet.experiment.report import figure_of, markdown, slo_words, why
from specfleet.experiment.simulation import basis, load_experiment, run
from specfleet.experiment.verdict import cost_bounds, interval_words, judge
from test_experiment_cli import SCENARIO, SPECMODEL
from test_experiment_verdict import PRICE, SLOS, arm, arms, measured

MODEL = Basis(
    throughput={a: ArmThroughput(source=Source.MODEL) for a in ArmName},
    price_source="test",
    currency="USD",
    slos=SLOS,
)


@pytest.fixture(scope="module")
def example() -> tuple[ExperimentVerdict, Basis]:
    experiment = load_experiment(SPECMODEL, SCENARIO)
    return run(experiment), basis(experiment)


def test_no_interval_prints_zero_width(example: tuple[ExperimentVerdict, Basis]) -> None:
    """The example's cost interval was printed `0.272-0.272`: Wilson's over 7087 requests, 99.7%
    accepted, is a few ten-thousandths wide. Printed with the digits that part its bounds."""
    verdict, _ = example
    [(low, high)] = re.findall(r"95% ([0-9.]+)-([0-9.]+), accepted share only", verdict.reason)
    assert float(low) < float(high)
    assert interval_words(0.27181, 0.27224) == "95% 0.2718-0.2722, accepted share only"
    assert interval_words(0.2, 0.3) == "95% 0.200-0.300, accepted share only"
    assert interval_words(0.2, float("inf")).startswith("95% 0.200 to unbounded")
    assert interval_words(0.27, 0.27).startswith("no interval: its bounds agree")
    for row in verdict.overall:
        bounds = cost_bounds(row)
        if row.cost_per_accepted_answer is None:
            assert bounds is None
        else:
            assert bounds is not None
            assert bounds[0] < row.cost_per_accepted_answer < bounds[1]


def test_the_example_report_states_its_basis(example: tuple[ExperimentVerdict, Basis]) -> None:
    verdict, stands_on = example
    text = markdown(verdict, stands_on)
    assert "computed by the simulated fleet's model" in text and "not measured" in text
    assert "Price: 4 USD per GPU hour (four-arms.yaml, gpu_hour_price)" in text
    assert "cost per 1000 accepted (USD)" in text
    assert "Wilson's over the arm's requests, for the accepted share only" in text
    assert "speculative 0.2716-0.2723" in text
    assert "throughput's uncertainty is not in it" in text
    assert "SLOs: code p95 TPOT <= 15 ms; tools p95 TTFT <= 500 ms" in text
    assert "- baseline, code: p95 TPOT 18.0 ms over its SLO 15.0 ms (n=2116)" in text
    said = why(verdict, stands_on)
    assert said.count(".") == 1 + said.count("0.")  # one sentence (the decimals aside)
    assert "only speculative does" in said
    assert "quantized and both, though cheaper, fail tool-call validity (tools)" in said
    assert "baseline fails p95 TPOT (code, chat)" in said


def test_why_names_the_rule_in_each_case() -> None:
    cheapest = judge(arms(), SLOS, PRICE, min_samples=20)
    assert why(cheapest, MODEL).startswith("both is recommended because the rule serves the ")
    assert "it is the cheapest of those (both 0.186, speculative 0.279" in why(cheapest, MODEL)
    close = judge(arms(both=arm(ArmName.BOTH, 4.05)), SLOS, PRICE, min_samples=20)
    assert "`both`, though cheapest, must beat each single technique by 10%" in why(close, MODEL)
    few = judge(arms(), SLOS, PRICE, min_samples=5000)
    assert few.outcome == Outcome.INCONCLUSIVE
    assert why(few, MODEL).startswith("No arm is recommended: too few requests")
    slow = {
        a.arm: arm(ArmName(a.arm), a.throughput_at_slo, code=measured(tpot_p95=0.06))
        for a in arms()
    }
    none = judge(list(slow.values()), SLOS, PRICE, min_samples=20)
    assert none.outcome == Outcome.NO_ARM
    assert "none does (baseline and quantized and speculative and both fail p95 TPOT (code))" in (
        why(none, MODEL)
    )


def test_the_picture_draws_slo_lines_exclusions_and_the_basis(
    example: tuple[ExperimentVerdict, Basis],
) -> None:
    import matplotlib.pyplot as plt

    verdict, stands_on = example
    figure = figure_of(verdict, stands_on)
    try:
        texts = [t.get_text() for t in figure.findobj(lambda o: hasattr(o, "get_text"))]
        every = "\n".join(texts)
        legend = [
            t.get_text()
            for ax in figure.axes
            if ax.get_legend()
            for t in ax.get_legend().get_texts()
        ]
        dashed = [
            c for ax in figure.axes for c in ax.collections if c.get_linestyle()[0][1] is not None
        ]
    finally:
        plt.close(figure)
    assert {"SLO 15 ms", "SLO 16 ms", "SLO 500 ms", "no TTFT SLO", "no TPOT SLO"} <= set(texts)
    assert len(dashed) == 4  # code TPOT, tools TTFT, chat TTFT and TPOT
    assert "quantized: out on tool-call validity (tools)" in legend
    assert "speculative: recommended" in legend
    assert "baseline, chat: p95 TPOT 18.0 ms over its SLO 16.0 ms (n=2837)" in every
    assert "4 USD per GPU hour" in every and "simulated fleet's model" in every
    assert "speculative is recommended because the rule" in every
    assert "Recommended: speculative" in texts


def test_an_unknown_basis_says_so_rather_than_guessing(
    example: tuple[ExperimentVerdict, Basis],
) -> None:
    verdict, _ = example
    text = markdown(verdict, unknown())
    assert "Throughput at SLO (every arm's): not recorded" in text
    assert "It names no currency: costs are in the price's own units" in text
    assert "SLOs: not known here" in text


def test_the_slos_name_every_quality_bound_the_spec_sets() -> None:
    """Each signal's SLO, floor or ceiling (the truncation ceiling was left out before)."""
    slos = {"chat": ClassSlo(min_structured_output_validity=0.9, max_truncation_rate=0.05)}
    words = slo_words(MODEL.model_copy(update={"slos": slos}))
    assert words == "chat JSON validity >= 0.9, truncated answers <= 0.05"
