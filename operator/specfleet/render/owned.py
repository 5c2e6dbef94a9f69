"""What the operator owns on an engine's command line and in its speculative config, read off
the renderer's own output: every flag or key that a typed field or the operator sets, with the
field that sets it (`operator: why` where no field does). `make crd` writes it to
api/flags/owned.json, where validation refuses the escape hatches (`engine.extraArgs`,
`speculative.engineOptions`) that would carry one."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from specfleet.api.model import EngineConfig
from specfleet.api.spec import DRAFT_MODEL_METHODS, TRTLLM_METHODS, SpeculativeMethod
from specfleet.documents import merge
from specfleet.render import trtllm, vllm

OPERATOR = "operator: the gateway, the probes and telemetry rely on it"
SPECULATION = "speculative"
CONFIG_FILE = "operator: a config file could carry any flag the operator sets; use typed fields"

RELIED_ON: dict[str, dict[str, str]] = {
    "vllm": {
        "--host": OPERATOR,
        "--model": "model.source",
        "--uds": OPERATOR,
        "--headless": OPERATOR,
        "--api-key": OPERATOR,
        "--ssl-keyfile": OPERATOR,
        "--ssl-certfile": OPERATOR,
        "--root-path": OPERATOR,
        "--disable-log-stats": "operator: it removes the vllm:* series the guard reads",
        "--config": CONFIG_FILE,
        "--quantization-config": "quantization.weights",
        "--shutdown-timeout": "pod.terminationGracePeriodSeconds",
    },
    "tensorrt-llm": {
        "--config": CONFIG_FILE,
    },
}
"""Flags the renderer never writes but whose presence would undo what it wrote or what the
gateway and telemetry rely on."""

FLAG_ALIASES: dict[str, dict[str, str]] = {
    "vllm": {},
    "tensorrt-llm": {
        "--tensor_parallel_size": "--tp_size",
        "--free_gpu_memory_fraction": "--kv_cache_free_gpu_memory_fraction",
    },
}
"""Other names of flags the renderer writes (trtllm-serve's click aliases)."""

KEY_ALIASES: dict[str, dict[str, str]] = {
    "vllm": {},
    "tensorrt-llm": {
        "speculative_model": "speculative_model_dir",
        "max_total_draft_tokens": "max_draft_len",
    },
}
"""Speculative-config keys the renderer never writes that set what one it writes sets: the
field's other name, or the drafts per step by another count."""

FIELD_CHANGES: list[tuple[str, dict[str, Any]]] = [
    ("model.servedName", {"model": {"servedName": "other"}}),
    ("model.maxModelLen", {"model": {"maxModelLen": 4096}}),
    ("model.revision", {"model": {"revision": "r1"}}),
    ("model.trustRemoteCode", {"model": {"trustRemoteCode": True}}),
    ("model.toolCallParser", {"model": {"toolCallParser": "hermes"}}),
    ("model.tensorParallelSize", {"model": {"tensorParallelSize": 2}}),
    ("engine.maxBatchSize", {"engine": {"maxBatchSize": 7}}),
    ("engine.maxNumBatchedTokens", {"engine": {"maxNumBatchedTokens": 777}}),
    ("engine.gpuMemoryFraction", {"engine": {"gpuMemoryFraction": 0.5}}),
    ("quantization.weights", {"quantization": {"weights": "fp8", "online": True}}),
    ("quantization.kvCacheDtype", {"quantization": {"kvCacheDtype": "fp8"}}),
    ("speculative.numSpeculativeTokens", {"speculative": {"numSpeculativeTokens": 2}}),
    ("speculative.draftModel", {"speculative": {"draftModel": "other/draft"}}),
    ("speculative.draftTensorParallelSize", {"speculative": {"draftTensorParallelSize": 1}}),
    ("speculative.ngram", {"speculative": {"ngram": {"minMatch": 2, "maxMatch": 3}}}),
    (
        "speculative.depthSchedule",
        {
            "speculative": {
                "depthSchedule": [{"minBatchSize": 2, "maxBatchSize": 8, "numSpeculativeTokens": 1}]
            }
        },
    ),
    ("speculative.maxConcurrency", {"speculative": {"maxConcurrency": 8}}),
]
"""A change of each typed field that reaches the engine: what it changes is what it owns."""


def owned() -> dict[str, dict[str, dict[str, str]]]:
    """Per engine: `flags` (command-line flag -> the field to use instead) and
    `speculativeConfig` (key of the speculative config -> the field to use instead)."""
    return {engine: _owned_by(engine) for engine in ("vllm", "tensorrt-llm")}


def _owned_by(engine: str) -> dict[str, dict[str, str]]:
    flags: dict[str, str] = {}
    keys: dict[str, str] = {}
    speculating: dict[str, dict[str, Any]] = {}
    for method in _methods(engine):
        base = _launch(engine, _base(engine, method), speculation=True)
        speculating[method] = base[1]
        plain = _launch(engine, _base(engine, method), speculation=False)
        flags |= dict.fromkeys(_differing(plain[0], base[0]) - flags.keys(), SPECULATION)
        for field, change in FIELD_CHANGES:
            changed = _launch(engine, merge(_base(engine, method), change), speculation=True)
            flags |= dict.fromkeys(_differing(base[0], changed[0]) - flags.keys(), field)
            keys |= dict.fromkeys(_differing(base[1], changed[1]) - keys.keys(), field)
        flags |= dict.fromkeys(base[0].keys() - flags.keys(), OPERATOR)
    keys |= dict.fromkeys(_naming_the_method(speculating) - keys.keys(), "speculative.method")
    keys |= {alias: keys[key] for alias, key in KEY_ALIASES[engine].items()}
    flags |= {alias: flags[flag] for alias, flag in FLAG_ALIASES[engine].items()}
    return {
        "flags": dict(sorted((flags | RELIED_ON[engine]).items())),
        "speculativeConfig": dict(sorted(keys.items())),
    }


def _naming_the_method(configs: dict[str, dict[str, Any]]) -> set[str]:
    """The keys whose value differs between two methods that both set them."""
    return {
        key
        for one, first in configs.items()
        for other, second in configs.items()
        for key in first.keys() & second.keys()
        if one != other and first[key] != second[key]
    }


def _methods(engine: str) -> list[str]:
    return list(TRTLLM_METHODS) if engine == "tensorrt-llm" else list(SpeculativeMethod)


def _base(engine: str, method: str) -> dict[str, Any]:
    speculative: dict[str, Any] = {"method": method}
    if method in DRAFT_MODEL_METHODS:
        speculative["draftModel"] = "org/draft"
    return {
        "engine": {"name": engine},
        "model": {"source": "org/model"},
        "quantization": {},
        "speculative": speculative,
    }


def _launch(
    engine: str, config: dict[str, Any], speculation: bool
) -> tuple[dict[str, str], dict[str, Any]]:
    """The flags (flag -> its value, or '' for a switch) and the speculative config's keys."""
    parsed = EngineConfig.model_validate(config)
    if engine == "vllm":
        argv = vllm.args(parsed, parsed.model.served_name or "served", speculation)
        flags = dict(_flags(argv))
        speculative = json.loads(flags.get("--speculative-config") or "{}")
        return flags, speculative
    options = trtllm.llm_api_options(parsed, speculation)
    return dict(_flags(trtllm.args(parsed))), options.get("speculative_config", {})


def _flags(argv: list[str]) -> Iterator[tuple[str, str]]:
    for index, token in enumerate(argv):
        if token.startswith("--"):
            following = argv[index + 1] if index + 1 < len(argv) else "--"
            yield token, "" if following.startswith("--") else following


def _differing(before: dict[str, Any], after: dict[str, Any]) -> set[str]:
    return {key for key in before.keys() | after.keys() if before.get(key) != after.get(key)}


if __name__ == "__main__":
    print(json.dumps(owned(), indent=2, sort_keys=True))
