"""Each arm is its own workload: the SpecModel's spec with the arm's overlay, rendered by
`render`, owned by the experiment, and matched by none of the fleet's selectors."""

from __future__ import annotations

from typing import Any

import pytest

from conftest import experiment_doc, specmodel_doc
from specfleet.api import SpecModel, parse_specmodel
from specfleet.api.experiment import SpecExperiment
from specfleet.api.validation import parse_specexperiment
from specfleet.api.verdict import ArmName
from specfleet.experiment.workloads import InvalidArms, render_arms
from specfleet.render import render

FOUR_ARMS_SPEC: dict[str, Any] = {
    "quantization": {"weights": "fp8", "online": True},
    "speculative": {"method": "ngram", "numSpeculativeTokens": 4},
    "model": {"servedName": "llama"},
    "pod": {"replicas": 3},
    "monitoring": {"serviceMonitor": True},
    "rollout": {"strategy": "canary"},
}


def four_arms(**spec: Any) -> tuple[SpecModel, SpecExperiment]:
    specmodel = parse_specmodel(specmodel_doc(**{**FOUR_ARMS_SPEC, **spec}))
    return specmodel, parse_specexperiment(experiment_doc())


def by_kind(manifests: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [m for m in manifests if m["kind"] == kind]


def fleet_selectors(specmodel: SpecModel) -> list[dict[str, str]]:
    """Every selector of the fleet's objects that picks pods (or, the ServiceMonitor's, the
    Services of those pods)."""
    out = []
    for manifest in render(specmodel):
        if manifest["kind"] == "Service":
            out.append(manifest["spec"]["selector"])
        elif manifest["kind"] != "ConfigMap":
            out.append(manifest["spec"]["selector"]["matchLabels"])
    return out


def test_no_fleet_selector_matches_an_arm_pod_or_service() -> None:
    specmodel, experiment = four_arms()
    selectors = fleet_selectors(specmodel)
    kinds = {m["kind"] for m in render(specmodel)}
    assert {"Deployment", "Service", "PodDisruptionBudget", "ServiceMonitor"} <= kinds
    arms = render_arms(specmodel, experiment)
    labelled = [d["spec"]["template"]["metadata"]["labels"] for d in by_kind(arms, "Deployment")]
    labelled += [s["metadata"]["labels"] for s in by_kind(arms, "Service")]
    assert len(labelled) == 8
    for labels in labelled:
        for selector in selectors:
            assert not selector.items() <= labels.items(), (selector, labels)


def test_each_arm_selects_its_own_pods_only() -> None:
    arms = render_arms(*four_arms())
    for deployment, service in zip(
        by_kind(arms, "Deployment"), by_kind(arms, "Service"), strict=True
    ):
        selector = deployment["spec"]["selector"]["matchLabels"]
        assert service["spec"]["selector"] == selector
        arm = selector["specfleet.dev/arm"]
        assert selector == {
            "app.kubernetes.io/name": "specfleet-engine-arm",
            "specfleet.dev/experiment": "x",
            "specfleet.dev/arm": arm,
        }
        assert deployment["metadata"]["name"] == service["metadata"]["name"] == f"x-{arm}"


def test_arms_are_owned_by_the_experiment_and_run_its_replicas() -> None:
    specmodel, experiment = four_arms()
    experiment.spec.replicas = 2
    for manifest in render_arms(specmodel, experiment):
        [owner] = manifest["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["uid"]) == ("SpecExperiment", "x", "uid-x")
        assert "app.kubernetes.io/instance" not in manifest["metadata"]["labels"]
        if manifest["kind"] == "Deployment":
            assert manifest["spec"]["replicas"] == 2
    kinds = {m["kind"] for m in render_arms(specmodel, experiment)}
    assert kinds == {"Deployment", "ConfigMap", "Service", "ServiceMonitor", "PodMonitor"}


def test_each_arms_monitors_select_its_pods_alone_and_label_its_series_with_the_arm() -> None:
    manifests = render_arms(*four_arms())
    for kind, endpoints in (("ServiceMonitor", "endpoints"), ("PodMonitor", "podMetricsEndpoints")):
        monitors = {m["metadata"]["name"]: m["spec"] for m in by_kind(manifests, kind)}
        assert set(monitors) == {f"x-{arm}" for arm in ArmName}
        selector = monitors["x-both"]["selector"]["matchLabels"]
        assert selector["specfleet.dev/arm"] == "both"
        assert selector["specfleet.dev/experiment"] == "x"
        [endpoint] = monitors["x-both"][endpoints]
        targets = {r["targetLabel"]: r["sourceLabels"] for r in endpoint["relabelings"]}
        assert targets["experiment"] == ["__meta_kubernetes_pod_label_specfleet_dev_experiment"]
        assert targets["arm"] == ["__meta_kubernetes_pod_label_specfleet_dev_arm"]


def engine_args(manifests: list[dict[str, Any]], arm: ArmName) -> list[str]:
    [deployment] = [
        m for m in by_kind(manifests, "Deployment") if m["metadata"]["name"].endswith(arm)
    ]
    [engine] = [
        c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "engine"
    ]
    return list(engine["args"])


def test_each_arm_serves_its_overlay_under_the_served_name() -> None:
    arms = render_arms(*four_arms())
    flags = {arm: " ".join(engine_args(arms, arm)) for arm in ArmName}
    assert "--quantization fp8" in flags[ArmName.BOTH] and "ngram" in flags[ArmName.BOTH]
    assert "--quantization" in flags[ArmName.QUANTIZED] and "ngram" not in flags["quantized"]
    assert "--quantization" not in flags[ArmName.SPECULATIVE] and "ngram" in flags["speculative"]
    assert "--quantization" not in flags[ArmName.BASELINE] and "ngram" not in flags["baseline"]
    assert all("--served-model-name llama" in f for f in flags.values())


def test_a_prequantized_checkpoint_needs_the_unquantized_source_once() -> None:
    specmodel, experiment = four_arms(
        quantization={"weights": "awq"}, model={"source": "org/model-awq"}
    )
    with pytest.raises(InvalidArms) as raised:
        render_arms(specmodel, experiment)
    assert {e.path for e in raised.value.errors} == {"spec.unquantizedSource"}
    experiment.spec.unquantized_source = "org/model"
    arms = render_arms(specmodel, experiment)
    assert "org/model-awq" in engine_args(arms, ArmName.QUANTIZED)
    assert "org/model" in engine_args(arms, ArmName.BASELINE)


def test_the_four_arms_need_speculation_and_quantization_in_the_specmodel() -> None:
    specmodel = parse_specmodel(specmodel_doc())
    with pytest.raises(InvalidArms) as raised:
        render_arms(specmodel, parse_specexperiment(experiment_doc()))
    paths = {e.path for e in raised.value.errors}
    assert paths == {"specmodels/m: spec.speculative", "specmodels/m: spec.quantization"}
