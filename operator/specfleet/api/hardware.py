"""Which GPUs each engine serves FP4 weights on, as CEL rules on the spec.

A product is read as the GPU feature discovery label `nvidia.com/gpu.product` has it
(`NVIDIA-H100-80GB-HBM3`, `NVIDIA-GeForce-RTX-5090`) or as nvidia-smi prints it (spaces). A
product no pattern knows is never refused: only one whose architecture is known to lack the
engine's kernels is.

What the engines support (vLLM 0.33, TensorRT-LLM 1.2):
- vLLM serves NVFP4 natively on Blackwell and weight-only through Marlin FP4 kernels on
  compute capability 8.0 and up (`is_fp4_marlin_supported`); MXFP4 (gpt-oss) on Hopper and
  Blackwell, and on Ampere through Marlin MXFP4 (vLLM's gpt-oss recipe).
- TensorRT-LLM serves NVFP4 on Blackwell only (ModelOpt's support matrix: FP4 on Blackwell and
  later); gpt-oss's MXFP4 on Hopper and Blackwell (OpenAI's TensorRT-LLM guide).
"""

from __future__ import annotations

from pydantic.config import JsonDict

from specfleet.api.base import cel

GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"

ARCHITECTURES: list[tuple[str, str]] = [
    ("pre-Ampere", r"v100|t4|p100|p40|p4|p6|k80|m60|m40|titan|quadro|gtx|rtx[^a-z0-9]*20[0-9]{2}"),
    ("Ampere", r"a2|a10g?|a16|a30|a40|a100|a800|rtx[^a-z0-9]*a[0-9]{4}|rtx[^a-z0-9]*30[0-9]{2}"),
    ("Ada", r"l4|l20|l40s?|ada|rtx[^a-z0-9]*40[0-9]{2}"),
    ("Hopper", r"g?h(20|100|200|800)|hopper"),
    ("Blackwell", r"g?b(10|100|200|300)[a-z]?|blackwell|rtx[^a-z0-9]*(pro|50[0-9]{2})"),
]
"""Oldest first: product-name patterns (whole words of the product) of each architecture."""

FP4_SUPPORT: list[tuple[str, str, str]] = [
    ("vllm", "nvfp4", "Ampere"),
    ("vllm", "mxfp4", "Ampere"),
    ("tensorrt-llm", "nvfp4", "Blackwell"),
    ("tensorrt-llm", "mxfp4", "Hopper"),
]
"""(engine, weights, the oldest architecture the engine serves those weights on)."""

_NAMES = [name for name, _ in ARCHITECTURES]
_GIVEN = (
    f"(has(self.pod.gpu.product) || (has(self.pod.nodeSelector) && "
    f"'{GPU_PRODUCT_LABEL}' in self.pod.nodeSelector))"
)
_PRODUCT = (
    f"(has(self.pod.gpu.product) ? self.pod.gpu.product : "
    f"self.pod.nodeSelector['{GPU_PRODUCT_LABEL}'])"
)


def product_pattern(architectures: list[str]) -> str:
    """A case-insensitive RE2 (and Python) pattern: the product names one of these."""
    words = "|".join(pattern for name, pattern in ARCHITECTURES if name in architectures)
    return f"(?i)(^|[^a-z0-9])({words})([^a-z0-9]|$)"


def fp4_rules() -> list[JsonDict]:
    """One rule per (engine, FP4 format): pods placed on an older architecture are refused."""
    return [_fp4_rule(engine, weights, oldest) for engine, weights, oldest in FP4_SUPPORT]


def _fp4_rule(engine: str, weights: str, oldest: str) -> JsonDict:
    supported = _NAMES[_NAMES.index(oldest) :]
    older = _NAMES[: _NAMES.index(oldest)]
    applies = f"self.engine.name == '{engine}' && self.quantization.weights == '{weights}'"
    rule = (
        f"!({applies}) || !{_GIVEN} || {_PRODUCT}.matches('{product_pattern(supported)}') || "
        f"!{_PRODUCT}.matches('{product_pattern(older)}')"
    )
    since = (
        "a Blackwell GPU" if oldest == "Blackwell" else f"a GPU of the {oldest} generation or newer"
    )
    return cel(
        rule,
        f"quantization.weights {weights} on {engine} needs {since}, but pod.gpu.product "
        f"(or the {GPU_PRODUCT_LABEL} node selector) names an older one ({', '.join(older)}); "
        "use fp8 or awq weights, or place the pods on such GPUs",
        ".quantization.weights",
    )
