"""Golden files: the exact manifests for a matrix of engines, quantizations and speculative
methods, with speculation on and off. Reviewed by eye once; they catch accidental change.
After a deliberate renderer change: `make golden`, then review the diff."""

from __future__ import annotations

import os
from typing import Any

import pytest

from conftest import ROOT, experiment_doc, specmodel_doc
from specfleet.api import parse_specmodel
from specfleet.api.validation import parse_specexperiment
from specfleet.experiment.workloads import render_arms
from specfleet.render import PlainPool, ServingPlan, render
from specfleet.render.plan import RolloutCanary
from specfleet.yamlio import dump_all

GOLDEN = ROOT / "tests/golden"
UPDATE = os.environ.get("SPECFLEET_UPDATE_GOLDEN") == "1"

METHODS: dict[str, dict[str, Any]] = {
    "eagle3": {"method": "eagle3", "draftModel": "org/eagle3-head", "numSpeculativeTokens": 4},
    "eagle": {"method": "eagle", "draftModel": "org/eagle-head", "numSpeculativeTokens": 3},
    "draft_model": {
        "method": "draft_model",
        "draftModel": "org/draft-1b",
        "numSpeculativeTokens": 5,
    },
    "ngram": {
        "method": "ngram",
        "numSpeculativeTokens": 4,
        "ngram": {"minMatch": 2, "maxMatch": 4},
    },
    "mtp": {"method": "mtp", "numSpeculativeTokens": 1},
    "suffix": {"method": "suffix", "numSpeculativeTokens": 8},
}
SUFFIX_IMAGE = {"image": "ghcr.io/specfleet/vllm:0.33.0"}
"""images/vllm: vLLM's own image lacks arctic-inference, which the suffix method needs."""
ENGINE_METHODS = {
    "vllm": ["eagle3", "eagle", "draft_model", "ngram", "mtp", "suffix"],
    "tensorrt-llm": ["eagle3", "draft_model", "ngram", "mtp"],
}
QUANTIZATIONS: dict[str, dict[str, Any]] = {
    "bf16": {},
    "fp8": {"weights": "fp8", "kvCacheDtype": "fp8", "preQuantized": True},
    "awq": {"weights": "awq", "preQuantized": True},
    "nvfp4": {"weights": "nvfp4", "kvCacheDtype": "fp8", "preQuantized": True},
}


def cases() -> list[tuple[str, dict[str, Any], ServingPlan]]:
    """(name, spec, plan): every method on bf16 with speculation on and off, every quantization
    with the engine's first method, a trial's canary beside two replicas and a canary rollout's
    step per engine."""
    out = []
    for engine, methods in ENGINE_METHODS.items():
        for method in methods:
            for speculation in (True, False):
                image = SUFFIX_IMAGE if method == "suffix" else {}
                spec = {"engine": {"name": engine, **image}, "speculative": METHODS[method]}
                name = f"{engine}-bf16-{method}-{'on' if speculation else 'off'}"
                out.append((name, spec, ServingPlan(speculation=speculation)))
        trial = {
            "engine": {"name": engine},
            "speculative": METHODS[methods[0]],
            "pod": {"replicas": 2},
        }
        out.append(
            (
                f"{engine}-bf16-{methods[0]}-canary",
                trial,
                ServingPlan(speculation=False, canary=True),
            )
        )
        out.append((f"{engine}-bf16-{methods[0]}-rollout", *rollout_step(engine, methods[0])))
        out.append((f"{engine}-bf16-{methods[0]}-plain-pool", *plain_pool(engine, methods[0])))
        for quant, quantization in QUANTIZATIONS.items():
            if quant == "bf16":
                continue
            spec = {
                "engine": {"name": engine},
                "quantization": quantization,
                "speculative": METHODS[methods[0]],
                "pod": {"gpu": {"product": "NVIDIA-B200"}} if quant == "nvfp4" else {},
            }
            out.append((f"{engine}-{quant}-{methods[0]}-on", spec, ServingPlan()))
    online = {"engine": {"name": "vllm"}, "quantization": {"weights": "fp8", "online": True}}
    out.append(("vllm-fp8online-none", online, ServingPlan()))
    for name, speculative in TRTLLM_DRAFTING.items():
        spec = {"engine": {"name": "tensorrt-llm"}, "speculative": speculative}
        out.append((f"tensorrt-llm-bf16-{name}", spec, ServingPlan()))
    return out


def rollout_step(engine: str, method: str) -> tuple[dict[str, Any], ServingPlan]:
    """A canary rollout's first step: revision 2 (FP8 weights) on 1 of 4 pods beside the fleet
    on revision 1."""
    spec = {"engine": {"name": engine}, "speculative": METHODS[method], "pod": {"replicas": 4}}
    fp8 = {**spec, "quantization": QUANTIZATIONS["fp8"]}
    config = parse_specmodel(specmodel_doc(**fp8)).engine_config()
    step = RolloutCanary(revision=2, pods=1, engine_config=config)
    return spec, ServingPlan(revision=1, rollout=step)


def plain_pool(engine: str, method: str) -> tuple[dict[str, Any], ServingPlan]:
    """Class `code` routed to a plain pool of 2 pods beside a fleet of 4, monitored."""
    spec = {
        "engine": {"name": engine},
        "speculative": METHODS[method],
        "pod": {"replicas": 4},
        "classes": [{"name": "code"}, {"name": "chat"}],
        "defaultClass": "chat",
        "monitoring": {"serviceMonitor": True},
    }
    return spec, ServingPlan(plain=PlainPool(replicas=2, routed=["code"]))


GATE = {"acceptance_window": 128, "acceptance_length_threshold": 1.5}
TRTLLM_DRAFTING: dict[str, dict[str, Any]] = {
    # 1.2.1 applies the acceptance gate and draft_len_schedule on the two-model path only.
    "eagle3-one-model-gate-dropped": {**METHODS["eagle3"], "engineOptions": GATE},
    "eagle3-two-model-gate": {
        **METHODS["eagle3"],
        "maxConcurrency": 64,
        "engineOptions": {**GATE, "eagle3_one_model": False},
    },
    "mtp-eagle-two-model-gate": {
        **METHODS["mtp"],
        "engineOptions": {**GATE, "mtp_eagle_one_model": False},
    },
    "draft_model-depth-schedule": {
        **METHODS["draft_model"],
        "maxConcurrency": 48,
        "depthSchedule": [
            {"minBatchSize": 1, "maxBatchSize": 8, "numSpeculativeTokens": 5},
            {"minBatchSize": 9, "maxBatchSize": 32, "numSpeculativeTokens": 2},
        ],
    },
}


@pytest.mark.parametrize(("name", "spec", "plan"), cases(), ids=[c[0] for c in cases()])
def test_golden(name: str, spec: dict[str, Any], plan: ServingPlan) -> None:
    doc = specmodel_doc(**spec)
    doc["metadata"]["name"] = "golden"
    check_golden(name, dump_all(render(parse_specmodel(doc), plan)))


EXPERIMENT = "vllm-experiment-four-arms"
"""The four arms of a SpecModel serving a pre-quantized AWQ checkpoint with EAGLE-3."""


def test_golden_experiment() -> None:
    doc = specmodel_doc(
        model={"source": "org/model-awq"},
        quantization={"weights": "awq", "preQuantized": True},
        speculative=METHODS["eagle3"],
    )
    doc["metadata"]["name"] = "golden"
    experiment = parse_specexperiment(experiment_doc(unquantizedSource="org/model"))
    check_golden(EXPERIMENT, dump_all(render_arms(parse_specmodel(doc), experiment)))


def check_golden(name: str, rendered: str) -> None:
    path = GOLDEN / f"{name}.yaml"
    if UPDATE:
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(rendered)
    assert path.exists(), f"{path.name} missing: run `make golden` and review it"
    assert rendered == path.read_text(), f"{path.name} changed: review, then `make golden`"


def test_no_stale_golden_files() -> None:
    expected = {f"{c[0]}.yaml" for c in cases()} | {f"{EXPERIMENT}.yaml"}
    assert {p.name for p in GOLDEN.glob("*.yaml")} == expected
