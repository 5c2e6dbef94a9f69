"""TensorRT-LLM 1.2.1: `trtllm-serve` with the LLM API options YAML (the only place speculative
decoding and the KV-cache dtype are configured)."""

from __future__ import annotations

from typing import Any

import yaml

from specfleet.api.model import EngineConfig
from specfleet.api.spec import TRTLLM_IMAGE, SpeculativeSpec
from specfleet.render.engine import ENGINE_CONFIG_PATH, ENGINE_PORT, EngineLaunch

OPTIONS_FILE = "llm_api.yaml"
# `Eagle` with `eagle3_one_model` is EAGLE-3 on the PyTorch backend in 1.1 and 1.2 alike (newer
# builds also spell it `Eagle3`); `speculative_model_dir` is accepted by both parsers.
DECODING_TYPE = {"eagle3": "Eagle", "mtp": "MTP", "ngram": "NGram", "draft_model": "DraftTarget"}


def launch(config: EngineConfig, served_name: str, speculation: bool) -> EngineLaunch:
    options = llm_api_options(config, speculation)
    return EngineLaunch(
        image=config.engine.image or TRTLLM_IMAGE,
        command=["trtllm-serve"],
        args=args(config),
        env=[],
        config_files={OPTIONS_FILE: yaml.safe_dump(options, sort_keys=True)},
        readiness_path="/health_generate",
        metrics_path="/prometheus/metrics",
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
        "max_draft_len": spec.num_speculative_tokens,
    }
    if spec.draft_model:
        out["speculative_model_dir"] = spec.draft_model
    if spec.max_concurrency:
        out["max_concurrency"] = spec.max_concurrency
    if spec.method == "eagle3":
        out["eagle3_one_model"] = True
    if spec.method == "mtp":
        # MTP's depth is its number of next-token layers; max_draft_len follows it.
        out["num_nextn_predict_layers"] = spec.num_speculative_tokens
    if spec.method == "ngram":
        out["max_matching_ngram_size"] = spec.ngram.max_match if spec.ngram else 4
    return out | (spec.engine_options or {})
