"""The simulator reads the engines' real command lines."""

from __future__ import annotations

import json

import pytest

from specfleet_testbed.engine.args import (
    EngineArgsError,
    parse_trtllm,
    parse_vllm,
    vllm_known_flags,
)

EAGLE3 = json.dumps(
    {
        "method": "eagle3",
        "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
        "num_speculative_tokens": 4,
    }
)


def test_vllm_speculation_on() -> None:
    cfg = parse_vllm(
        [
            "meta-llama/Llama-3.1-8B-Instruct",
            "--served-model-name",
            "llama",
            "llama-alias",
            "--speculative-config",
            EAGLE3,
            "--per-request-spec-decode-metrics",
            "summary",
            "--enable-force-include-usage",
            "--port",
            "8000",
            "--tensor-parallel-size",
            "2",
        ],
        env={},
    )
    assert cfg.engine == "vllm"
    assert cfg.model == "meta-llama/Llama-3.1-8B-Instruct"
    assert cfg.served_model_names == ("llama", "llama-alias")
    assert cfg.model_name == "llama"
    assert cfg.speculation is not None
    assert (cfg.speculation.method, cfg.speculation.k) == ("eagle3", 4)
    assert cfg.speculation.draft_model == "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"
    assert cfg.per_request_spec_decode_metrics == "summary"
    assert cfg.enable_force_include_usage and not cfg.enable_per_request_metrics
    assert cfg.port == 8000
    assert cfg.tp_size == 2  # it names the system_fingerprint's layout
    assert cfg.ignored_flags == ()


def test_vllm_speculation_off_and_defaults() -> None:
    cfg = parse_vllm(["Qwen/Qwen3-8B", "--max-model-len", "32k", "--max_num_seqs=64"], env={})
    assert cfg.speculation is None
    assert cfg.served_model_names == ("Qwen/Qwen3-8B",)
    assert cfg.max_model_len == 32000 and cfg.max_num_seqs == 64
    assert cfg.per_request_spec_decode_metrics == "none"
    assert cfg.shutdown_timeout is None


def test_vllm_shutdown_timeout_is_simulated_not_ignored() -> None:
    cfg = parse_vllm(["m", "--shutdown-timeout", "105"], env={})
    assert cfg.shutdown_timeout == 105.0
    assert not cfg.ignored_flags


@pytest.mark.parametrize(
    ("conf", "method", "k"),
    [
        ({"method": "deepseek_mtp", "num_speculative_tokens": 1}, "mtp", 1),
        ({"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4}, "ngram", 5),
        ({"model": "org/eagle3-draft", "num_speculative_tokens": 3}, "eagle3", 3),
        ({"model": "org/small-draft", "num_speculative_tokens": 2}, "draft_model", 2),
    ],
)
def test_vllm_methods(conf: dict[str, object], method: str, k: int) -> None:
    cfg = parse_vllm(["m", "--speculative-config", json.dumps(conf)], env={})
    assert cfg.speculation is not None
    assert (cfg.speculation.method, cfg.speculation.k) == (method, k)


def test_vllm_spec_shorthand_flags_and_batch_schedule() -> None:
    cfg = parse_vllm(
        ["m", "--spec-method", "ngram", "--spec-tokens", "4"],
        env={},
    )
    assert cfg.speculation is not None and (cfg.speculation.method, cfg.speculation.k) == (
        "ngram",
        4,
    )
    sched = {
        "method": "ngram",
        "num_speculative_tokens": 4,
        "num_speculative_tokens_per_batch_size": [[1, 8, 4], [9, 64, 0]],
    }
    spec = parse_vllm(["m", "--speculative-config", json.dumps(sched)], env={}).speculation
    assert spec is not None
    assert [spec.k_for_batch(b) for b in (1, 8, 9, 100)] == [4, 4, 0, 4]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["m", "--per-request-spec-decode-metrics", "summary"], "requires speculative decoding"),
        (["serve", "m", "--port", "8000"], "unrecognized arguments: m"),
        (["m", "--not-a-vllm-flag", "1"], "--not-a-vllm-flag"),
        (["m", "--speculative-config", "{not json"], "invalid JSON"),
        (
            ["m", "--speculative-config", '{"method": "eagle3", "num_speculative_tokens": 4}'],
            "draft",
        ),
        (["m", "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 0}'], "> 0"),
        (
            [
                "m",
                "--speculative-config",
                '{"method": "medusa", "model": "x", "num_speculative_tokens": 2}',
            ],
            "unsupported method",
        ),
    ],
)
def test_vllm_refuses_what_vllm_refuses(argv: list[str], message: str) -> None:
    with pytest.raises(EngineArgsError, match=message):
        parse_vllm(argv, env={})


def test_vllm_lenient_and_negated_flags() -> None:
    cfg = parse_vllm(["m", "--not-a-vllm-flag", "x"], lenient=True, env={})
    assert cfg.ignored_flags == ("--not-a-vllm-flag",)
    real = ["--disable-log-requests", "--disable-prefix-caching", "--api-server-count", "2"]
    cfg = parse_vllm(["m", *real, "--no-enforce-eager", "--enable-per-request-metrics"], env={})
    assert cfg.enable_per_request_metrics
    cfg = parse_vllm(["m", "--enable-force-include-usage", "--disable-force-include-usage"], env={})
    assert not cfg.enable_force_include_usage


@pytest.mark.parametrize(
    "flag",
    # not options of the 0.33.0 parser (its --no-X pairs exist only where the list has them)
    [
        "--enable-mm-processor-stats",
        "--mamba-config",
        "--model-weights",
        "--no-enable-prefix-caching",
    ],
)
def test_vllm_refuses_flags_the_real_parser_lacks(flag: str) -> None:
    with pytest.raises(EngineArgsError, match=flag):
        parse_vllm(["m", flag], env={})


def testvllm_known_flags_are_the_real_parsers_option_set() -> None:
    """The simulator reads the one copy of the real parser's options; it has every flag the
    renderer relies on and the pairs a hand-made list missed."""
    known = vllm_known_flags()
    assert len(known) == 410
    assert {"--headless", "--config", "--disable-log-requests", "--no-trust-remote-code"} <= known


def test_vllm_api_key_from_flag_or_env() -> None:
    assert parse_vllm(["m", "--api-key", "s3cret"], env={}).api_keys == ("s3cret",)
    assert parse_vllm(["m"], env={"VLLM_API_KEY": "envkey"}).api_keys == ("envkey",)
    assert parse_vllm(["m"], env={}).api_keys == ()


TRT_ARGS = [
    "meta-llama/Llama-3.1-8B-Instruct",
    "--host",
    "0.0.0.0",
    "--port",
    "8000",
    "--backend",
    "pytorch",
    "--tp_size",
    "2",
    "--max_batch_size",
    "64",
    "--max_num_tokens",
    "8192",
    "--max_seq_len",
    "16384",
    "--kv_cache_free_gpu_memory_fraction",
    "0.9",
    "--extra_llm_api_options",
    "/etc/specfleet/llm_api.yaml",
]

TRT_YAML = """
speculative_config:
  decoding_type: Eagle
  max_draft_len: 3
  speculative_model: yuhuili/EAGLE3-LLaMA3.1-Instruct-8B
return_perf_metrics: true
enable_iter_perf_stats: true
kv_cache_config: {dtype: fp8, free_gpu_memory_fraction: 0.9}
"""


@pytest.mark.parametrize("prefix", [[], ["trtllm-serve"], ["trtllm-serve", "serve"], ["serve"]])
def test_trtllm_speculation_from_yaml(prefix: list[str]) -> None:
    files = {"/etc/specfleet/llm_api.yaml": TRT_YAML}
    cfg = parse_trtllm([*prefix, *TRT_ARGS], read_file=files.__getitem__)
    assert cfg.engine == "tensorrt-llm"
    assert cfg.model == "meta-llama/Llama-3.1-8B-Instruct"
    assert cfg.speculation is not None
    assert (cfg.speculation.method, cfg.speculation.k) == ("eagle3", 3)
    assert cfg.return_perf_metrics and cfg.enable_iter_perf_stats
    assert (cfg.tp_size, cfg.max_num_seqs, cfg.max_model_len) == (2, 64, 16384)
    assert "decoding_type: Eagle" in cfg.config_text


def test_trtllm_config_alias_and_speculation_off() -> None:
    files = {"/c.yaml": "kv_cache_config: {dtype: fp8}\n"}
    cfg = parse_trtllm(["m", "--config", "/c.yaml"], read_file=files.__getitem__)
    assert cfg.speculation is None
    assert not cfg.return_perf_metrics and not cfg.enable_iter_perf_stats
    assert parse_trtllm(["m"]).speculation is None


@pytest.mark.parametrize(
    ("yaml_text", "method", "k"),
    [
        ("speculative_config: {decoding_type: MTP}", "mtp", 1),
        ("speculative_config: {decoding_type: MTP, max_draft_len: 3}", "mtp", 3),
        ("speculative_config: {decoding_type: NGram, max_draft_len: 4}", "ngram", 4),
        (
            "speculative_config: {decoding_type: DraftTarget, max_draft_len: 5,"
            " speculative_model: d}",
            "draft_model",
            5,
        ),
    ],
)
def test_trtllm_methods(yaml_text: str, method: str, k: int) -> None:
    cfg = parse_trtllm(["m", "--extra_llm_api_options", "/x"], read_file=lambda _: yaml_text)
    assert cfg.speculation is not None
    assert (cfg.speculation.method, cfg.speculation.k) == (method, k)


def test_trtllm_max_concurrency_turns_speculation_off_above_it() -> None:
    text = "speculative_config: {decoding_type: NGram, max_draft_len: 4, max_concurrency: 8}"
    spec = parse_trtllm(["m", "--config", "/x"], read_file=lambda _: text).speculation
    assert spec is not None
    assert spec.k_for_batch(8) == 4 and spec.k_for_batch(9) == 0


@pytest.mark.parametrize(
    ("yaml_text", "message"),
    [
        ("speculative_config: {decoding_type: Eagle, max_draft_len: 3}", "speculative_model"),
        # 1.2.1's DecodingBaseConfig.from_dict: exact names, no Eagle3 (it came after 1.2.1)
        ("speculative_config: {max_draft_len: 3}", "^Invalid decoding type: None$"),
        ("speculative_config: {decoding_type: Bogus, max_draft_len: 3}", "type: Bogus$"),
        (
            "speculative_config: {decoding_type: Eagle3, max_draft_len: 3, speculative_model: d}",
            "^Invalid decoding type: Eagle3$",
        ),
        ("speculative_config: {decoding_type: ngram, max_draft_len: 3}", "type: ngram$"),
        ("speculative_config: {decoding_type: AUTO}", "not simulated"),
        ("- a list", "mapping"),
        # proposed upstream, in no release: 1.2.1's LLM args forbid it
        ("per_request_spec_decode_stats: true", "Extra inputs are not permitted"),
    ],
)
def test_trtllm_bad_yaml(yaml_text: str, message: str) -> None:
    with pytest.raises(EngineArgsError, match=message):
        parse_trtllm(["m", "--config", "/x"], read_file=lambda _: yaml_text)


@pytest.mark.parametrize(
    ("speculative_config", "gate"),
    [
        ("decoding_type: NGram, max_draft_len: 4", (128, 1.5)),
        ("decoding_type: DraftTarget, max_draft_len: 4, speculative_model: d", (128, 1.5)),
        (
            "decoding_type: Eagle, max_draft_len: 4, speculative_model: d, eagle3_one_model: false",
            (128, 1.5),
        ),
        ("decoding_type: MTP, mtp_eagle_one_model: false", (128, 1.5)),
        # the draft runs inside the target's forward: the executor's gate never acts
        ("decoding_type: Eagle, max_draft_len: 4, speculative_model: d", None),
        ("decoding_type: MTP", None),
        ("decoding_type: MTP, mtp_eagle_one_model: false, use_mtp_vanilla: true", None),
    ],
)
def test_trtllm_acceptance_gate_where_a_drafter_runs(
    speculative_config: str, gate: tuple[int, float] | None
) -> None:
    text = (
        f"speculative_config: {{{speculative_config}, acceptance_window: 128,"
        " acceptance_length_threshold: 1.5}"
    )
    spec = parse_trtllm(["m", "--config", "/x"], read_file=lambda _: text).speculation
    assert spec is not None and spec.acceptance_gate == gate


@pytest.mark.parametrize(
    "keys", ["acceptance_window: 0, acceptance_length_threshold: 1.5", "acceptance_window: 128"]
)
def test_trtllm_no_acceptance_gate_without_a_window_and_a_threshold(keys: str) -> None:
    text = f"speculative_config: {{decoding_type: NGram, max_draft_len: 4, {keys}}}"
    spec = parse_trtllm(["m", "--config", "/x"], read_file=lambda _: text).speculation
    assert spec is not None and spec.acceptance_gate is None


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ("acceptance_window: -1", "acceptance_window must be >= 0"),
        ("acceptance_length_threshold: -0.5", "acceptance_length_threshold must be >= 0"),
    ],
)
def test_trtllm_negative_acceptance_gate_settings_stop_the_engine(keys: str, message: str) -> None:
    text = f"speculative_config: {{decoding_type: NGram, max_draft_len: 4, {keys}}}"
    with pytest.raises(EngineArgsError, match=message):
        parse_trtllm(["m", "--config", "/x"], read_file=lambda _: text)
