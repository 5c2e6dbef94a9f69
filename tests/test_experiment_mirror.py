"""While an experiment runs, the fleet's gateways mirror a sample of each class to its arms: the
mirror is rendered into the fleet's gateway config (never a canary's), and only then."""

from __future__ import annotations

from typing import Any, cast

import yaml

from conftest import experiment_doc
from specfleet.api import parse_specmodel
from specfleet.api.experiment import SpecExperiment
from specfleet.api.validation import parse_specexperiment
from specfleet.controller.kube import Kube
from specfleet.controller.operator import Operator
from specfleet.experiment.mirror import mirror_of
from specfleet.render import render
from specfleet.render.plan import ServingPlan
from test_experiment_controller import T0, StatusKube, specmodel_body

RUNNING = {"status": {"phase": "Running"}}


def experiment(name: str = "x", phase: str = "Running", **spec: Any) -> SpecExperiment:
    doc = experiment_doc(**spec)
    doc["metadata"]["name"] = name
    return parse_specexperiment({**doc, "status": {"phase": phase}})


def test_a_running_experiment_mirrors_each_class_to_every_arms_service() -> None:
    specmodel = parse_specmodel(specmodel_body())
    mirror = mirror_of([experiment(sample={"share": 0.1, "classes": {"code": 0.5}})], specmodel)
    assert mirror is not None and mirror.experiment == "x" and mirror.baseline == "baseline"
    assert [(a.name, a.url) for a in mirror.arms] == [
        (arm, f"http://x-{arm}.ns.svc:80")
        for arm in ("baseline", "quantized", "speculative", "both")
    ]
    assert mirror.sample == {
        c.name: (0.5 if c.name == "code" else 0.1) for c in specmodel.spec.classes
    }


def test_nothing_is_mirrored_before_the_arms_run_or_for_another_specmodel() -> None:
    specmodel = parse_specmodel(specmodel_body())
    assert mirror_of([], specmodel) is None
    assert (
        mirror_of([experiment(phase="Pending"), experiment(phase="Concluded")], specmodel) is None
    )
    assert mirror_of([experiment(specModelRef={"name": "other"})], specmodel) is None
    # two at once: one, the same on every reconcile
    mirror = mirror_of([experiment("y"), experiment("b")], specmodel)
    assert mirror is not None and mirror.experiment == "b"


def gateway_configs(manifests: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {
        m["metadata"]["name"]: yaml.safe_load(m["data"]["gateway.yaml"])
        for m in manifests
        if m["kind"] == "ConfigMap" and m["metadata"]["name"].endswith("-gateway")
    }


def test_only_the_fleets_gateway_config_mirrors_never_a_canarys() -> None:
    specmodel = parse_specmodel(specmodel_body())
    mirror = mirror_of([experiment()], specmodel)
    configs = gateway_configs(render(specmodel, ServingPlan(canary=True, mirror=mirror)))
    assert set(configs) == {"m-gateway", "m-canary-gateway"}
    assert configs["m-gateway"]["mirror"]["experiment"] == "x"
    assert configs["m-canary-gateway"].get("mirror") is None


def test_the_operator_renders_the_mirror_while_the_experiment_runs_and_drops_it_after() -> None:
    kube = StatusKube()
    operator = Operator(cast(Kube, kube), clock=lambda: T0)
    specmodels = {("ns", "m"): [specmodel_body()]}
    running = {("ns", "x"): [{**experiment_doc(), **RUNNING}]}
    operator.reconcile(("ns", "m"), specmodels, [], {}, experiments=running)
    assert gateway_configs(kube.applied)["m-gateway"]["mirror"]["arms"][0]["name"] == "baseline"
    kube.applied.clear()
    operator.reconcile(("ns", "m"), specmodels, [], {}, experiments={})
    assert gateway_configs(kube.applied)["m-gateway"].get("mirror") is None
