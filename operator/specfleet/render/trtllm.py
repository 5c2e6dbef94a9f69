"""TensorRT-LLM 1.2.1: `trtllm-serve` with the LLM API options YAML (the only place speculative
decoding and the KV-cache dtype are configured)."""

from __future__ import annotations

from typing import Any

import yaml

from specfleet.api.gateway import Drafting
from specfleet.api.model import EngineConfig
from specfleet.api.spec import TRTLLM_IMAGE, SpeculativeSpec
from specfleet.api.trtllm import DECODING_TYPE, runs_a_drafter
from specfleet.render.engine import ENGINE_CONFIG_PATH, ENGINE_PORT, EngineLaunch

OPTIONS_FILE = "llm_api.yaml"
ACCEPTANCE_GATE = ("acceptance_window", "acceptance_length_threshold")


def launch(config: EngineConfig, served_name: str, speculation: bool) -> EngineLaunch:
    options = llm_api_options(config, speculation)
    running = config.speculative if speculation else None
    return EngineLaunch(
        image=config.engine.image or TRTLLM_IMAGE,
        command=["trtllm-serve"],
        args=args(config),
        env=[],
        config_files={OPTIONS_FILE: yaml.safe_dump(options, sort_keys=True)},
        startup_path="/health_generate",
        metrics_path="/prometheus/metrics",
        drafting=drafting_of(running) if running else None,
    )


def args(config: EngineConfig) -> list[str]:
    engine, model = config.engine, config.model
    argv = [model.source, "--host", "0.0.0.0", "--port", str(ENGINE_PORT), "--backend", "pytorch"]
    argv += ["--tp_size", str(model.tensor_parallel_size)]
    argv += ["--max_batch_size", str(engine.max_batch_size)]
    argv += ["--max_num_tokens", str(engine.max_num_batched_tokens)]
    if model.max_model_len:
        argv += ["--max_seq_len", str(model.max_model_len)]
    argv += ["--kv_cache_free_gpu_memory_fraction", str(engine.gpu_memory_fraction)]
    if model.revision:
        argv += ["--revision", model.revision]
    if model.trust_remote_code:
        argv.append("--trust_remote_code")
    argv += ["--extra_llm_api_options", f"{ENGINE_CONFIG_PATH}/{OPTIONS_FILE}"]
    return argv + engine.extra_args


def llm_api_options(config: EngineConfig, speculation: bool) -> dict[str, Any]:
    """Top-level YAML keys replace what the CLI set, and releases before the kv_cache_config
    deep merge drop the CLI's KV fraction, so the fraction is repeated inside kv_cache_config."""
    kv_cache: dict[str, Any] = {"free_gpu_memory_fraction": config.engine.gpu_memory_fraction}
    if config.quantization.kv_cache_dtype != "auto":
        kv_cache["dtype"] = "fp8"
    options: dict[str, Any] = {
        "kv_cache_config": kv_cache,
        "return_perf_metrics": True,
        "enable_iter_perf_stats": True,
    }
    if speculation and config.speculative:
        options["speculative_config"] = speculative_config(config.speculative)
    return options


def speculative_config(spec: SpeculativeSpec) -> dict[str, Any]:
    out: dict[str, Any] = {
        "decoding_type": DECODING_TYPE[spec.method],
        **draft_len(spec.method, spec.num_speculative_tokens),
    }
    if spec.draft_model:
        out["speculative_model_dir"] = spec.draft_model
    if spec.max_concurrency:
        out["max_concurrency"] = spec.max_concurrency
    if spec.method == "eagle3":
        out["eagle3_one_model"] = True
    if spec.method == "ngram":
        out["max_matching_ngram_size"] = spec.ngram.max_match if spec.ngram else 4
    out |= spec.engine_options or {}
    if not runs_a_drafter(out):
        for key in ACCEPTANCE_GATE:
            out.pop(key, None)
    elif spec.depth_schedule:
        depths = depth_by_batch_size(spec, out)
        out.pop("max_concurrency", None)  # 1.2.1 refuses both; the schedule carries it
        out |= draft_len(spec.method, depths[1])
        out["draft_len_schedule"] = depths
    return out


def draft_len(method: str, k: int) -> dict[str, int]:
    """MTP's depth is its number of next-token layers: 1.2.1 sets max_draft_len from it."""
    if method == "mtp":
        return {"max_draft_len": k, "num_nextn_predict_layers": k}
    return {"max_draft_len": k}


def drafting_of(spec: SpeculativeSpec) -> Drafting | None:
    """How the engine rendered from `spec` drafts, for the gateway: it reads a mean acceptance
    length per request and must not take a step the engine did not draft on for a rejection.
    None: k drafts on every step."""
    options = speculative_config(spec)
    depths = depth_by_batch_size(spec, options)
    if set(depths.values()) == {spec.num_speculative_tokens}:
        depths = {}
    every_step = spec.method != "ngram"
    gated = all(options.get(key) for key in ACCEPTANCE_GATE)
    if not depths and every_step and not gated:
        return None
    return Drafting(depth_by_batch_size=depths, every_step=every_step, gated=gated)


def depth_by_batch_size(spec: SpeculativeSpec, options: dict[str, Any]) -> dict[int, int]:
    """Draft tokens per step from each batch size on, as the engine applies them: the depth
    schedule where it acts (two-model paths), then 0 above max_concurrency. Batch size 1 must
    draft the most (1.2.1's rule for draft_len_schedule), so deeper steps are cut to its depth."""
    k = spec.num_speculative_tokens
    depths = {1: k}
    steps = (spec.depth_schedule or []) if runs_a_drafter(options) else []
    for step in sorted(steps, key=lambda s: s.min_batch_size):
        depths[step.min_batch_size] = step.num_speculative_tokens
        depths.setdefault(step.max_batch_size + 1, k)
    if spec.max_concurrency:
        depths = {b: d for b, d in depths.items() if b <= spec.max_concurrency}
        depths[spec.max_concurrency + 1] = 0
    ceiling, previous = depths[1], None
    out: dict[int, int] = {}
    for batch, depth in sorted(depths.items()):
        if min(depth, ceiling) != previous:
            out[batch] = previous = min(depth, ceiling)
    return out
