"""YAML in and out, the way people read it: multi-line strings as literal blocks; and the error
for an input that cannot be used."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import yaml


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def dump(document: Any) -> str:
    return yaml.dump(document, Dumper=_Dumper, sort_keys=False, width=100)


def dump_all(documents: Iterable[Any]) -> str:
    return yaml.dump_all(documents, Dumper=_Dumper, sort_keys=False, width=100)


class YamlError(ValueError):
    pass


class InputError(ValueError):
    """An input that cannot be used (a file, or an object read from the cluster): its source and
    every problem, each naming its field or line. The CLI refuses it (`refusal.refuse`)."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source, self.problems = source, problems
        super().__init__(f"{source}: " + "; ".join(problems))
