"""Plain-document helpers shared by the renderer's self-description and the replay's inputs."""

from __future__ import annotations

import copy
from typing import Any


def merge(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """Deep merge: mappings merge key by key, anything else replaces."""
    out = copy.deepcopy(base)
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out
