"""`SpecModel.spec`: what Git declares. The CRD schema and `kubectl explain` text come from here."""

from __future__ import annotations

import math
from enum import StrEnum
from typing import Annotated, Any

from pydantic import ConfigDict, Field
from pydantic.config import JsonDict

from specfleet.api.base import (
    INT32_MAX,
    LABEL_VALUE,
    LABEL_VALUE_MAX_LENGTH,
    MAX_EXACT_INTEGER,
    QUANTITY,
    QUANTITY_MAX_LENGTH,
    SCRAPE_INTERVAL_SECONDS,
    ApiModel,
    cel,
    quantity_schema,
)
from specfleet.api.hardware import fp4_rules

VLLM_IMAGE = "vllm/vllm-openai:v0.33.0"
OFFICIAL_VLLM_IMAGE = "^(docker[.]io/)?vllm/vllm-openai([:@]|$)"
"""vLLM's own images, which lack `arctic-inference` (the `suffix` method); images/vllm adds it."""
MAX_IMAGE_LENGTH = 1024
MAX_MAP_ENTRIES = 64
"""Entries of a node selector or a resource list: bounds the API server's estimate of the cost
of the CEL rules that read each entry."""
MAX_DURATION_SECONDS = 365 * 86400
"""The longest guard pause: longer is the guard turned off, and a deadline `now + duration`
must stay a date Python can hold."""
TRTLLM_IMAGE = "nvcr.io/nvidia/tensorrt-llm/release:1.2.1"
ENGINE_VERSIONS = {"vllm": ("0.33.0", "0.32.0"), "tensorrt-llm": ("1.2.1",)}
"""The versions whose flags specfleet knows (api/flags/), the pinned one first: vLLM 0.32.0 is
the CPU build that runs here (its list printed by its own parser, hack/engine_flags.py)."""

FreeForm = dict[str, Any]
"""A Kubernetes object we pass through as it is (tolerations, affinity, env entries)."""


class Engine(StrEnum):
    VLLM = "vllm"
    TENSORRT_LLM = "tensorrt-llm"


class SpeculativeMethod(StrEnum):
    """Engine-neutral names; the renderer maps them to each engine's own vocabulary."""

    EAGLE3 = "eagle3"
    EAGLE = "eagle"
    DRAFT_MODEL = "draft_model"
    NGRAM = "ngram"
    MTP = "mtp"
    SUFFIX = "suffix"


DRAFT_MODEL_METHODS = ("eagle3", "eagle", "draft_model")
TRTLLM_METHODS = ("eagle3", "mtp", "ngram", "draft_model")

DEFAULT_PER_TOKEN_COMPUTE = 0.01
DEFAULT_DRAFT_COST: dict[str, float] = {
    "eagle3": 0.05,
    "eagle": 0.05,
    "draft_model": 0.15,
    "ngram": 0.01,
    "mtp": 0.05,
    "suffix": 0.01,
}
"""c: one draft forward's cost relative to one target forward, when the spec does not say."""


class WeightsFormat(StrEnum):
    NONE = "none"
    FP8 = "fp8"
    AWQ = "awq"
    GPTQ = "gptq"
    NVFP4 = "nvfp4"
    MXFP4 = "mxfp4"
    INT8 = "int8"


class KvCacheDtype(StrEnum):
    AUTO = "auto"
    FP8 = "fp8"
    FP8_E4M3 = "fp8_e4m3"
    FP8_E5M2 = "fp8_e5m2"


class GuardMode(StrEnum):
    AUTO = "auto"
    OFF = "off"
    ON = "on"


class EngineSpec(ApiModel):
    """Which inference engine serves the model."""

    name: Engine = Field(description="The engine: `vllm` or `tensorrt-llm`.")
    image: str | None = Field(
        default=None,
        max_length=MAX_IMAGE_LENGTH,
        description=(
            f"Engine container image. Defaults to the pinned image of the engine "
            f"(`{VLLM_IMAGE}` or `{TRTLLM_IMAGE}`). Speculative method suffix needs one with "
            f"arctic-inference (images/vllm)."
        ),
    )
    version: str | None = Field(
        default=None,
        max_length=64,
        description="Engine version the image runs: `extraArgs` are checked against its own "
        "flags. Defaults to the pinned version (0.33.0 for vllm, 1.2.1 for tensorrt-llm); "
        "vllm 0.32.0 is known too.",
    )
    max_batch_size: int = Field(
        default=256,
        ge=1,
        le=INT32_MAX,
        description="Most sequences batched at once (vllm `--max-num-seqs`, tensorrt-llm "
        "`--max_batch_size`).",
    )
    max_num_batched_tokens: int = Field(
        default=8192,
        ge=1,
        le=INT32_MAX,
        description="Most tokens per engine step (vllm `--max-num-batched-tokens`, tensorrt-llm "
        "`--max_num_tokens`).",
    )
    gpu_memory_fraction: float = Field(
        default=0.9,
        gt=0,
        le=1,
        description="vllm: share of GPU memory the engine may use (`--gpu-memory-utilization`); "
        "tensorrt-llm: share of free memory after weights for the KV cache.",
    )
    extra_args: list[str] = Field(
        default_factory=list,
        description="Escape hatch: arguments appended to the engine command line as they are. "
        "Every flag must be one the declared engine.version has, and none the operator sets "
        "itself (speculation, port, host, served name, parallelism, batch and memory limits, "
        "quantization, tool calls, stats, config files: the refusal names the field to use).",
    )
    extra_env: list[FreeForm] = Field(
        default_factory=list,
        description="Escape hatch: environment entries (Kubernetes EnvVar) added to the engine.",
        json_schema_extra={
            "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
        },
    )


class SecretKeyRef(ApiModel):
    name: str = Field(description="Secret name, in the SpecModel's namespace.", min_length=1)
    key: str = Field(description="Key within the Secret.", min_length=1)


class ModelCache(ApiModel):
    """Where downloaded weights and compile caches live. Exactly one of the two."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "has(self.persistentVolumeClaim) != has(self.emptyDirSizeLimit)",
                    "model.cache: set exactly one of persistentVolumeClaim or emptyDirSizeLimit",
                )
            ]
        }
    )

    persistent_volume_claim: str | None = Field(
        default=None, description="Name of an existing PVC to mount as the model cache."
    )
    empty_dir_size_limit: str | None = Field(
        default=None,
        max_length=QUANTITY_MAX_LENGTH,
        description="Use a node-local emptyDir of this size (e.g. `200Gi`) as the model cache.",
        json_schema_extra=quantity_schema("model.cache.emptyDirSizeLimit", "200Gi"),
    )


class ModelSpec(ApiModel):
    """The model to serve."""

    source: str = Field(
        min_length=1,
        max_length=MAX_IMAGE_LENGTH,
        description="Hugging Face model id (`meta-llama/Llama-3.1-8B-Instruct`) or a path "
        "inside the container.",
    )
    revision: str | None = Field(
        default=None, description="Model revision (branch, tag or commit) to download."
    )
    served_name: str | None = Field(
        default=None,
        description="Name clients use in the `model` field. Defaults to the SpecModel's name.",
    )
    tensor_parallel_size: int = Field(
        default=1, ge=1, le=64, description="GPUs the model is sharded over (tensor parallelism)."
    )
    max_model_len: int | None = Field(
        default=None,
        ge=1,
        le=INT32_MAX,
        description="Maximum context length (prompt + output) in tokens.",
    )
    trust_remote_code: bool = Field(
        default=False, description="Allow the model repository's own Python code to run."
    )
    tool_call_parser: str | None = Field(
        default=None,
        description="vLLM tool-call parser (e.g. `llama3_json`, `hermes`); enables automatic "
        "tool choice so tool-call validity can be measured.",
    )
    hf_token_secret: SecretKeyRef | None = Field(
        default=None, description="Secret holding a Hugging Face token, passed as HF_TOKEN."
    )
    cache: ModelCache | None = Field(
        default=None, description="Model cache volume. Without it, weights download per pod."
    )


WEIGHTS_HINTS = {
    "fp8": "fp8",
    "awq": "awq",
    "gptq": "gptq",
    "nvfp4": "nvfp4|fp4",
    "mxfp4": "mxfp4|gpt-oss",
    "int8": "int8|w8a8",
}
"""How a pre-quantized checkpoint's name says its format (`RedHatAI/Meta-Llama-3.1-8B-Instruct-FP8`,
`...-AWQ-INT4`, `nvidia/...-FP4`, `openai/gpt-oss-20b`), case aside."""


def _weights_named_rule() -> JsonDict:
    named = " || ".join(
        f"(self.quantization.weights == '{weights}' && self.model.source.matches('(?i)({hint})'))"
        for weights, hint in WEIGHTS_HINTS.items()
    )
    return cel(
        "self.quantization.weights == 'none' || self.quantization.online || "
        f"self.quantization.preQuantized || {named}",
        "quantization.weights is declared but nothing makes it true",
        ".quantization.weights",
        "'quantization.weights is declared but nothing makes it true: model.source ' + "
        "self.model.source + ' does not name ' + self.quantization.weights + ' weights and no "
        "flag quantizes at load. Set quantization.online: true to quantize a BF16 checkpoint "
        "(vllm, fp8), point model.source at a checkpoint in that format, or state that this "
        "one is with quantization.preQuantized: true'",
    )


class QuantizationSpec(ApiModel):
    """How the weights and the KV cache are stored."""

    weights: WeightsFormat = Field(
        default=WeightsFormat.NONE,
        description="Format of the served weights: `none` (the checkpoint's own BF16/FP16), "
        "`fp8`, `awq`, `gptq`, `nvfp4`, `mxfp4` or `int8`. A pre-quantized checkpoint carries "
        "its format and is detected by the engine; this field declares it.",
    )
    online: bool = Field(
        default=False,
        description="Quantize a BF16 checkpoint to FP8 at load time (vLLM only, weights: fp8).",
    )
    pre_quantized: bool = Field(
        default=False,
        description="The checkpoint at model.source is already in the declared weights format "
        "although its name does not say so (the engine reads the format from it). Without this, "
        "online or a name that says the format, declared weights are refused.",
    )
    kv_cache_dtype: KvCacheDtype = Field(
        default=KvCacheDtype.AUTO,
        description="KV-cache data type: `auto` (the model's dtype) or an FP8 variant.",
    )


class NgramSpec(ApiModel):
    """Prompt-lookup (n-gram) drafting."""

    min_match: int = Field(default=1, ge=1, le=16, description="Shortest n-gram to look up.")
    max_match: int = Field(default=4, ge=1, le=16, description="Longest n-gram to look up.")


class DepthStep(ApiModel):
    """Speculation depth for one range of batch sizes (inclusive)."""

    min_batch_size: int = Field(ge=1, le=INT32_MAX, description="First batch size of the range.")
    max_batch_size: int = Field(ge=1, le=INT32_MAX, description="Last batch size of the range.")
    num_speculative_tokens: int = Field(
        ge=0, le=16, description="Draft tokens per step in this range; 0 turns speculation off."
    )


class SpeculativeSpec(ApiModel):
    """Speculative decoding. Omit the whole block to serve without speculation."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "!(self.method in ['eagle3', 'eagle', 'draft_model']) || has(self.draftModel)",
                    "speculative.draftModel is required for methods eagle3, eagle and draft_model",
                    ".draftModel",
                ),
                cel(
                    "self.method in ['eagle3', 'eagle', 'draft_model'] || !has(self.draftModel)",
                    "speculative.draftModel must be empty for methods ngram, mtp and suffix: "
                    "they draft without a separate model",
                    ".draftModel",
                ),
                cel(
                    "self.method == 'ngram' || !has(self.ngram)",
                    "speculative.ngram applies only to method ngram",
                    ".ngram",
                ),
                cel(
                    "!has(self.ngram) || self.ngram.minMatch <= self.ngram.maxMatch",
                    "speculative.ngram.minMatch must not exceed maxMatch",
                    ".ngram.minMatch",
                ),
                cel(
                    "!has(self.depthSchedule) || self.depthSchedule.all(s, "
                    "s.minBatchSize <= s.maxBatchSize)",
                    "speculative.depthSchedule: each step needs minBatchSize <= maxBatchSize",
                    ".depthSchedule",
                ),
                cel(
                    "!has(self.depthSchedule) || self.depthSchedule.all(s, "
                    "s.numSpeculativeTokens <= self.numSpeculativeTokens)",
                    "speculative.depthSchedule: no step may draft more than "
                    "speculative.numSpeculativeTokens (vLLM sizes the drafter for that many and "
                    "does not start otherwise); raise numSpeculativeTokens or lower the step",
                    ".depthSchedule",
                ),
                cel(
                    "!has(self.depthSchedule) || self.depthSchedule.all(s, "
                    "self.depthSchedule.filter(t, t.minBatchSize <= s.maxBatchSize && "
                    "s.minBatchSize <= t.maxBatchSize).size() == 1)",
                    "speculative.depthSchedule: the batch-size ranges overlap, so a batch size "
                    "would have two depths; make each range start after the previous one ends",
                    ".depthSchedule",
                ),
            ]
        }
    )

    method: SpeculativeMethod = Field(
        description="Drafting method: `eagle3`, `eagle`, `draft_model`, `ngram`, `mtp` or "
        "`suffix`. On tensorrt-llm: eagle3 (Eagle, one-model), mtp (MTP), ngram (NGram), "
        "draft_model (DraftTarget)."
    )
    draft_model: str | None = Field(
        default=None,
        description="Draft model (HF id or path): the EAGLE head or the small draft model.",
    )
    num_speculative_tokens: int = Field(
        default=4, ge=1, le=16, description="k: draft tokens proposed per verify step."
    )
    draft_tensor_parallel_size: int | None = Field(
        default=None,
        ge=1,
        description="vLLM: tensor parallelism of the draft model, 1 or the target's.",
    )
    ngram: NgramSpec | None = Field(default=None, description="N-gram lookup settings.")
    depth_schedule: list[DepthStep] | None = Field(
        default=None,
        max_length=16,
        description="Load-dependent depth, k per batch-size range. vLLM: "
        "`num_speculative_tokens_per_batch_size`. tensorrt-llm: `draft_len_schedule`, with "
        "maxConcurrency folded in, on the two-model paths only; batch size 1 must draft the "
        "most there, so deeper steps are cut to its depth.",
    )
    max_concurrency: int | None = Field(
        default=None,
        ge=1,
        le=INT32_MAX,
        description="tensorrt-llm: no speculation above this batch size (`max_concurrency`).",
    )
    draft_cost: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="c: one draft forward's cost over one target forward, used by the guard's "
        "speedup model. Defaults by method (eagle3 0.05, draft_model 0.15, ngram 0.01). "
        "Changing it rolls no pods.",
    )
    step_overhead: float = Field(
        default=0.0,
        ge=0,
        le=1,
        description="o: what speculation being on costs every decode step, drafts or none, as a "
        "fraction of one target forward (drafter lookup, rejection sampler, verify bookkeeping); "
        "used by the guard's speedup model, tokens per step / (1 + o + drafts per step · c). "
        "With o > 0 a window that drafted nothing runs at 1 / (1 + o) and does not pay. "
        "0 (the default) assumes it free; fit it with bench/real_engine.py. Changing it rolls "
        "no pods.",
    )
    per_token_compute: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="g: how much one more token in a forward pass adds to its time, relative "
        "to a one-token forward; used by the guard's speedup model. A verify step over B "
        "requests runs B·(k+1) tokens, plain decoding B, so speculation loses at high load. "
        "0.01 means a forward costs twice a one-token forward at 100 tokens (where an 8B "
        "FP8 model on an H100 turns compute-bound), the default; 0 ignores load. Changing it rolls "
        "no pods.",
    )
    engine_options: FreeForm | None = Field(
        default=None,
        description="Escape hatch: keys merged as they are into the engine's speculative config; "
        "none the operator sets from a typed field (the method, the draft model, k, the draft's "
        "parallelism, n-gram sizes, the depth schedule, maxConcurrency: the refusal names the "
        "field to use), and on tensorrt-llm only keys its decoding config for the method has "
        "(it refuses others at start). "
        "tensorrt-llm 1.2.1: the acceptance gate (acceptance_window, acceptance_length_threshold; "
        "once tripped, speculation stays off until restart) acts only with a separate drafter "
        "(draft_model, ngram, eagle3 with eagle3_one_model: false, mtp with mtp_eagle_one_model: "
        "false) and is left out elsewhere.",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )

    def effective_draft_cost(self) -> float:
        return self.draft_cost if self.draft_cost is not None else DEFAULT_DRAFT_COST[self.method]

    def effective_per_token_compute(self) -> float:
        return (
            DEFAULT_PER_TOKEN_COMPUTE if self.per_token_compute is None else self.per_token_compute
        )


class ClassMatch(ApiModel):
    """Conditions a request must all meet to fall into a class. A request whose
    `x-specfleet-class` header names a class is always in that class."""

    headers: dict[str, str] | None = Field(
        default=None, description="Request headers and the exact values they must have."
    )
    path_prefixes: list[str] | None = Field(
        default=None, description="The request path must start with one of these."
    )
    models: list[str] | None = Field(
        default=None, description="The request's `model` must be one of these."
    )
    has_tools: bool | None = Field(
        default=None, description="true: the request offers tools; false: it offers none."
    )
    json_response: bool | None = Field(
        default=None,
        description="true: the request asks for JSON output (`response_format` json_object or "
        "json_schema); false: it does not.",
    )


class ClassSlo(ApiModel):
    """Per-class service level objectives the guard enforces."""

    min_acceptance_rate: float | None = Field(
        default=None, ge=0, le=1, description="Lowest acceptable draft acceptance rate."
    )
    max_p95_ttft_seconds: float | None = Field(
        default=None, gt=0, description="Highest acceptable p95 time to first token, seconds."
    )
    max_p95_tpot_seconds: float | None = Field(
        default=None, gt=0, description="Highest acceptable p95 time per output token, seconds."
    )
    min_tool_call_validity: float | None = Field(
        default=None, ge=0, le=1, description="Lowest acceptable share of valid tool calls."
    )
    min_structured_output_validity: float | None = Field(
        default=None, ge=0, le=1, description="Lowest acceptable share of valid JSON outputs."
    )
    max_truncation_rate: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="Highest acceptable share of answers cut off at their token limit "
        "(finish reason `length`: max_tokens or the context reached before the model finished).",
    )
    max_empty_answer_rate: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="Highest acceptable share of answers that finished with no content and no "
        "tool call (a reasoning model's thinking alone is no answer).",
    )


class PromptClass(ApiModel):
    """A kind of traffic judged on its own: acceptance, latency and quality per class."""

    name: str = Field(
        min_length=1,
        max_length=40,
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        description="Class name (lowercase, digits, dashes); the `class` metric label.",
    )
    match: ClassMatch | None = Field(
        default=None, description="Which requests belong here, beyond the class header."
    )
    slo: ClassSlo | None = Field(default=None, description="This class's SLOs.")
    critical: bool = Field(
        default=False,
        description="A critical class breaching its SLO is enough for the guard to act.",
    )


class AlertmanagerReceiver(ApiModel):
    url: str | None = Field(
        default=None, description="Alertmanager base URL, e.g. `http://alertmanager:9093`."
    )
    url_secret: SecretKeyRef | None = Field(
        default=None, description="Secret key holding the Alertmanager URL (wins over url)."
    )


class AlertReceivers(ApiModel):
    """Where the guard sends alerts, besides Kubernetes Events (always)."""

    alertmanager: AlertmanagerReceiver | None = Field(
        default=None, description="Alertmanager v2 API."
    )
    webhook_secret: SecretKeyRef | None = Field(
        default=None,
        description="Secret key holding a webhook URL that receives Slack-compatible JSON.",
    )


class GuardSpec(ApiModel):
    """How the guard judges speculation and new revisions."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "self.windowSeconds >= self.intervalSeconds",
                    "guard.windowSeconds must be at least guard.intervalSeconds: each "
                    "evaluation reads only its window, so a shorter one leaves time no "
                    "evaluation sees; lengthen the window or shorten the interval",
                    ".windowSeconds",
                )
            ]
        }
    )

    mode: GuardMode = Field(
        default=GuardMode.AUTO,
        description="`auto`: the guard switches speculation; `off`: speculation off; `on`: "
        "speculation on, the guard only alerts.",
    )
    classes_off: list[Annotated[str, Field(min_length=1, max_length=40)]] | None = Field(
        default=None,
        max_length=16,
        description="Classes served without speculation whatever the guard decides, while the "
        "others keep it: their requests go to the plain pool (`<name>-plain`) once it is "
        "Ready. Every class off is the fleet-wide switch, as `mode: off`. The "
        "`specfleet.dev/classes-off` annotation (comma-separated) wins over it.",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    route_classes: bool = Field(
        default=False,
        description="Answer a class whose own speculation does not pay (its speedup under "
        "minSpeedup, or its acceptance under its floor) by routing it to the plain pool "
        "(`<name>-plain`, its GPUs extra) while the other classes keep speculation, instead of "
        "switching speculation off for the whole fleet; it comes back by a trial that sends "
        "classTrialShare of it to the speculative fleet. The fleet-wide switch still answers when "
        "speculation does not pay for the fleet without it, or would leave no class on.",
    )
    class_trial_share: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description="The share of a routed class's requests its trial sends back to the "
        "speculative fleet (routeClasses): more decides sooner, and risks more of the class "
        "on speculation that may not pay.",
    )
    dry_run: bool = Field(default=False, description="Decide, record and alert, but never act.")
    interval_seconds: int = Field(default=15, ge=5, le=3600, description="Evaluation interval.")
    window_seconds: int = Field(
        default=60,
        ge=10,
        le=86400,
        description="Lookback window of each evaluation: at least intervalSeconds, and at least "
        f"two scrapes ({2 * SCRAPE_INTERVAL_SECONDS}) with monitoring.serviceMonitor.",
    )
    min_draft_tokens: int = Field(
        default=500,
        ge=1,
        le=MAX_EXACT_INTEGER,
        description="Fewer drafted tokens in a window is inconclusive.",
    )
    min_requests: int = Field(
        default=20,
        ge=1,
        le=MAX_EXACT_INTEGER,
        description="Fewer requests in a window is inconclusive; a class's mean TPOT from "
        "fewer streams is no measure of speedup (the speedup model stands in).",
    )
    consecutive_breaches: int = Field(
        default=3,
        ge=1,
        le=100,
        description="Bad evaluations in a row before acting (good ones before a trial passes). "
        "A decisive evaluation, its bound at errorRate outside the hysteresis band, acts "
        "alone.",
    )
    error_rate: float = Field(
        default=0.05,
        ge=0.001,
        le=0.2,
        description="The chance you accept that any one guard decision is wrong: every bound "
        "it acts on (acceptance, quality shares, error rates, the speedup) holds at this rate "
        "however often it looks. A smaller rate decides later, on more requests.",
    )
    probation_deadline_seconds: int = Field(
        default=7200,
        ge=60,
        le=MAX_DURATION_SECONDS,
        description="A revision on probation its evidence has not judged by then is kept, "
        "unproven (verdict `kept`, no rollback target), and the guard says so.",
    )
    trial_deadline_seconds: int = Field(
        default=1800,
        ge=60,
        le=MAX_DURATION_SECONDS,
        description="A trial its canary's evidence has not decided by then (from its start) "
        "ends failed inconclusive: the canary is removed, speculation stays off and the "
        "backoff is not doubled.",
    )
    min_speedup: float = Field(
        default=1.0,
        ge=0.5,
        le=10,
        description="Speculation must beat plain decoding by this factor (traffic-weighted).",
    )
    release_margin: float = Field(
        default=0.1,
        ge=0,
        le=5,
        description="Hysteresis: a trial re-enable must reach minSpeedup + releaseMargin. A "
        "window is decisive when its bound at errorRate is under minSpeedup - releaseMargin (or a "
        "critical class's acceptance under its floor by the same fraction) or, in a trial, "
        "at least minSpeedup + releaseMargin.",
    )
    cooldown_seconds: int = Field(
        default=60,
        ge=0,
        le=MAX_DURATION_SECONDS,
        description="Wait before a trial (speculation on a canary pod) after the kill switch.",
    )
    max_cooldown_seconds: int = Field(
        default=1800,
        ge=0,
        le=MAX_DURATION_SECONDS,
        description="Cap of the cooldown as it doubles on failed trials: every trial starts a "
        "GPU pod that loads the model's weights, so on a drafter that never fits about "
        "3600 / maxCooldownSeconds trials an hour.",
    )
    probation_seconds: int = Field(
        default=600,
        ge=0,
        le=MAX_DURATION_SECONDS,
        description="How long a new revision is judged against the last good.",
    )
    max_actions_per_hour: int = Field(
        default=6,
        ge=1,
        le=MAX_EXACT_INTEGER,
        description="More actions latch speculation off (`Flapping`).",
    )
    blind_after_seconds: int = Field(
        default=120,
        ge=0,
        le=MAX_DURATION_SECONDS,
        description="No data for this long raises `MetricsBlind`.",
    )
    alerts: AlertReceivers | None = Field(default=None, description="Alert receivers.")


class RolloutStrategy(StrEnum):
    CANARY = "canary"
    DIRECT = "direct"


MAX_ROLLOUT_STEPS = 10


class InconclusivePolicy(StrEnum):
    ABORT = "abort"
    PASS = "pass"


class RolloutStep(ApiModel):
    """One canary step: the new revision on `pods` pods beside the fleet on the control."""

    pods: int = Field(
        ge=1,
        le=1000,
        description="Pods running the new revision; the fleet's shrink by as many. Fewer than "
        "pod.replicas: the control must keep serving to be compared with.",
    )
    windows: int | None = Field(
        default=None,
        ge=1,
        le=100,
        description="Good conclusive windows before the step passes (at least one guard window "
        "of time); omitted means guard.consecutiveBreaches.",
    )


class RolloutSpec(ApiModel):
    """How a new revision reaches the fleet."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "!has(self.steps) || self.steps.all(a, "
                    "self.steps.filter(b, b.pods == a.pods).size() == 1)",
                    "rollout.steps: two steps run the same number of pods; give each step "
                    "more pods than the one before",
                    ".steps",
                )
            ]
        }
    )

    strategy: RolloutStrategy | None = Field(
        default=None,
        description="`canary`: a new revision serves on a few pods beside the fleet on the "
        "revision before it (the control), judged against it step by step, promoted or "
        "aborted; `direct`: the whole fleet rolls and probation judges it. Omitted: canary "
        "with pod.replicas >= 2, direct otherwise.",
    )
    step_deadline_seconds: int = Field(
        default=1800,
        ge=60,
        le=MAX_DURATION_SECONDS,
        description="A canary step its evidence has not decided by then ends as onInconclusive "
        "says.",
    )
    on_inconclusive: InconclusivePolicy = Field(
        default=InconclusivePolicy.ABORT,
        description="A canary step at its deadline: `abort` (the canary removed, the fleet stays "
        "on the control) or `pass` (the step passes unproven, and the guard says so).",
    )
    steps: list[RolloutStep] | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_ROLLOUT_STEPS,
        description="The canary's steps, in order of pods; after the last, the whole fleet "
        "(promotion). Omitted: 1 pod, then half the replicas.",
    )

    def resolved_strategy(self, replicas: int) -> RolloutStrategy:
        if self.strategy is not None:
            return RolloutStrategy(self.strategy)
        return RolloutStrategy.CANARY if replicas >= 2 else RolloutStrategy.DIRECT

    def resolved_steps(self, replicas: int, windows: int) -> list[RolloutStep]:
        """The steps as pod counts in increasing order, each with its windows."""
        if self.steps:
            chosen = sorted(self.steps, key=lambda s: s.pods)
        else:
            counts = sorted({1, replicas // 2} - {0})
            chosen = [RolloutStep(pods=n) for n in counts if n < replicas]
        return [RolloutStep(pods=s.pods, windows=s.windows or windows) for s in chosen]


class GpuSpec(ApiModel):
    count: int | None = Field(
        default=None,
        ge=1,
        le=MAX_EXACT_INTEGER,
        description="GPUs per pod. Defaults to model.tensorParallelSize.",
    )
    resource_name: str = Field(
        default="nvidia.com/gpu", description="Extended resource name of the GPU."
    )
    product: str | None = Field(
        default=None,
        max_length=LABEL_VALUE_MAX_LENGTH,
        description="GPU product to schedule on (node label `nvidia.com/gpu.product`, e.g. "
        "`NVIDIA-H100-80GB-HBM3`), as the node label has it. Checked against the weights: vllm "
        "serves nvfp4 and mxfp4 from Ampere on, tensorrt-llm nvfp4 on Blackwell and mxfp4 from "
        "Hopper on.",
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    f"self.matches('{LABEL_VALUE}')",
                    "pod.gpu.product becomes a node selector, so it must be a label value as "
                    "the node carries it: letters, digits, '-', '_' and '.', no spaces (write "
                    "NVIDIA GeForce RTX 5090 as NVIDIA-GeForce-RTX-5090)",
                )
            ]
        },
    )


def resource_list_schema(name: str) -> JsonDict:
    """`requests` or `limits`: resource names to quantities, as the API server types them
    (integer or string), each checked against the quantity grammar."""
    return {
        "type": "object",
        "description": f"Resource {name}: quantities by resource name.",
        "maxProperties": MAX_MAP_ENTRIES,
        "additionalProperties": {
            "x-kubernetes-int-or-string": True,
            "maxLength": QUANTITY_MAX_LENGTH,
            "x-kubernetes-validations": [
                cel(
                    "type(self) == int ? self >= 0 : "
                    f"type(self) == string && self.matches('{QUANTITY}')",
                    f"pod.resources.{name} values must be Kubernetes quantities: a whole number "
                    "or a string such as '500m' or '8Gi' (write half a CPU as '500m')",
                )
            ],
        },
    }


class PodSpec(ApiModel):
    """How engine pods are scheduled and shaped."""

    replicas: int = Field(default=1, ge=0, le=1000, description="Engine pods.")
    gpu: GpuSpec = Field(default_factory=GpuSpec, description="GPUs per pod.")
    node_selector: dict[str, str] | None = Field(
        default=None,
        max_length=MAX_MAP_ENTRIES,
        description="Node selector.",
        json_schema_extra={
            "additionalProperties": {"type": "string", "maxLength": LABEL_VALUE_MAX_LENGTH},
            "x-kubernetes-validations": [
                cel(
                    "self.all(k, self[k].size() <= "
                    f"{LABEL_VALUE_MAX_LENGTH} && self[k].matches('{LABEL_VALUE}'))",
                    "pod.nodeSelector values must be label values: at most 63 letters, digits, "
                    "'-', '_' and '.', starting and ending with a letter or digit, no spaces",
                )
            ],
        },
    )
    tolerations: list[FreeForm] | None = Field(
        default=None,
        description="Tolerations (Kubernetes Toleration objects).",
        json_schema_extra={
            "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
        },
    )
    affinity: FreeForm | None = Field(
        default=None,
        description="Affinity (Kubernetes Affinity object).",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )
    priority_class_name: str | None = Field(default=None, description="Priority class.")
    resources: FreeForm | None = Field(
        default=None,
        description="Extra engine container resources (cpu, memory); GPUs come from `gpu`.",
        json_schema_extra={
            "x-kubernetes-preserve-unknown-fields": True,
            "properties": {
                "requests": resource_list_schema("requests"),
                "limits": resource_list_schema("limits"),
            },
        },
    )
    annotations: dict[str, str] | None = Field(default=None, description="Pod annotations.")
    shm_size_limit: str = Field(
        default="16Gi",
        max_length=QUANTITY_MAX_LENGTH,
        description="Size limit of the memory-backed /dev/shm.",
        json_schema_extra=quantity_schema("pod.shmSizeLimit", "16Gi"),
    )
    termination_grace_period_seconds: int = Field(
        default=120,
        ge=0,
        le=MAX_EXACT_INTEGER,
        description=(
            "How long a stopping pod lives. It keeps serving for its preStop while endpoints "
            "drop it; then the gateway and the engine (vLLM) let in-flight requests, streams "
            "included, finish for what is left, less a few seconds to close connections."
        ),
    )


class PlainPoolSpec(ApiModel):
    """The plain pool: the active revision without any speculative config, serving the
    classes routed off speculation. Sized from their share of the traffic, within bounds."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "!has(self.maxReplicas) || self.minReplicas <= self.maxReplicas",
                    "plainPool.minReplicas must be at most plainPool.maxReplicas; lower the "
                    "one or raise the other",
                    ".minReplicas",
                )
            ]
        }
    )

    min_replicas: int = Field(
        default=0,
        ge=0,
        le=1000,
        description="Pods kept while every class speculates (a warm pool); at least one serves "
        "while a class is routed to it.",
    )
    max_replicas: int | None = Field(
        default=None, ge=1, le=1000, description="Most pods it grows to. Defaults to pod.replicas."
    )

    def replicas(self, share: float, fleet: int, routed: bool, held: int = 0) -> int:
        """Pods for `share` of the traffic (0..1) of a fleet of `fleet` pods, at least `held`,
        within bounds."""
        wanted = max(math.ceil(share * fleet - 1e-9), held) if routed else 0
        low = max(self.min_replicas, 1 if routed else 0)
        return max(low, min(wanted, self.max_replicas or max(fleet, 1)))


class MonitoringSpec(ApiModel):
    service_monitor: bool = Field(
        default=False,
        description="Render a ServiceMonitor for the gateways and a PodMonitor for the engines "
        "(the engine port is not on the Service; needs the Prometheus Operator).",
    )


CLASS_RULES = [
    cel(
        "self.classes.exists(c, c.name == self.defaultClass)",
        "defaultClass must name one of classes",
        ".defaultClass",
        "'defaultClass must name one of classes: there is no class ' + self.defaultClass + "
        "(self.defaultClass == 'default' ? ' (the default when defaultClass is not set)' : '') + "
        "'; set spec.defaultClass to one of them (e.g. ' + self.classes[0].name + ') or add a "
        "class named ' + self.defaultClass",
    ),
    cel(
        "self.classes.all(c, self.classes.filter(d, d.name == c.name).size() == 1)",
        "classes: two classes share a name; give each its own (the gateway refuses "
        "a config with duplicate class names)",
        ".classes",
    ),
]
"""The rules on `classes` and `defaultClass`; the gateway's configuration, which carries both,
is held to them too."""


CLASSES_OFF_RULES = [
    cel(
        "!has(self.guard.classesOff) || "
        "self.guard.classesOff.all(n, self.classes.exists(c, c.name == n))",
        "guard.classesOff must name classes of spec.classes",
        ".guard.classesOff",
        "'guard.classesOff must name classes of spec.classes: there is no class ' + "
        "self.guard.classesOff.filter(n, !self.classes.exists(c, c.name == n))[0] + "
        "'; remove it from guard.classesOff or add a class of that name to spec.classes'",
    ),
    cel(
        "has(self.speculative) || !has(self.guard.classesOff) || self.guard.classesOff.size() == 0",
        "guard.classesOff turns speculation off for some classes, but the spec declares no "
        "speculative decoding: every class already runs without; remove guard.classesOff or "
        "declare speculative",
        ".guard.classesOff",
    ),
]


class SpecModelSpec(ApiModel):
    """A model served by vLLM or TensorRT-LLM, its speculation, its prompt classes and SLOs."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "self.engine.name != 'tensorrt-llm' || !has(self.speculative) || "
                    "self.speculative.method in ['eagle3', 'mtp', 'ngram', 'draft_model']",
                    "speculative.method is not available on tensorrt-llm: use eagle3 (Eagle), "
                    "mtp (MTP), ngram (NGram) or draft_model (DraftTarget)",
                    ".speculative.method",
                ),
                cel(
                    "!has(self.speculative) || !has(self.speculative.draftTensorParallelSize) || "
                    "(self.engine.name == 'vllm' && "
                    "(self.speculative.draftTensorParallelSize == 1 || "
                    "self.speculative.draftTensorParallelSize == self.model.tensorParallelSize))",
                    "speculative.draftTensorParallelSize must be 1 or model.tensorParallelSize, "
                    "and is a vllm setting",
                    ".speculative.draftTensorParallelSize",
                ),
                cel(
                    "self.engine.name == 'tensorrt-llm' || !has(self.speculative) || "
                    "!has(self.speculative.maxConcurrency)",
                    "speculative.maxConcurrency is a tensorrt-llm setting; on vllm use "
                    "speculative.depthSchedule",
                    ".speculative.maxConcurrency",
                ),
                cel(
                    "!self.quantization.online || "
                    "(self.engine.name == 'vllm' && self.quantization.weights == 'fp8')",
                    "quantization.online works only on vllm with weights fp8; tensorrt-llm "
                    "serves pre-quantized checkpoints",
                    ".quantization.online",
                ),
                cel(
                    "self.engine.name == 'vllm' || "
                    "self.quantization.kvCacheDtype in ['auto', 'fp8']",
                    "quantization.kvCacheDtype on tensorrt-llm must be auto or fp8",
                    ".quantization.kvCacheDtype",
                ),
                cel(
                    "!has(self.pod.gpu.count) || "
                    "self.pod.gpu.count >= self.model.tensorParallelSize",
                    "pod.gpu.count must be at least model.tensorParallelSize",
                    ".pod.gpu.count",
                ),
                *CLASS_RULES,
                cel(
                    f"!has(self.engine.version) || "
                    f"(self.engine.name == 'vllm' && self.engine.version in "
                    f"{list(ENGINE_VERSIONS['vllm'])}) || "
                    f"(self.engine.name == 'tensorrt-llm' && self.engine.version in "
                    f"{list(ENGINE_VERSIONS['tensorrt-llm'])})",
                    "engine.version must be one whose flags specfleet knows: "
                    + "; ".join(f"{e} {', '.join(v)}" for e, v in ENGINE_VERSIONS.items())
                    + " (omit it for the pinned version)",
                    ".engine.version",
                ),
                _weights_named_rule(),
                cel(
                    "self.engine.name == 'vllm' || !has(self.model.toolCallParser)",
                    "model.toolCallParser is a vllm setting: trtllm-serve has no tool-call "
                    "parser flag, so it would be dropped; remove it",
                    ".model.toolCallParser",
                ),
                cel(
                    "has(self.speculative) || self.classes.all(c, !has(c.slo) || "
                    "!has(c.slo.minAcceptanceRate))",
                    "classes[].slo.minAcceptanceRate can never be judged without speculative "
                    "decoding: nothing is drafted; remove it or declare speculative",
                    ".classes",
                ),
                cel(
                    "self.engine.name != 'vllm' || !has(self.speculative) || "
                    "self.speculative.method != 'suffix' || (has(self.engine.image) && "
                    f"!self.engine.image.matches('{OFFICIAL_VLLM_IMAGE}'))",
                    "speculative.method suffix needs the arctic-inference package, which vLLM's "
                    "own image lacks: set engine.image to an image that adds it (images/vllm "
                    "builds one)",
                    ".speculative.method",
                ),
                cel(
                    "!self.monitoring.serviceMonitor || "
                    f"self.guard.windowSeconds >= {2 * SCRAPE_INTERVAL_SECONDS}",
                    f"guard.windowSeconds must be at least {2 * SCRAPE_INTERVAL_SECONDS} with "
                    f"monitoring.serviceMonitor: Prometheus scrapes every "
                    f"{SCRAPE_INTERVAL_SECONDS} s and increase() needs two samples in the window",
                    ".guard.windowSeconds",
                ),
                cel(
                    "!has(self.rollout) || !has(self.rollout.strategy) || "
                    "self.rollout.strategy != 'canary' || self.pod.replicas >= 2",
                    "rollout.strategy canary needs pod.replicas >= 2: the canary runs beside "
                    "the fleet on the revision before it, which must keep a pod to compare "
                    "with; use strategy direct or more replicas",
                    ".rollout.strategy",
                ),
                cel(
                    "!has(self.rollout) || !has(self.rollout.steps) || "
                    "self.rollout.steps.all(s, s.pods < self.pod.replicas)",
                    "rollout.steps: every step must run fewer pods than pod.replicas: the "
                    "fleet on the control keeps the rest and the last step is followed by the "
                    "whole fleet anyway (promotion)",
                    ".rollout.steps",
                ),
                *CLASSES_OFF_RULES,
                *fp4_rules(),
            ]
        }
    )

    engine: EngineSpec = Field(description="The inference engine.")
    model: ModelSpec = Field(description="The model to serve.")
    quantization: QuantizationSpec = Field(
        default_factory=QuantizationSpec, description="Weights and KV-cache formats."
    )
    speculative: SpeculativeSpec | None = Field(
        default=None, description="Speculative decoding; omit to serve without it."
    )
    classes: list[PromptClass] = Field(
        default_factory=lambda: [PromptClass(name="default")],
        min_length=1,
        max_length=16,
        description="Prompt classes, matched in order; acceptance and SLOs are per class.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    default_class: str = Field(
        default="default", max_length=40, description="Class of requests no rule matches."
    )
    guard: GuardSpec = Field(default_factory=GuardSpec, description="The guard's settings.")
    pod: PodSpec = Field(default_factory=PodSpec, description="Engine pods.")
    monitoring: MonitoringSpec = Field(
        default_factory=MonitoringSpec, description="Monitoring objects to render."
    )
    plain_pool: PlainPoolSpec = Field(
        default_factory=PlainPoolSpec,
        description="The pool that serves the classes routed off speculation (`<name>-plain`).",
    )
    rollout: RolloutSpec = Field(
        default_factory=RolloutSpec,
        description="How a new revision (a distinct engine config) reaches the fleet.",
    )
