"""The escape hatches may not undo the contract. `engine.extraArgs` and
`speculative.engineOptions` are refused when they carry a flag or key the operator owns (read
off the renderer's own output into flags/owned.json by `make crd`); extraArgs when a flag is not
one the declared engine version has (flags/<engine>-<version>.txt, its own parser's option
strings); engineOptions when a key is not one of that version's speculative config for the
method (flags/<engine>-<version>-speculative.yaml, where there is one). CEL cannot read these
lists cheaply, so `specfleet render`, the operator and the admission webhook refuse them; the
API server alone does not."""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterator
from functools import cache
from importlib import resources
from typing import Any

import yaml

from specfleet.api.spec import ENGINE_VERSIONS, SpecModelSpec

ARGS = "spec.engine.extraArgs"
OPTIONS = "spec.speculative.engineOptions"


def escape_hatch_errors(spec: SpecModelSpec) -> list[tuple[str, str]]:
    """(field path, message) for every flag of extraArgs and key of engineOptions that would
    undo a typed field or that the engine does not have."""
    engine = spec.engine.name
    version = spec.engine.version or ENGINE_VERSIONS[engine][0]  # another is refused by CEL
    errors = list(_extra_args_errors(spec.engine.extra_args, engine, version))
    speculative = spec.speculative
    if speculative is not None and speculative.engine_options:
        known = _known_options(engine, version, speculative.method)
        where = f"{engine} {version}'s speculative config for method {speculative.method}"
        errors += _engine_options_errors(speculative.engine_options, engine, where, known)
    return errors


def owned_flags(engine: str, version: str) -> dict[str, str]:
    """Flag -> what sets it instead: the renderer's flags, their on/off twins that `version`
    has and the flags whose presence would undo them."""
    flags: dict[str, str] = _owned()[engine]["flags"]
    known = known_flags(engine, version)
    twins = {twin: owner for flag, owner in flags.items() for twin in _twins(flag)}
    return flags | {twin: owner for twin, owner in twins.items() if twin in known}


def owned_options(engine: str) -> dict[str, str]:
    """Speculative-config key -> the typed field that sets it."""
    return dict(_owned()[engine]["speculativeConfig"])


def _extra_args_errors(args: list[str], engine: str, version: str) -> Iterator[tuple[str, str]]:
    owned = owned_flags(engine, version)
    known = known_flags(engine, version)
    for index, token in enumerate(args):
        flag = _flag_name(token, engine)
        if flag is None:
            continue
        path = f"{ARGS}[{index}]"
        if flag in owned:
            yield path, f"{flag} {_owned_by(owned[flag])}"
        elif known and flag not in known:
            yield path, f"{flag} is not a flag of {engine} {version}; {_suggest(flag, known)}"


def _engine_options_errors(
    options: dict[str, Any], engine: str, where: str, known: frozenset[str]
) -> Iterator[tuple[str, str]]:
    owned = owned_options(engine)
    for key in options:
        if key in owned:
            yield (
                f"{OPTIONS}.{key}",
                f"{key} is set from spec.{owned[key]}: remove it from engineOptions and set "
                "that field instead (the gateway and the guard read the field, not the option)",
            )
        elif known and key not in known:
            yield (
                f"{OPTIONS}.{key}",
                f"{key} is not a key of {where} (the engine refuses unknown keys at start); "
                + _suggest(key, known),
            )


def _flag_name(token: str, engine: str) -> str | None:
    """The option a command-line token names, as the engine's parser reads it, or None for a
    value. vLLM reads `--a_b` as `--a-b` and `--json-flag.key=v` as part of `--json-flag`."""
    if not token.startswith("-") or token[1:2].isdigit() or token in ("-", "--"):
        return None
    name = token.split("=", 1)[0]
    if engine == "vllm":
        name = "--" + name.lstrip("-").replace("_", "-").split(".", 1)[0]
    return name


def _twins(flag: str) -> list[str]:
    """The flags that turn `flag`'s switch the other way: --no-X, --enable-X / --disable-X."""
    name = flag.removeprefix("--")
    twins = [f"--no-{name}"]
    for on, off in (("enable-", "disable-"), ("disable-", "enable-")):
        if name.startswith(on):
            twins.append(f"--{off}{name.removeprefix(on)}")
    return twins


def _owned_by(owner: str) -> str:
    if owner.startswith("operator: "):
        return f"is the operator's ({owner.removeprefix('operator: ')}): remove it from extraArgs"
    return f"is set from spec.{owner}: remove it from extraArgs and set that field instead"


def _suggest(flag: str, known: frozenset[str]) -> str:
    close = difflib.get_close_matches(flag, sorted(known), n=1, cutoff=0.75)
    if close:
        return f"did you mean {close[0]}?"
    return "check its spelling against the engine's own --help for that version"


@cache
def _owned() -> dict[str, Any]:
    owned: dict[str, Any] = json.loads(
        (resources.files("specfleet.api") / "flags/owned.json").read_text()
    )
    return owned


@cache
def _known_options(engine: str, version: str, method: str) -> frozenset[str]:
    """The speculative config's keys for `method`, or none where specfleet has no list."""
    listed = resources.files("specfleet.api") / f"flags/{engine}-{version}-speculative.yaml"
    if not listed.is_file():
        return frozenset()
    keys = yaml.safe_load(listed.read_text())
    return frozenset(keys["base"] + keys[method])


@cache
def known_flags(engine: str, version: str) -> frozenset[str]:
    """The flags of that version, or none for a version without a list."""
    if version not in ENGINE_VERSIONS[engine]:
        return frozenset()
    text = (resources.files("specfleet.api") / f"flags/{engine}-{version}.txt").read_text()
    return frozenset(line.strip() for line in text.splitlines() if line.startswith("--"))
