"""Pure rendering: (SpecModel, ServingPlan) -> the manifests the operator applies. No I/O."""

from __future__ import annotations

from collections.abc import Callable

from specfleet.api.gateway import GatewayConfig
from specfleet.api.model import EngineConfig, SpecModel
from specfleet.render import trtllm, vllm
from specfleet.render.engine import EngineLaunch
from specfleet.render.plain import plain_pool
from specfleet.render.plan import PlainPool, RenderSettings, ServingPlan, revision_hash
from specfleet.render.workload import (
    ArmOf,
    Manifest,
    Role,
    Workload,
    deployment_and_configs,
    gateway_config,
    manifests,
    monitors,
    service,
)

LAUNCHERS: dict[str, Callable[[EngineConfig, str, bool], EngineLaunch]] = {
    "vllm": vllm.launch,
    "tensorrt-llm": trtllm.launch,
}

__all__ = [
    "ArmOf",
    "Manifest",
    "PlainPool",
    "RenderSettings",
    "ServingPlan",
    "fleet_gateway_config",
    "render",
    "render_arm",
    "revision_hash",
]


def render(
    specmodel: SpecModel,
    plan: ServingPlan | None = None,
    settings: RenderSettings | None = None,
) -> list[Manifest]:
    """The children of `specmodel` as the plan says they run. `specmodel` must be valid
    (`specfleet.api.parse_specmodel`). A trial's canary is rendered only for a config that
    speculates: without one there is nothing to try. A rollout's canary runs the new revision's
    config with the fleet's speculation setting, so the two differ by the revision alone. The
    plain pool runs the active revision without speculation."""
    plan = plan or ServingPlan()
    config = plan.engine_config or specmodel.engine_config()
    settings = settings or RenderSettings()
    objects = manifests(_workload(specmodel, plan, config, settings))
    if plan.canary and config.speculative is not None:
        trial = plan.model_copy(update={"speculation": True})
        objects += deployment_and_configs(_workload(specmodel, trial, config, settings, Role.TRIAL))
    if plan.rollout is not None:
        step = plan.model_copy(update={"revision": plan.rollout.revision})
        objects += deployment_and_configs(
            _workload(specmodel, step, plan.rollout.engine_config, settings, Role.ROLLOUT)
        )
    if plan.plain is not None:
        plain = plan.model_copy(update={"speculation": False})
        objects += plain_pool(_workload(specmodel, plain, config, settings, Role.PLAIN))
    return objects


def fleet_gateway_config(specmodel: SpecModel) -> GatewayConfig:
    """The configuration a fresh fleet's gateways get (the first revision, speculation on): what
    `render` writes into the fleet's gateway ConfigMap."""
    plan = ServingPlan()
    workload = _workload(specmodel, plan, specmodel.engine_config(), RenderSettings())
    return gateway_config(workload)


def render_arm(
    specmodel: SpecModel, arm: ArmOf, settings: RenderSettings | None = None
) -> list[Manifest]:
    """An experiment's arm: `specmodel` is the arm's own (the overlaid spec, named
    `<experiment>-<arm>`), served as it is, with a Service of its own, monitors of its own when
    the SpecModel's are rendered (its own select only its pods), and no budget."""
    plan, config = ServingPlan(), specmodel.engine_config()
    workload = _workload(specmodel, plan, config, settings or RenderSettings(), Role.ARM, arm)
    return [*deployment_and_configs(workload), service(workload), *monitors(workload)]


def _workload(
    specmodel: SpecModel,
    plan: ServingPlan,
    config: EngineConfig,
    settings: RenderSettings,
    role: Role = Role.FLEET,
    arm: ArmOf | None = None,
) -> Workload:
    launch = LAUNCHERS[config.engine.name](config, specmodel.served_name(), plan.speculation)
    return Workload(
        specmodel=specmodel,
        plan=plan,
        config=config,
        revision_hash=revision_hash(config),
        launch=launch,
        settings=settings,
        role=role,
        arm=arm,
    )
