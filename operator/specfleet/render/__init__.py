"""Pure rendering: (SpecModel, ServingPlan) -> the manifests the operator applies. No I/O."""

from __future__ import annotations

from collections.abc import Callable

from specfleet.api.model import EngineConfig, SpecModel
from specfleet.render import trtllm, vllm
from specfleet.render.engine import EngineLaunch
from specfleet.render.plan import RenderSettings, ServingPlan, revision_hash
from specfleet.render.workload import Manifest, Workload, deployment_and_configs, manifests

LAUNCHERS: dict[str, Callable[[EngineConfig, str, bool], EngineLaunch]] = {
    "vllm": vllm.launch,
    "tensorrt-llm": trtllm.launch,
}

__all__ = ["Manifest", "RenderSettings", "ServingPlan", "render", "revision_hash"]


def render(
    specmodel: SpecModel,
    plan: ServingPlan | None = None,
    settings: RenderSettings | None = None,
) -> list[Manifest]:
    """The children of `specmodel` as the plan says they run. `specmodel` must be valid
    (`specfleet.api.parse_specmodel`). A canary is rendered only for a config that speculates:
    without one there is nothing to try."""
    plan = plan or ServingPlan()
    config = plan.engine_config or specmodel.engine_config()
    settings = settings or RenderSettings()
    objects = manifests(_workload(specmodel, plan, config, settings))
    if plan.canary and config.speculative is not None:
        trial = plan.model_copy(update={"speculation": True})
        objects += deployment_and_configs(
            _workload(specmodel, trial, config, settings, canary=True)
        )
    return objects


def _workload(
    specmodel: SpecModel,
    plan: ServingPlan,
    config: EngineConfig,
    settings: RenderSettings,
    canary: bool = False,
) -> Workload:
    launch = LAUNCHERS[config.engine.name](config, specmodel.served_name(), plan.speculation)
    return Workload(
        specmodel=specmodel,
        plan=plan,
        config=config,
        revision_hash=revision_hash(config),
        launch=launch,
        settings=settings,
        canary=canary,
    )
