"""Renderer behaviour: real engine flags, speculation on/off, revisions, safe rollouts."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
import yaml

from conftest import EXAMPLES, ROOT, specmodel_doc
from specfleet.api import EngineConfig, InvalidSpecModel, parse_specmodel
from specfleet.api.spec import SpeculativeSpec
from specfleet.render import ServingPlan, render, revision_hash
from specfleet.render.trtllm import OPTIONS_FILE, speculative_config
from specfleet_testbed.engine.args import parse_trtllm, vllm_known_flags

# The real parser's option set, one copy in the repo (the simulator refuses the same flags).
VLLM_FLAGS = vllm_known_flags()
TRTLLM_SPECULATIVE = yaml.safe_load(
    (ROOT / "operator/specfleet/api/flags/tensorrt-llm-1.2.1-speculative.yaml").read_text()
)
TRTLLM_FLAGS = set(
    (ROOT / "operator/specfleet/api/flags/tensorrt-llm-1.2.1.txt").read_text().splitlines()
)
TRTLLM_KEYS = yaml.safe_load((ROOT / "tests/data/trtllm-1.2.1-llm-api-keys.yaml").read_text())


def by_kind(manifests: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [m for m in manifests if m["kind"] == kind]


def container(manifests: list[dict[str, Any]], name: str) -> dict[str, Any]:
    [deployment] = by_kind(manifests, "Deployment")
    [found] = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == name]
    return found


def all_specmodels() -> list[Any]:
    return [parse_specmodel(yaml.safe_load(p.read_text())) for p in EXAMPLES]


@pytest.mark.parametrize("speculation", [True, False])
def test_every_vllm_flag_exists_in_0_33_0(speculation: bool) -> None:
    docs = [specmodel_doc(**spec) for spec in VLLM_VARIANTS]
    for specmodel in [*all_specmodels(), *map(parse_specmodel, docs)]:
        if specmodel.spec.engine.name != "vllm":
            continue
        args = container(render(specmodel, ServingPlan(speculation=speculation)), "engine")["args"]
        flags = {a for a in args if a.startswith("--")}
        assert flags <= VLLM_FLAGS, flags - VLLM_FLAGS
        assert "--disable-log-stats" not in flags


VLLM_VARIANTS: list[dict[str, Any]] = [
    {
        "model": {
            "source": "m",
            "revision": "v2",
            "maxModelLen": 4096,
            "trustRemoteCode": True,
            "toolCallParser": "hermes",
        },
        "quantization": {"weights": "fp8", "online": True, "kvCacheDtype": "fp8_e5m2"},
        "speculative": {"method": "ngram", "ngram": {"minMatch": 2, "maxMatch": 3}},
    },
    {
        "speculative": {
            "method": "draft_model",
            "draftModel": "d",
            "draftTensorParallelSize": 1,
            "depthSchedule": [{"minBatchSize": 1, "maxBatchSize": 4, "numSpeculativeTokens": 3}],
        }
    },
]


def test_vllm_speculation_on_renders_config_and_per_request_metrics() -> None:
    specmodel = parse_specmodel(
        specmodel_doc(
            speculative={"method": "eagle3", "draftModel": "d", "numSpeculativeTokens": 5}
        )
    )
    args = container(render(specmodel), "engine")["args"]
    config = json.loads(args[args.index("--speculative-config") + 1])
    assert config == {"method": "eagle3", "model": "d", "num_speculative_tokens": 5}
    assert args[args.index("--per-request-spec-decode-metrics") + 1] == "summary"
    assert args[0] == "org/model" and "serve" not in args


def test_vllm_speculation_off_has_no_speculative_config_at_all() -> None:
    specmodel = parse_specmodel(specmodel_doc(speculative={"method": "eagle3", "draftModel": "d"}))
    manifests = render(specmodel, ServingPlan(speculation=False))
    args = container(manifests, "engine")["args"]
    assert not any("specul" in a or "spec-decode" in a for a in args)
    labels = by_kind(manifests, "Deployment")[0]["spec"]["template"]["metadata"]["labels"]
    assert labels["specfleet.dev/speculation"] == "off"


def test_vllm_depth_schedule_and_engine_options() -> None:
    specmodel = parse_specmodel(
        specmodel_doc(
            speculative={
                "method": "draft_model",
                "draftModel": "d",
                "depthSchedule": [
                    {"minBatchSize": 1, "maxBatchSize": 8, "numSpeculativeTokens": 4},
                    {"minBatchSize": 9, "maxBatchSize": 64, "numSpeculativeTokens": 0},
                ],
                "engineOptions": {"draft_sample_method": "greedy"},
            }
        )
    )
    args = container(render(specmodel), "engine")["args"]
    config = json.loads(args[args.index("--speculative-config") + 1])
    assert config["num_speculative_tokens_per_batch_size"] == [[1, 8, 4], [9, 64, 0]]
    assert config["draft_sample_method"] == "greedy"


def trtllm_options(manifests: list[dict[str, Any]]) -> dict[str, Any]:
    [configmap] = [m for m in manifests if m["metadata"]["name"].endswith("-engine")]
    options: dict[str, Any] = yaml.safe_load(configmap["data"][OPTIONS_FILE])
    return options


@pytest.mark.parametrize(
    ("method", "decoding_type"),
    [("eagle3", "Eagle"), ("mtp", "MTP"), ("ngram", "NGram"), ("draft_model", "DraftTarget")],
)
def test_trtllm_speculative_config_per_method(method: str, decoding_type: str) -> None:
    speculative: dict[str, Any] = {"method": method, "numSpeculativeTokens": 3}
    if method in ("eagle3", "draft_model"):
        speculative["draftModel"] = "d"
    specmodel = parse_specmodel(
        specmodel_doc(engine={"name": "tensorrt-llm"}, speculative=speculative)
    )
    options = trtllm_options(render(specmodel))
    assert options["speculative_config"]["decoding_type"] == decoding_type
    assert options["speculative_config"]["max_draft_len"] == 3
    # the simulator takes the names 1.2.1's DecodingBaseConfig.from_dict takes, and no others
    text = yaml.safe_dump(options)
    simulated = parse_trtllm(["m", "--config", "/x"], read_file=lambda _: text).speculation
    assert simulated is not None and simulated.method == method
    assert options["return_perf_metrics"] is True
    assert options["enable_iter_perf_stats"] is True


def test_trtllm_command_is_explicit_and_listens_on_all_interfaces() -> None:
    specmodel = parse_specmodel(specmodel_doc(engine={"name": "tensorrt-llm"}))
    engine = container(render(specmodel), "engine")
    argv = engine["command"] + engine["args"]
    assert argv[:2] == ["trtllm-serve", "org/model"]
    assert argv[argv.index("--host") + 1] == "0.0.0.0"
    for flag in ("--max_batch_size", "--max_num_tokens", "--kv_cache_free_gpu_memory_fraction"):
        assert flag in argv
    assert argv[argv.index("--extra_llm_api_options") + 1] == "/etc/specfleet/engine/llm_api.yaml"


def test_trtllm_cli_flags_are_real() -> None:
    for specmodel in all_specmodels():
        if specmodel.spec.engine.name != "tensorrt-llm":
            continue
        engine = container(render(specmodel), "engine")
        flags = {a for a in engine["args"] if a.startswith("--")}
        assert flags <= TRTLLM_FLAGS, flags - TRTLLM_FLAGS


def _keys_allowed(options: dict[str, Any], allowed: dict[str, Any], path: str = "") -> None:
    for key, value in options.items():
        assert key in allowed, f"{path}{key} is not a TensorRT-LLM 1.2.1 LLM API key"
        if isinstance(value, dict) and isinstance(allowed[key], dict):
            _keys_allowed(value, allowed[key], f"{path}{key}.")


@pytest.mark.parametrize("speculation", [True, False])
def test_trtllm_yaml_keys_are_accepted_by_1_2_1(speculation: bool) -> None:
    for method in ("eagle3", "mtp", "ngram", "draft_model"):
        speculative: dict[str, Any] = {"method": method, "maxConcurrency": 16}
        if method in ("eagle3", "draft_model"):
            speculative["draftModel"] = "d"
        if method in ("ngram", "draft_model"):
            speculative["depthSchedule"] = [
                {"minBatchSize": 4, "maxBatchSize": 8, "numSpeculativeTokens": 2}
            ]
        doc = specmodel_doc(
            engine={"name": "tensorrt-llm"},
            quantization={"kvCacheDtype": "fp8"},
            speculative=speculative,
        )
        options = trtllm_options(render(parse_specmodel(doc), ServingPlan(speculation=speculation)))
        allowed = dict(TRTLLM_KEYS["llm_args"])
        allowed["speculative_config"] = dict.fromkeys(
            TRTLLM_SPECULATIVE["base"] + TRTLLM_SPECULATIVE[method], "s"
        )
        _keys_allowed(options, allowed)
        assert ("speculative_config" in options) == speculation


GATE = {"acceptance_window": 128, "acceptance_length_threshold": 1.5}
TWO_MODEL = {"eagle3_one_model": False}
MTP_EAGLE_TWO_MODEL = {"mtp_eagle_one_model": False}
VANILLA_MTP = {"mtp_eagle_one_model": False, "use_mtp_vanilla": True}


def trtllm_speculative_config(**speculative: Any) -> dict[str, Any]:
    doc = specmodel_doc(engine={"name": "tensorrt-llm"}, speculative=speculative)
    config: dict[str, Any] = trtllm_options(render(parse_specmodel(doc)))["speculative_config"]
    return config


@pytest.mark.parametrize(
    ("speculative", "gated"),
    [
        ({"method": "eagle3", "draftModel": "d"}, False),  # one-model by default
        ({"method": "mtp"}, False),
        ({"method": "mtp", "engineOptions": MTP_EAGLE_TWO_MODEL}, True),
        ({"method": "mtp", "engineOptions": VANILLA_MTP}, False),
        ({"method": "eagle3", "draftModel": "d", "engineOptions": TWO_MODEL}, True),
        ({"method": "draft_model", "draftModel": "d"}, True),
        ({"method": "ngram"}, True),
    ],
)  # fmt: skip
def test_trtllm_acceptance_gate_only_where_1_2_1_applies_it(
    speculative: dict[str, Any], gated: bool
) -> None:
    options = {**speculative.get("engineOptions", {}), **GATE}
    config = trtllm_speculative_config(**{**speculative, "engineOptions": options})
    assert (config.get("acceptance_window"), config.get("acceptance_length_threshold")) == (
        (128, 1.5) if gated else (None, None)
    )


def test_trtllm_depth_schedule_is_draft_len_schedule_with_max_concurrency_folded_in() -> None:
    config = trtllm_speculative_config(
        method="draft_model",
        draftModel="d",
        numSpeculativeTokens=5,
        maxConcurrency=48,
        depthSchedule=[
            {"minBatchSize": 9, "maxBatchSize": 32, "numSpeculativeTokens": 2},
            {"minBatchSize": 1, "maxBatchSize": 8, "numSpeculativeTokens": 5},
            {"minBatchSize": 60, "maxBatchSize": 80, "numSpeculativeTokens": 1},
        ],
    )
    # Batch sizes no step covers draft k; above max_concurrency nothing (1.2.1 refuses both).
    assert config["draft_len_schedule"] == {1: 5, 9: 2, 33: 5, 49: 0}
    assert config["max_draft_len"] == 5 and "max_concurrency" not in config


def test_trtllm_mtp_eagle_two_model_takes_the_depth_schedule() -> None:
    """Two-model MTP-Eagle drafts by the schedule, its MTP depth (num_nextn_predict_layers) cut
    with max_draft_len; one-model MTP drafts inside the target's forward and ignores it."""
    spec = SpeculativeSpec.model_validate(
        {
            "method": "mtp",
            "numSpeculativeTokens": 3,
            "depthSchedule": [
                {"minBatchSize": 1, "maxBatchSize": 4, "numSpeculativeTokens": 2},
                {"minBatchSize": 5, "maxBatchSize": 8, "numSpeculativeTokens": 1},
            ],
            "engineOptions": MTP_EAGLE_TWO_MODEL,
        }
    )
    config = speculative_config(spec)
    assert config["draft_len_schedule"] == {1: 2, 5: 1, 9: 2}
    assert config["max_draft_len"] == config["num_nextn_predict_layers"] == 2
    one_model = spec.model_copy(update={"engine_options": None})
    assert "draft_len_schedule" not in speculative_config(one_model)


def test_trtllm_batch_size_1_drafts_the_most() -> None:
    """1.2.1 wants draft_len_schedule[1] == max_draft_len and no deeper step."""
    config = trtllm_speculative_config(
        method="ngram",
        numSpeculativeTokens=6,
        depthSchedule=[
            {"minBatchSize": 1, "maxBatchSize": 4, "numSpeculativeTokens": 3},
            {"minBatchSize": 5, "maxBatchSize": 8, "numSpeculativeTokens": 0},
        ],
    )
    assert config["max_draft_len"] == 3
    assert config["draft_len_schedule"] == {1: 3, 5: 0, 9: 3}


def test_trtllm_depth_schedule_refused_where_1_2_1_ignores_it() -> None:
    step = [{"minBatchSize": 1, "maxBatchSize": 8, "numSpeculativeTokens": 2}]
    one_model = (
        ({"method": "eagle3", "draftModel": "d"}, "eagle3_one_model: false"),
        ({"method": "mtp"}, "mtp_eagle_one_model: false"),
        ({"method": "mtp", "engineOptions": VANILLA_MTP}, "without use_mtp_vanilla"),
    )
    for speculative, fix in one_model:
        doc = specmodel_doc(
            engine={"name": "tensorrt-llm"}, speculative={**speculative, "depthSchedule": step}
        )
        with pytest.raises(InvalidSpecModel, match=f"depthSchedule.*{fix}") as refused:
            parse_specmodel(doc)
        assert [e.path for e in refused.value.errors] == ["spec.speculative.depthSchedule"]
    two_model = (
        {"method": "eagle3", "draftModel": "d", "engineOptions": TWO_MODEL},
        {"method": "mtp", "engineOptions": MTP_EAGLE_TWO_MODEL},
        {"method": "ngram"},
    )
    for speculative in two_model:
        doc = specmodel_doc(
            engine={"name": "tensorrt-llm"}, speculative={**speculative, "depthSchedule": step}
        )
        assert parse_specmodel(doc).spec.speculative is not None


def test_trtllm_gateway_knows_how_the_engine_drafts() -> None:
    def drafting(**speculative: Any) -> Any:
        doc = specmodel_doc(engine={"name": "tensorrt-llm"}, speculative=speculative)
        [configmap] = [
            m for m in render(parse_specmodel(doc)) if m["metadata"]["name"].endswith("-gateway")
        ]
        return yaml.safe_load(configmap["data"]["gateway.yaml"]).get("drafting")

    assert drafting(method="eagle3", draftModel="d") is None  # k on every step
    assert drafting(method="eagle3", draftModel="d", maxConcurrency=16) == {
        "depthByBatchSize": {"1": 4, "17": 0},
        "everyStep": True,
        "gated": False,
    }
    assert drafting(method="ngram") == {
        "depthByBatchSize": {},
        "everyStep": False,
        "gated": False,
    }
    gate = {**GATE, **TWO_MODEL}
    assert drafting(method="eagle3", draftModel="d", engineOptions=gate)["gated"] is True
    assert drafting(method="eagle3", draftModel="d", engineOptions=GATE) is None  # one-model
    mtp_gate = {**GATE, **MTP_EAGLE_TWO_MODEL}
    assert drafting(method="mtp", engineOptions=mtp_gate)["gated"] is True
    assert drafting(method="mtp", engineOptions=GATE) is None


def test_trtllm_kv_cache_fp8() -> None:
    doc = specmodel_doc(engine={"name": "tensorrt-llm"}, quantization={"kvCacheDtype": "fp8"})
    assert trtllm_options(render(parse_specmodel(doc)))["kv_cache_config"]["dtype"] == "fp8"


PINNED_HASH = "27c7ce1264"


def test_revision_hash_stable_across_key_order_and_explicit_defaults() -> None:
    doc = specmodel_doc(speculative={"method": "eagle3", "draftModel": "d"})
    config = parse_specmodel(doc).engine_config()
    wire = config.canonical()
    shuffled = dict(random.Random(7).sample(sorted(wire.items()), len(wire)))
    assert revision_hash(EngineConfig.model_validate(shuffled)) == revision_hash(config)
    explicit = specmodel_doc(
        speculative={"method": "eagle3", "draftModel": "d", "numSpeculativeTokens": 4},
        quantization={"weights": "none", "kvCacheDtype": "auto"},
    )
    assert revision_hash(parse_specmodel(explicit).engine_config()) == revision_hash(config)
    # Pinned: a changed hash re-rolls every fleet on operator upgrade. Change it deliberately.
    assert revision_hash(config) == PINNED_HASH


def test_revision_ignores_non_engine_fields_but_not_engine_fields() -> None:
    base = parse_specmodel(specmodel_doc()).engine_config()
    replicas = parse_specmodel(specmodel_doc(pod={"replicas": 5})).engine_config()
    quant = parse_specmodel(specmodel_doc(quantization={"kvCacheDtype": "fp8"})).engine_config()
    assert revision_hash(base) == revision_hash(replicas)
    assert revision_hash(base) != revision_hash(quant)
    spec = {"method": "eagle3", "draftModel": "d"}
    plain = parse_specmodel(specmodel_doc(speculative=spec)).engine_config()
    for knob in ({"perTokenCompute": 0.02}, {"draftCost": 0.2}):  # the guard's, not the engine's
        tuned = specmodel_doc(speculative={**spec, **knob})
        assert revision_hash(parse_specmodel(tuned).engine_config()) == revision_hash(plain)


def test_rollback_plan_serves_the_old_config_with_the_current_classes() -> None:
    old = parse_specmodel(specmodel_doc(quantization={"weights": "none"}))
    new = parse_specmodel(
        specmodel_doc(
            quantization={"weights": "fp8", "online": True},
            classes=[{"name": "code"}],
            defaultClass="code",
        )
    )
    plan = ServingPlan(revision=1, engine_config=old.engine_config())
    manifests = render(new, plan)
    args = container(manifests, "engine")["args"]
    assert "--quantization" not in args
    template = by_kind(manifests, "Deployment")[0]["spec"]["template"]
    assert template["metadata"]["labels"]["specfleet.dev/revision"] == "1"
    gateway = yaml.safe_load(by_kind(manifests, "ConfigMap")[0]["data"]["gateway.yaml"])
    assert [c["name"] for c in gateway["classes"]] == ["code"]


def test_zero_downtime_rollout_and_stable_selector() -> None:
    specmodel = parse_specmodel(specmodel_doc(speculative={"method": "ngram"}))
    on = by_kind(render(specmodel), "Deployment")[0]
    off = by_kind(render(specmodel, ServingPlan(speculation=False)), "Deployment")[0]
    assert on["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    assert on["spec"]["selector"] == off["spec"]["selector"]
    selector = on["spec"]["selector"]["matchLabels"]
    assert "specfleet.dev/revision" not in selector
    assert selector.items() <= on["spec"]["template"]["metadata"]["labels"].items()


def test_children_are_owned_and_labelled() -> None:
    manifests = render(parse_specmodel(specmodel_doc()))
    for manifest in manifests:
        [owner] = manifest["metadata"]["ownerReferences"]
        assert owner["uid"] == "uid-1" and owner["controller"] is True
        assert manifest["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "specfleet"
        assert manifest["metadata"]["namespace"] == "ns"


def test_pod_gets_gpus_shm_cache_token_and_probes() -> None:
    doc = specmodel_doc(
        model={
            "source": "m",
            "tensorParallelSize": 2,
            "hfTokenSecret": {"name": "hf", "key": "token"},
            "cache": {"persistentVolumeClaim": "cache"},
        },
        pod={"gpu": {"product": "NVIDIA-H100-80GB-HBM3"}, "resources": {"requests": {"cpu": "4"}}},
    )
    manifests = render(parse_specmodel(doc))
    engine = container(manifests, "engine")
    assert engine["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert engine["resources"]["requests"] == {"cpu": "4", "nvidia.com/gpu": "2"}
    mounts = {m["mountPath"] for m in engine["volumeMounts"]}
    assert {"/dev/shm", "/models-cache"} <= mounts
    env = {e["name"]: e for e in engine["env"]}
    assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "hf", "key": "token"}
    assert env["HF_HOME"]["value"] == "/models-cache/hf"
    assert (
        engine["startupProbe"]["failureThreshold"] * engine["startupProbe"]["periodSeconds"] >= 600
    )
    pod = by_kind(manifests, "Deployment")[0]["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    shm = next(v for v in pod["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"]["medium"] == "Memory"


def test_gateway_sidecar_is_locked_down_and_the_service_targets_it() -> None:
    manifests = render(parse_specmodel(specmodel_doc()))
    gateway = container(manifests, "gateway")
    assert gateway["securityContext"]["runAsNonRoot"] is True
    assert gateway["securityContext"]["readOnlyRootFilesystem"] is True
    [svc] = by_kind(manifests, "Service")
    http = next(p for p in svc["spec"]["ports"] if p["name"] == "http")
    assert http["targetPort"] == "http"


@pytest.mark.parametrize("engine", ["vllm", "tensorrt-llm"])
def test_the_service_never_exposes_the_engine(engine: str) -> None:
    """Traffic that reached the engine directly would bypass the gateway and go unmeasured."""
    manifests = render(parse_specmodel(specmodel_doc(engine={"name": engine})))
    [svc] = by_kind(manifests, "Service")
    assert {(p["name"], p["targetPort"]) for p in svc["spec"]["ports"]} == {
        ("http", "http"),
        ("metrics", "metrics"),
    }
    gateway_ports = {p["name"] for p in container(manifests, "gateway")["ports"]}
    assert {p["targetPort"] for p in svc["spec"]["ports"]} <= gateway_ports


@pytest.mark.parametrize(
    ("engine", "startup"), [("vllm", "/health"), ("tensorrt-llm", "/health_generate")]
)
def test_a_saturated_engine_stays_ready(engine: str, startup: str) -> None:
    """Readiness asks /health, which answers at once however busy the engine is; a generation
    could queue behind a full batch past its timeout and drop the pod from the Service when the
    load is highest. TensorRT-LLM proves once, at start, that it generates."""
    engine_container = container(
        render(parse_specmodel(specmodel_doc(engine={"name": engine}))), "engine"
    )
    probes = {k: v["httpGet"]["path"] for k, v in engine_container.items() if k.endswith("Probe")}
    assert probes == {
        "startupProbe": startup,
        "readinessProbe": "/health",
        "livenessProbe": "/health",
    }


@pytest.mark.parametrize("engine", ["vllm", "tensorrt-llm"])
def test_engine_runs_without_capabilities_or_privilege_escalation(engine: str) -> None:
    manifests = render(parse_specmodel(specmodel_doc(engine={"name": engine})))
    pod = by_kind(manifests, "Deployment")[0]["spec"]["template"]["spec"]
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["automountServiceAccountToken"] is False
    for name in ("engine", "gateway"):
        security = container(manifests, name)["securityContext"]
        assert security["allowPrivilegeEscalation"] is False
        assert security["capabilities"]["drop"] == ["ALL"]
        assert not security.get("privileged")


@pytest.mark.parametrize(("replicas", "pdb"), [(1, False), (2, True)])
def test_pdb_only_when_a_pod_can_be_spared(replicas: int, pdb: bool) -> None:
    manifests = render(parse_specmodel(specmodel_doc(pod={"replicas": replicas})))
    assert bool(by_kind(manifests, "PodDisruptionBudget")) == pdb


@pytest.mark.parametrize(
    ("engine", "path"), [("vllm", "/metrics"), ("tensorrt-llm", "/prometheus/metrics")]
)
def test_monitors_scrape_the_gateway_through_the_service_and_the_engine_from_its_pods(
    engine: str, path: str
) -> None:
    off = render(parse_specmodel(specmodel_doc(engine={"name": engine})))
    doc = specmodel_doc(
        engine={"name": engine},
        speculative={"method": "eagle3", "draftModel": "d"},
        monitoring={"serviceMonitor": True},
    )
    on = render(parse_specmodel(doc), ServingPlan(speculation=False, canary=True))
    assert not by_kind(off, "ServiceMonitor") and not by_kind(off, "PodMonitor")
    [service_monitor] = by_kind(on, "ServiceMonitor")
    [svc] = by_kind(on, "Service")
    assert matches(service_monitor["spec"]["selector"]["matchLabels"], svc["metadata"]["labels"])
    assert [e["port"] for e in service_monitor["spec"]["endpoints"]] == ["metrics"]
    [pod_monitor] = by_kind(on, "PodMonitor")
    [endpoint] = pod_monitor["spec"]["podMetricsEndpoints"]
    assert (endpoint["port"], endpoint["path"]) == ("engine", path)
    for deployment in by_kind(on, "Deployment"):  # the fleet's pods and the canary's
        template = deployment["spec"]["template"]
        assert matches(
            pod_monitor["spec"]["selector"]["matchLabels"], template["metadata"]["labels"]
        )
        engine_ports = {p["name"] for c in template["spec"]["containers"] for p in c["ports"]}
        assert "engine" in engine_ports
    for endpoints in (service_monitor["spec"]["endpoints"], [endpoint]):
        targets = {r["targetLabel"]: r["sourceLabels"] for e in endpoints for r in e["relabelings"]}
        assert targets == {
            "specmodel": ["__meta_kubernetes_pod_label_app_kubernetes_io_instance"],
            "revision": ["__meta_kubernetes_pod_label_specfleet_dev_revision"],
            "speculation": ["__meta_kubernetes_pod_label_specfleet_dev_speculation"],
            "experiment": ["__meta_kubernetes_pod_label_specfleet_dev_experiment"],
            "arm": ["__meta_kubernetes_pod_label_specfleet_dev_arm"],
            "pool": ["__meta_kubernetes_pod_label_specfleet_dev_pool"],
        }


def test_render_is_pure_and_deterministic() -> None:
    for specmodel in all_specmodels():
        assert render(specmodel) == render(specmodel)


def matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return selector.items() <= labels.items()


def test_a_canary_is_one_pod_beside_the_fleet_behind_the_same_service() -> None:
    doc = specmodel_doc(
        engine={"name": "tensorrt-llm"},
        speculative={"method": "eagle3", "draftModel": "d", "numSpeculativeTokens": 4},
        pod={"replicas": 2},
        monitoring={"serviceMonitor": True},
    )
    specmodel = parse_specmodel(doc)
    without = render(specmodel, ServingPlan(speculation=False))
    trial = render(specmodel, ServingPlan(speculation=False, canary=True))
    assert trial[: len(without)] == without  # the fleet's children do not change at all
    fleet, canary = by_kind(trial, "Deployment")
    assert (canary["metadata"]["name"], canary["spec"]["replicas"]) == ("m-canary", 1)
    canary_pod = canary["spec"]["template"]["metadata"]["labels"]
    fleet_pod = fleet["spec"]["template"]["metadata"]["labels"]
    assert (canary_pod["specfleet.dev/speculation"], fleet_pod["specfleet.dev/speculation"]) == (
        "on",
        "off",
    )
    # disjoint Deployment selectors: no ReplicaSet of one can adopt the other's pods
    assert not matches(fleet["spec"]["selector"]["matchLabels"], canary_pod)
    assert not matches(canary["spec"]["selector"]["matchLabels"], fleet_pod)
    [pdb] = by_kind(trial, "PodDisruptionBudget")
    assert not matches(pdb["spec"]["selector"]["matchLabels"], canary_pod)
    [svc] = by_kind(trial, "Service")
    assert matches(svc["spec"]["selector"], canary_pod) and matches(
        svc["spec"]["selector"], fleet_pod
    )
    # telemetry tells the canary apart by the labels the ServiceMonitor maps
    assert canary_pod["app.kubernetes.io/instance"] == "m"
    # its own ConfigMaps, with its speculation: TensorRT-LLM's YAML and the gateway's k
    configs = {c["metadata"]["name"]: c["data"] for c in by_kind(trial, "ConfigMap")}
    assert "speculative_config" in configs["m-canary-engine"][OPTIONS_FILE]
    assert "speculative_config" not in configs["m-engine"][OPTIONS_FILE]
    assert "numSpeculativeTokens: 4" in configs["m-canary-gateway"]["gateway.yaml"]
    volumes = {v["name"]: v for v in canary["spec"]["template"]["spec"]["volumes"]}
    assert volumes["engine-config"]["configMap"]["name"] == "m-canary-engine"


def test_no_canary_without_a_speculative_config() -> None:
    specmodel = parse_specmodel(specmodel_doc())
    assert render(specmodel, ServingPlan(canary=True)) == render(specmodel)


def test_trtllm_serves_the_declared_revision() -> None:
    doc = specmodel_doc(engine={"name": "tensorrt-llm"}, model={"source": "m", "revision": "v2"})
    args = container(render(parse_specmodel(doc)), "engine")["args"]
    assert args[args.index("--revision") + 1] == "v2"
    assert parse_trtllm(["trtllm-serve", *args], read_file=lambda _: "{}").model == "m"


@pytest.mark.parametrize(("grace", "drain"), [(120, 105), (600, 585), (12, 0)])
def test_gateway_and_vllm_drain_for_what_the_pod_grace_leaves_after_the_prestop(
    grace: int, drain: int
) -> None:
    """Streams survive a restart only if both the gateway and the engine keep them after
    SIGTERM for as long as the kubelet lets the pod live: its grace less the preStop."""
    specmodel = parse_specmodel(specmodel_doc(pod={"terminationGracePeriodSeconds": grace}))
    manifests = render(specmodel)
    pod = by_kind(manifests, "Deployment")[0]["spec"]["template"]["spec"]
    gateway, engine = container(manifests, "gateway"), container(manifests, "engine")
    pre_stop = int(gateway["lifecycle"]["preStop"]["exec"]["command"][1])
    assert pod["terminationGracePeriodSeconds"] == grace
    assert gateway["args"][gateway["args"].index("--shutdown-grace") + 1] == str(drain)
    assert engine["args"][engine["args"].index("--shutdown-timeout") + 1] == str(drain)
    assert drain == 0 or pre_stop + drain < grace


def test_trtllm_has_no_drain_flag_but_the_gateway_still_drains() -> None:
    specmodel = parse_specmodel(specmodel_doc(engine={"name": "tensorrt-llm"}))
    manifests = render(specmodel)
    assert not any("shutdown" in a for a in container(manifests, "engine")["args"])
    assert "--shutdown-grace" in container(manifests, "gateway")["args"]
