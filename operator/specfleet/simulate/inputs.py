"""Reading a SpecModel and a scenario into a `World`, with errors that name the field.

Each rollout's `spec` is deep-merged into the SpecModel's spec (a new generation) and validated
like `specfleet render` would; a patch that changes the engine config makes a new revision.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specfleet.api import InvalidSpecModel, SpecModel, parse_specmodel
from specfleet.api.manifests import load_manifests
from specfleet.documents import merge
from specfleet.render import revision_hash
from specfleet.scenario import Effects, Scenario, ScenarioError, load_scenario
from specfleet.scenario.timing import TimingModel
from specfleet.simulate.world import Revision, SpecChange, World
from specfleet.yamlio import InputError, YamlError


def load_specmodel_document(path: Path) -> dict[str, Any]:
    try:
        documents = load_manifests(path)
    except YamlError as exc:
        raise InputError(str(path), [str(exc)]) from None
    if len(documents) != 1:
        raise InputError(str(path), [f"expected one SpecModel, found {len(documents)}"])
    return documents[0]


def load_world(specmodel_path: Path, scenario_path: Path) -> World:
    document = load_specmodel_document(specmodel_path)
    try:
        scenario = load_scenario(scenario_path)
    except ScenarioError as exc:
        raise InputError(str(scenario_path), [str(exc)]) from None
    return build_world(document, scenario, str(specmodel_path), str(scenario_path))


def build_world(
    document: dict[str, Any],
    scenario: Scenario,
    specmodel_source: str = "specmodel",
    scenario_source: str = "scenario",
) -> World:
    specmodel = parse_document(document, specmodel_source)
    _check_classes(specmodel, scenario, scenario_source)
    changes = [SpecChange(0.0, specmodel, _config(specmodel))]
    revisions = {changes[0].config: _revision(specmodel, 1, 0.0, Effects())}
    environment: list[tuple[float, Effects]] = []
    notes: list[str] = []
    for index, rollout in enumerate(scenario.rollouts):
        document = _next_generation(document, rollout.spec)
        changed = parse_document(document, scenario_source, f"rollouts[{index}].spec → ")
        config = _config(changed)
        if config == changes[-1].config:
            environment.append((rollout.t, rollout.effects))
        elif config not in revisions:
            revisions[config] = _revision(changed, len(revisions) + 1, rollout.t, rollout.effects)
        else:
            notes.append(
                f"rollouts[{index}] returns to revision {revisions[config].number}: its effects "
                "are that revision's, the rollout's own are ignored"
            )
        changes.append(SpecChange(rollout.t, changed, config))
    return World(
        scenario=scenario,
        timing=_timing(scenario),
        changes=tuple(changes),
        revisions=revisions,
        environment=tuple(environment),
        structured=frozenset(
            c.name for c in specmodel.spec.classes if c.match and c.match.json_response
        ),
        notes=tuple(notes),
    )


def parse_document(document: dict[str, Any], source: str, where: str = "") -> SpecModel:
    try:
        return parse_specmodel(document)
    except InvalidSpecModel as exc:
        raise InputError(source, [f"{where}{e}" for e in exc.errors]) from None


def _check_classes(specmodel: SpecModel, scenario: Scenario, source: str) -> None:
    known = [c.name for c in specmodel.spec.classes]
    unknown = [name for name in scenario.classes if name not in known]
    if unknown:
        raise InputError(
            source,
            [
                f"classes.{name}: not a class of the SpecModel ({', '.join(known)})"
                for name in unknown
            ],
        )


def _config(specmodel: SpecModel) -> str:
    return revision_hash(specmodel.engine_config())


def _revision(specmodel: SpecModel, number: int, since: float, effects: Effects) -> Revision:
    speculative = specmodel.spec.speculative
    return Revision(
        config=_config(specmodel),
        number=number,
        since=since,
        k=speculative.num_speculative_tokens if speculative else 0,
        method=str(speculative.method) if speculative else None,
        max_batch=specmodel.spec.engine.max_batch_size,
        effects=effects,
    )


def _next_generation(document: dict[str, Any], spec_patch: dict[str, Any]) -> dict[str, Any]:
    merged = merge(document, {"spec": spec_patch})
    metadata = merged.setdefault("metadata", {})
    metadata["generation"] = int(metadata.get("generation") or 1) + 1
    return merged


def _timing(scenario: Scenario) -> TimingModel:
    overrides = scenario.timing
    return TimingModel().with_overrides(
        target_forward_ms=overrides.target_forward_ms,
        per_token_compute=overrides.per_token_compute,
        prefill_ms_per_token=overrides.prefill_ms_per_token,
        draft_cost=overrides.draft_cost,
        step_overhead=overrides.step_overhead,
    )
