"""vLLM 0.33.0: container args (the image's entrypoint is already `vllm serve`)."""

from __future__ import annotations

import json
from typing import Any

from specfleet.api.model import EngineConfig
from specfleet.api.spec import VLLM_IMAGE, SpeculativeSpec
from specfleet.render.engine import ENGINE_PORT, MODEL_CACHE_PATH, EngineLaunch


def launch(config: EngineConfig, served_name: str, speculation: bool) -> EngineLaunch:
    return EngineLaunch(
        image=config.engine.image or VLLM_IMAGE,
        command=None,
        args=args(config, served_name, speculation),
        env=env(config),
        drain_flag="--shutdown-timeout",
    )


def args(config: EngineConfig, served_name: str, speculation: bool) -> list[str]:
    engine, model, quant = config.engine, config.model, config.quantization
    argv = [model.source, "--served-model-name", served_name, "--port", str(ENGINE_PORT)]
    argv += ["--tensor-parallel-size", str(model.tensor_parallel_size)]
    argv += ["--max-num-seqs", str(engine.max_batch_size)]
    argv += ["--max-num-batched-tokens", str(engine.max_num_batched_tokens)]
    argv += ["--gpu-memory-utilization", str(engine.gpu_memory_fraction)]
    if model.max_model_len:
        argv += ["--max-model-len", str(model.max_model_len)]
    if model.revision:
        argv += ["--revision", model.revision]
    if model.trust_remote_code:
        argv.append("--trust-remote-code")
    if model.tool_call_parser:
        argv += ["--enable-auto-tool-choice", "--tool-call-parser", model.tool_call_parser]
    if quant.online:
        argv += ["--quantization", "fp8"]
    if quant.kv_cache_dtype != "auto":
        argv += ["--kv-cache-dtype", quant.kv_cache_dtype]
    if speculation and config.speculative:
        spec_json = json.dumps(speculative_config(config.speculative), sort_keys=True)
        argv += ["--speculative-config", spec_json]
        argv += ["--per-request-spec-decode-metrics", "summary"]
    return argv + engine.extra_args


def speculative_config(spec: SpeculativeSpec) -> dict[str, Any]:
    """`--speculative-config`: our method names are vLLM's own."""
    out: dict[str, Any] = {
        "method": spec.method,
        "num_speculative_tokens": spec.num_speculative_tokens,
    }
    if spec.draft_model:
        out["model"] = spec.draft_model
    if spec.draft_tensor_parallel_size:
        out["draft_tensor_parallel_size"] = spec.draft_tensor_parallel_size
    if spec.ngram:
        out["prompt_lookup_min"] = spec.ngram.min_match
        out["prompt_lookup_max"] = spec.ngram.max_match
    if spec.depth_schedule:
        out["num_speculative_tokens_per_batch_size"] = [
            [step.min_batch_size, step.max_batch_size, step.num_speculative_tokens]
            for step in spec.depth_schedule
        ]
    return out | (spec.engine_options or {})


def env(config: EngineConfig) -> list[dict[str, object]]:
    entries: list[dict[str, object]] = [{"name": "VLLM_NO_USAGE_STATS", "value": "1"}]
    if config.model.cache:
        entries.append({"name": "VLLM_CACHE_ROOT", "value": f"{MODEL_CACHE_PATH}/vllm"})
    return entries
