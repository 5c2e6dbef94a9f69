"""Read the engine's own command line, as a Kubernetes pod would pass it.

- vLLM 0.33.0: the image entrypoint is `vllm serve`, so args start with the
  model: `[<model>, --served-model-name, NAME, --speculative-config, JSON, ...]`.
  Flags that vLLM 0.33.0 does not know are rejected like the real engine does
  (exit 2, "unrecognized arguments") unless `lenient=True`; the known list is
  the real parser's option set, specfleet's `api/flags/vllm-0.33.0.txt` (with its `--no-X`
  and `--enable-X`/`--disable-X` pairs). Underscores in flag names are accepted
  (`--max_model_len`), as vLLM's FlexibleArgumentParser does. The startup check
  of the real engine is kept: `--per-request-spec-decode-metrics` other than
  `none` without a speculative config is an error.
- TensorRT-LLM 1.2.1: `[trtllm-serve] [serve] <model> --backend pytorch ...
  --extra_llm_api_options FILE` (`--config` is an alias); speculation lives only
  in that YAML (`speculative_config.decoding_type`, `max_draft_len`).

Speculation off means: no speculative config at all.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from specfleet.api.escape_hatches import known_flags
from specfleet.api.trtllm import runs_a_drafter
from specfleet.scenario.drafting import PROMPT_LOOKUP

__all__ = [
    "EngineArgsError",
    "EngineConfig",
    "Speculation",
    "parse_engine_args",
    "parse_trtllm",
    "parse_vllm",
    "vllm_known_flags",
]

Engine = Literal["vllm", "tensorrt-llm"]


class EngineArgsError(ValueError):
    """The engine would refuse to start with these args."""


@dataclass(frozen=True)
class Speculation:
    method: str  # canonical: eagle3, eagle, draft_model, ngram, mtp, ... (vLLM spelling)
    k: int  # draft tokens per verify step (num_speculative_tokens / max_draft_len)
    draft_model: str | None = None
    configured_method: str = ""  # as written (e.g. "Eagle", "deepseek_mtp")
    # vLLM num_speculative_tokens_per_batch_size: inclusive [start, end, k] ranges
    k_per_batch_size: tuple[tuple[int, int, int], ...] = ()
    # TensorRT-LLM max_concurrency: no speculation above this batch size
    max_concurrency: int | None = None
    # TensorRT-LLM (acceptance_window, acceptance_length_threshold), where the engine applies it
    acceptance_gate: tuple[int, float] | None = None

    @property
    def drafts_on_match(self) -> bool:
        """Prompt-lookup drafters propose only where the context holds a match, so some
        verify steps carry no draft at all (vLLM's ngram, ngram_gpu, suffix)."""
        return self.method in PROMPT_LOOKUP

    def k_for_batch(self, batch: int) -> int:
        if self.max_concurrency is not None and batch > self.max_concurrency:
            return 0
        for start, end, k in self.k_per_batch_size:
            if start <= batch <= end:
                return k
        return self.k


@dataclass(frozen=True)
class EngineConfig:
    engine: Engine
    model: str
    served_model_names: tuple[str, ...]
    speculation: Speculation | None
    max_model_len: int = 8192
    max_num_seqs: int = 256
    args: tuple[str, ...] = ()
    config_text: str = ""  # TensorRT-LLM: the extra_llm_api_options YAML text
    host: str | None = None
    port: int | None = None
    # vLLM
    api_keys: tuple[str, ...] = ()
    per_request_spec_decode_metrics: str = "none"  # none | summary | detailed
    enable_per_request_metrics: bool = False
    enable_force_include_usage: bool = False
    enable_auto_tool_choice: bool = False
    tool_call_parser: str | None = None
    enable_server_load_tracking: bool = False  # GET /load counts requests in flight
    shutdown_timeout: float | None = None  # on SIGTERM, seconds in-flight requests may finish
    # TensorRT-LLM
    backend: str = "pytorch"
    tp_size: int = 1
    return_perf_metrics: bool = False
    enable_iter_perf_stats: bool = False
    tool_parser: str | None = None
    extra_llm_api_options: dict[str, Any] = field(default_factory=dict)
    ignored_flags: tuple[str, ...] = ()

    @property
    def model_name(self) -> str:
        """The name the engine reports (first served name)."""
        return self.served_model_names[0]


# --------------------------------------------------------------------------- vLLM

_VLLM_METHOD_ALIASES = {
    "deepseek_mtp": "mtp",
    "mimo_mtp": "mtp",
    "glm4_moe_mtp": "mtp",
    "ernie_mtp": "mtp",
    "qwen3_next_mtp": "mtp",
    "longcat_flash_mtp": "mtp",
    "pangu_ultra_moe_mtp": "mtp",
}
_VLLM_METHODS = {
    "ngram",
    "ngram_gpu",
    "draft_model",
    "suffix",
    "custom_class",
    "eagle",
    "eagle3",
    "extract_hidden_states",
    "dflash",
    "dspark",
    "mtp",
}
_VLLM_NEEDS_MODEL = {"draft_model", "eagle", "eagle3", "dflash"}


def vllm_known_flags() -> frozenset[str]:
    """Every option string of vLLM 0.33.0's `vllm serve` parser."""
    return known_flags("vllm", "0.33.0")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:
        raise EngineArgsError(message)


def _normalize_flag(token: str) -> str:
    if not token.startswith("--"):
        return token
    name, eq, value = token.partition("=")
    return name.replace("_", "-") + eq + value


def _is_value(token: str) -> bool:
    """True if `token` reads as a flag's value rather than a flag."""
    if not token.startswith("-"):
        return True
    try:
        float(token)
        return True
    except ValueError:
        return False


def _leftovers(extras: list[str]) -> tuple[list[str], list[str]]:
    """Split argparse leftovers into unknown flags (with values) and stray positionals."""
    flags: list[str] = []
    strays: list[str] = []
    i = 0
    while i < len(extras):
        token = extras[i]
        if token.startswith("--"):
            flags.append(token.partition("=")[0])
            if "=" not in token and i + 1 < len(extras) and _is_value(extras[i + 1]):
                i += 1
        else:
            strays.append(token)
        i += 1
    return flags, strays


def _vllm_speculation(
    raw: str | None, method: str | None, model: str | None, tokens: int | None
) -> Speculation | None:
    conf: dict[str, Any] = {}
    if raw is not None:
        try:
            loaded = json.loads(raw)
        except json.JSONDecodeError as err:
            raise EngineArgsError(f"--speculative-config: invalid JSON: {err}") from None
        if not isinstance(loaded, dict):
            raise EngineArgsError("--speculative-config must be a JSON object")
        conf = loaded
    # the --spec-method / --spec-model / --spec-tokens shorthands fill in what is missing
    if method is not None:
        conf.setdefault("method", method)
    if model is not None:
        conf.setdefault("model", model)
    if tokens is not None:
        conf.setdefault("num_speculative_tokens", tokens)
    if not conf:
        return None
    configured = conf.get("method")
    draft = conf.get("model")
    if configured is None:
        if draft is None:
            raise EngineArgsError("speculative config needs a 'method' or a draft 'model'")
        name = str(draft).lower()
        configured = "eagle3" if "eagle3" in name else "eagle" if "eagle" in name else "draft_model"
    canonical = _VLLM_METHOD_ALIASES.get(str(configured), str(configured))
    if canonical.endswith("_mtp"):
        canonical = "mtp"
    if canonical not in _VLLM_METHODS:
        raise EngineArgsError(
            f"speculative config: unsupported method {configured!r} "
            f"(vLLM 0.33.0 knows {', '.join(sorted(_VLLM_METHODS))})"
        )
    if canonical in _VLLM_NEEDS_MODEL and not draft:
        raise EngineArgsError(f"speculative config: method {canonical!r} needs a draft 'model'")
    k = conf.get("num_speculative_tokens")
    if k is None and canonical == "mtp":
        k = 1
    if not isinstance(k, int) or isinstance(k, bool) or k <= 0:
        raise EngineArgsError("speculative config: num_speculative_tokens must be an integer > 0")
    schedule: list[tuple[int, int, int]] = []
    for entry in conf.get("num_speculative_tokens_per_batch_size") or []:
        if not (isinstance(entry, list | tuple) and len(entry) == 3):
            raise EngineArgsError(
                "speculative config: num_speculative_tokens_per_batch_size entries "
                "are [start, end, k]"
            )
        start, end, kk = (int(x) for x in entry)
        if kk < 0 or kk > k or start > end:
            raise EngineArgsError(f"speculative config: bad batch-size range {list(entry)}")
        schedule.append((start, end, kk))
    return Speculation(
        method=canonical,
        k=k,
        draft_model=str(draft) if draft else None,
        configured_method=str(configured),
        k_per_batch_size=tuple(schedule),
    )


def parse_vllm(
    argv: Sequence[str], *, lenient: bool = False, env: dict[str, str] | None = None
) -> EngineConfig:
    """Parse `vllm serve` container args (starting with the model)."""
    env = dict(os.environ) if env is None else env
    args = [_normalize_flag(a) for a in argv]
    model: str | None = None
    rest = args
    if args and not args[0].startswith("-"):
        model, rest = args[0], args[1:]

    p = _Parser(prog="vllm serve", add_help=False, allow_abbrev=False)
    p.add_argument("--model")
    p.add_argument("--served-model-name", nargs="+")
    p.add_argument("--speculative-config")
    p.add_argument("--spec-method")
    p.add_argument("--spec-model")
    p.add_argument("--spec-tokens", type=int)
    p.add_argument(
        "--per-request-spec-decode-metrics", choices=["none", "summary", "detailed"], default="none"
    )
    for name in (
        "per-request-metrics",
        "force-include-usage",
        "auto-tool-choice",
        "server-load-tracking",
    ):
        dest = f"enable_{name.replace('-', '_')}"
        p.add_argument(f"--enable-{name}", dest=dest, action="store_true", default=False)
        p.add_argument(f"--disable-{name}", dest=dest, action="store_false")
    p.add_argument("--tool-call-parser")
    p.add_argument("--shutdown-timeout", type=float)
    p.add_argument("--max-model-len", type=_int_with_suffix)
    p.add_argument("--max-num-seqs", type=int)
    p.add_argument("--tensor-parallel-size", type=int, default=1)
    p.add_argument("--api-key", action="append")
    p.add_argument("--host")
    p.add_argument("--port", type=int)
    ns, extras = p.parse_known_args(rest)

    flags, strays = _leftovers(extras)
    if strays:
        raise EngineArgsError(f"unrecognized arguments: {' '.join(strays)}")
    if not lenient:
        known = vllm_known_flags()
        unknown = [f for f in flags if f not in known]
        if unknown:
            raise EngineArgsError(
                f"unrecognized arguments: {' '.join(unknown)} (not a vLLM 0.33.0 flag)"
            )
    model = model or ns.model
    if not model:
        raise EngineArgsError("the model is required (first positional arg or --model)")

    spec = _vllm_speculation(ns.speculative_config, ns.spec_method, ns.spec_model, ns.spec_tokens)
    if ns.per_request_spec_decode_metrics != "none" and spec is None:
        raise EngineArgsError(
            "--per-request-spec-decode-metrics requires speculative decoding "
            "to be enabled (via --speculative-config)."
        )
    keys = tuple(ns.api_key or ())
    if not keys and env.get("VLLM_API_KEY"):
        keys = (env["VLLM_API_KEY"],)
    return EngineConfig(
        engine="vllm",
        model=model,
        served_model_names=tuple(ns.served_model_name or [model]),
        speculation=spec,
        max_model_len=ns.max_model_len or 8192,
        max_num_seqs=ns.max_num_seqs or 256,
        args=tuple(argv),
        host=ns.host,
        port=ns.port,
        api_keys=keys,
        per_request_spec_decode_metrics=ns.per_request_spec_decode_metrics,
        enable_per_request_metrics=ns.enable_per_request_metrics,
        enable_force_include_usage=ns.enable_force_include_usage,
        enable_auto_tool_choice=ns.enable_auto_tool_choice,
        tool_call_parser=ns.tool_call_parser,
        enable_server_load_tracking=ns.enable_server_load_tracking,
        shutdown_timeout=ns.shutdown_timeout,
        tp_size=ns.tensor_parallel_size,
        ignored_flags=tuple(flags),
    )


def _int_with_suffix(value: str) -> int:
    """vLLM accepts `--max-model-len 32k` / `1m` as well as plain integers."""
    v = value.strip().lower()
    mult = {"k": 1000, "m": 1000 * 1000}
    if v and v[-1] in mult:
        return int(float(v[:-1]) * mult[v[-1]])
    return int(v)


# ------------------------------------------------------------------ TensorRT-LLM

# 1.2.1's DecodingBaseConfig.from_dict dispatches on the exact decoding_type; anything else is
# "Invalid decoding type". `Eagle3` came later, with the discriminated-union configs (TensorRT-LLM
# PR 10124); in 1.2.1 `Eagle` is EAGLE-3 on the PyTorch backend, one- or two-model by
# eagle3_one_model.
_TRT_METHODS = {
    "Eagle": "eagle3",
    "MTP": "mtp",
    "NGram": "ngram",
    "DraftTarget": "draft_model",
    "Medusa": "medusa",
    "Lookahead": "lookahead",
}
_TRT_NOT_SIMULATED = {"SaveState", "UserProvided", "AUTO"}
_TRT_NEEDS_MODEL = {"eagle3", "draft_model"}
# Options proposed upstream but in no release (per-request stats: TensorRT-LLM PR 19311).
_TRT_UNRELEASED_KEYS = {"per_request_spec_decode_stats"}


def _trt_speculation(conf: Any) -> Speculation | None:
    if conf is None:
        return None
    if not isinstance(conf, dict):
        raise EngineArgsError("speculative_config must be a mapping")
    decoding_type = conf.get("decoding_type")
    if decoding_type in _TRT_NOT_SIMULATED:
        raise EngineArgsError(f"speculative_config.decoding_type: {decoding_type} not simulated")
    method = _TRT_METHODS.get(decoding_type) if isinstance(decoding_type, str) else None
    if method is None:
        raise EngineArgsError(f"Invalid decoding type: {decoding_type}")
    draft = conf.get("speculative_model") or conf.get("speculative_model_dir")
    if method in _TRT_NEEDS_MODEL and not draft:
        raise EngineArgsError(
            f"speculative_config: {decoding_type} needs speculative_model "
            "(or speculative_model_dir)"
        )
    k = conf.get("max_draft_len")
    if k is None and method == "mtp":
        k = conf.get("num_nextn_predict_layers", 1)
    if not isinstance(k, int) or isinstance(k, bool) or k <= 0:
        raise EngineArgsError("speculative_config.max_draft_len must be an integer > 0")
    max_concurrency = conf.get("max_concurrency")
    return Speculation(
        method=method,
        k=k,
        draft_model=str(draft) if draft else None,
        configured_method=str(decoding_type),
        max_concurrency=int(max_concurrency) if max_concurrency is not None else None,
        acceptance_gate=_trt_acceptance_gate(conf),
    )


def _trt_acceptance_gate(conf: dict[str, Any]) -> tuple[int, float] | None:
    """1.2.1 builds the gate for every decoding type (a window of 0 or none: no gate) but
    consults it only where a drafter runs beside the target model."""
    window = conf.get("acceptance_window")
    threshold = conf.get("acceptance_length_threshold")
    if window is not None and window < 0:
        raise EngineArgsError(f"acceptance_window must be >= 0 (0 disables), got {window}")
    if threshold is not None and threshold < 0:
        raise EngineArgsError(f"acceptance_length_threshold must be >= 0, got {threshold}")
    if not window or threshold is None or not runs_a_drafter(conf):
        return None
    return int(window), float(threshold)


def parse_trtllm(
    argv: Sequence[str], *, read_file: Callable[[str], str] | None = None
) -> EngineConfig:
    """Parse `trtllm-serve` args; `read_file` reads the extra_llm_api_options YAML."""
    read = read_file or (lambda path: Path(path).read_text())
    args = list(argv)
    if args and Path(args[0]).name == "trtllm-serve":
        args = args[1:]
    if args and args[0] == "serve":
        args = args[1:]

    p = _Parser(prog="trtllm-serve", add_help=False, allow_abbrev=False)
    p.add_argument("model", nargs="?")
    p.add_argument("--host")
    p.add_argument("--port", type=int)
    p.add_argument("--backend", default="pytorch")
    p.add_argument("--tp_size", type=int, default=1)
    p.add_argument("--max_batch_size", type=int)
    p.add_argument("--max_num_tokens", type=int)
    p.add_argument("--max_seq_len", type=int)
    p.add_argument("--kv_cache_free_gpu_memory_fraction", type=float)
    p.add_argument("--extra_llm_api_options", "--config", dest="extra_llm_api_options")
    p.add_argument("--served_model_name")
    p.add_argument("--tool_parser")
    ns, extras = p.parse_known_args(args)
    flags, strays = _leftovers(extras)
    if strays:
        raise EngineArgsError(f"Got unexpected extra arguments ({' '.join(strays)})")
    if not ns.model:
        raise EngineArgsError("Missing argument 'MODEL'.")

    options: dict[str, Any] = {}
    text = ""
    if ns.extra_llm_api_options:
        try:
            text = read(ns.extra_llm_api_options)
            loaded = yaml.safe_load(text)
        except (OSError, yaml.YAMLError) as err:
            raise EngineArgsError(f"--extra_llm_api_options: {err}") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise EngineArgsError("--extra_llm_api_options must hold a YAML mapping")
        options = loaded or {}

    for key in _TRT_UNRELEASED_KEYS & set(options):
        # the LLM args forbid unknown keys: the engine stops at start-up
        raise EngineArgsError(f"{key}: Extra inputs are not permitted (not a 1.2.1 option)")
    spec = _trt_speculation(options.get("speculative_config"))
    # YAML < CLI flags
    max_batch = ns.max_batch_size or options.get("max_batch_size") or 2048
    max_seq_len = ns.max_seq_len or options.get("max_seq_len") or 8192
    return EngineConfig(
        engine="tensorrt-llm",
        model=ns.model,
        served_model_names=(ns.served_model_name or ns.model,),
        speculation=spec,
        max_model_len=int(max_seq_len),
        max_num_seqs=int(max_batch),
        args=tuple(argv),
        config_text=text,
        host=ns.host,
        port=ns.port,
        backend=ns.backend,
        tp_size=ns.tp_size,
        return_perf_metrics=bool(options.get("return_perf_metrics", False)),
        enable_iter_perf_stats=bool(options.get("enable_iter_perf_stats", False)),
        tool_parser=ns.tool_parser,
        extra_llm_api_options=options,
        ignored_flags=tuple(flags),
    )


def parse_engine_args(
    engine: Engine, argv: Sequence[str], *, lenient: bool = False
) -> EngineConfig:
    if engine == "vllm":
        return parse_vllm(argv, lenient=lenient)
    return parse_trtllm(argv)


def warn_ignored(config: EngineConfig) -> None:
    for flag in config.ignored_flags:
        print(f"specfleet-testbed: accepted but not simulated: {flag}", file=sys.stderr)
