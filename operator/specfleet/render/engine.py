"""What an engine module hands the workload renderer: how to launch and probe the engine."""

from __future__ import annotations

from dataclasses import dataclass, field

from specfleet.api.gateway import Drafting

ENGINE_PORT = 8000
MODEL_CACHE_PATH = "/models-cache"
ENGINE_CONFIG_PATH = "/etc/specfleet/engine"


@dataclass(frozen=True)
class EngineLaunch:
    image: str
    command: list[str] | None
    args: list[str]
    env: list[dict[str, object]]
    config_files: dict[str, str] = field(default_factory=dict)
    """Files for the `<name>-engine` ConfigMap, mounted at ENGINE_CONFIG_PATH."""
    startup_path: str = "/health"
    """What the startup probe asks once before the pod may serve; readiness and liveness ask
    /health, which an engine saturated with work still answers at once."""
    metrics_path: str = "/metrics"
    drafting: Drafting | None = None
    drain_flag: str | None = None
    """The engine's flag for how long in-flight requests may finish after SIGTERM (rendered from
    the pod's grace, as the gateway's drain is); None where the engine has no such flag."""
    """How the engine drafts, when the gateway must know it to count drafts (TensorRT-LLM)."""
