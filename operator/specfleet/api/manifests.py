"""Reads SpecModel manifests from YAML files a user hands `specfleet render`, bounded.

YAML aliases make a few bytes stand for an exponential tree ("billion laughs"): PyYAML builds it
as shared references at once, and whatever walks it afterwards (validation, rendering) hangs.
The file is composed first and its tree measured with every alias expanded; a file larger than
the API server would take, or a tree larger than any manifest needs, is refused before anything
walks it.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from specfleet.yamlio import YamlError

MAX_FILE_BYTES = 3 * 1024 * 1024
"""The API server's limit on a request body."""
MAX_NODES = 100_000
"""Values in a file once its aliases are expanded; far more than any SpecModel holds."""


def load_manifests(path: Path) -> list[dict[str, Any]]:
    """Every non-empty document of a YAML file; each must be a mapping."""
    try:
        text = _read(path)
        _refuse_alias_bombs(yaml.compose_all(text, Loader=yaml.SafeLoader))
        documents = [d for d in yaml.safe_load_all(text) if d is not None]
    except RecursionError:
        raise YamlError(f"{path}: nested too deeply") from None
    except (OSError, UnicodeDecodeError, yaml.YAMLError, YamlError) as exc:
        raise YamlError(f"{path}: {exc}") from None
    for index, document in enumerate(documents):
        if not isinstance(document, dict):
            raise YamlError(f"{path}: document {index + 1} is not a mapping")
    return documents


def _read(path: Path) -> str:
    with path.open("rb") as file:
        data = file.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise YamlError(f"larger than {MAX_FILE_BYTES} bytes, the API server's limit")
    return data.decode()


def _refuse_alias_bombs(documents: Iterable[yaml.Node]) -> None:
    """YamlError when the documents hold more than MAX_NODES values with their aliases
    expanded, or an alias inside the node it names."""
    sizes: dict[int, int] = {}
    total = 0
    for document in documents:
        total += _size(document, sizes, set())
        if total > MAX_NODES:
            raise YamlError(
                f"more than {MAX_NODES} values once its aliases (*name) are expanded; "
                "write the manifest out without nested aliases"
            )


def _size(node: yaml.Node, sizes: dict[int, int], open_nodes: set[int]) -> int:
    if id(node) in sizes:
        return sizes[id(node)]
    if id(node) in open_nodes:
        raise YamlError("an alias refers to a node that contains it")
    open_nodes.add(id(node))
    size = 1
    if isinstance(node, yaml.SequenceNode):
        size += sum(_size(item, sizes, open_nodes) for item in node.value)
    elif isinstance(node, yaml.MappingNode):
        size += sum(
            _size(k, sizes, open_nodes) + _size(v, sizes, open_nodes) for k, v in node.value
        )
    open_nodes.discard(id(node))
    sizes[id(node)] = min(size, MAX_NODES + 1)
    return sizes[id(node)]
