"""The gateway holds its configuration to the SpecModel's own rules on classes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from specfleet.api.spec import CLASS_RULES
from specfleet.gateway.config import ConfigError, load_gateway_config

CONFIG = {
    "specmodel": "m",
    "engine": "vllm",
    "servedName": "m",
    "classes": [{"name": "code"}, {"name": "chat"}],
    "defaultClass": "chat",
}


def written(tmp_path: Path, **patch: Any) -> Path:
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump({**CONFIG, **patch}))
    return path


def test_a_valid_configuration_loads(tmp_path: Path) -> None:
    assert load_gateway_config(written(tmp_path)).default_class == "chat"


@pytest.mark.parametrize(
    ("patch", "rule"),
    [
        ({"defaultClass": "prose"}, 0),
        ({"classes": [{"name": "chat"}, {"name": "chat"}]}, 1),
    ],
)
def test_a_configuration_the_crd_would_refuse_is_refused_with_its_message(
    tmp_path: Path, patch: dict[str, Any], rule: int
) -> None:
    with pytest.raises(ConfigError, match=CLASS_RULES[rule]["message"][:30]):
        load_gateway_config(written(tmp_path, **patch))
