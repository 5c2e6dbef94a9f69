"""Loading the gateway's configuration, and reloading it when the file changes.

A ConfigMap volume update swaps a symlink (`..data`), so the file's inode changes even when the
path does not: the watcher compares (device, inode, mtime, size) of the resolved file every few
seconds. A new file that does not load is logged and the running configuration kept.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from specfleet.api import InvalidSpecModel, parse_specmodel
from specfleet.api.gateway import GatewayConfig
from specfleet.api.spec import CLASS_RULES
from specfleet.api.validation import cel_errors
from specfleet.render import fleet_gateway_config

log = logging.getLogger(__name__)

Loader = Callable[[Path], GatewayConfig]


class ConfigError(ValueError):
    """The file cannot be read or is not a valid configuration."""


def load_gateway_config(path: Path) -> GatewayConfig:
    """A GatewayConfig YAML file, as the renderer writes it (camelCase keys)."""
    try:
        config = GatewayConfig.model_validate(_read_yaml(path))
    except ValidationError as exc:
        raise ConfigError(f"{path}: {_errors(exc)}") from None
    _check_classes(config, path)
    return config


def load_specmodel_config(path: Path) -> GatewayConfig:
    """The configuration the renderer would write for a SpecModel YAML file."""
    document = _read_yaml(path)
    try:
        specmodel = parse_specmodel(document)
    except InvalidSpecModel as exc:
        raise ConfigError(f"{path}: {exc}") from None
    return fleet_gateway_config(specmodel)


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        document = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: {exc}") from None
    if not isinstance(document, dict):
        raise ConfigError(f"{path}: expected a YAML mapping")
    return document


def _errors(exc: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or '(root)'}: {e['msg']}" for e in exc.errors()
    )


def _check_classes(config: GatewayConfig, path: Path) -> None:
    """The SpecModel's rules on classes (its CEL rules, evaluated as admission would)."""
    rules = {"x-kubernetes-validations": CLASS_RULES}
    errors = [e.message for e in cel_errors(rules, config.to_wire(), "")]
    if errors:
        raise ConfigError(f"{path}: {'; '.join(errors)}")


def file_identity(path: Path) -> tuple[int, int, int, int] | None:
    try:
        st = path.stat()  # follows the ConfigMap's symlinks
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)


class ConfigWatcher:
    """Polls `path`; on a change, loads it and hands the new configuration to `apply`."""

    def __init__(
        self,
        path: Path,
        loader: Loader,
        apply: Callable[[GatewayConfig], None],
        on_error: Callable[[], None] = lambda: None,
        interval: float = 2.0,
    ) -> None:
        self.path = path
        self.loader = loader
        self.apply = apply
        self.on_error = on_error
        self.interval = interval
        self._seen = file_identity(path)

    def check(self) -> bool:
        """One poll; True when a new configuration was applied."""
        identity = file_identity(self.path)
        if identity is None or identity == self._seen:
            return False
        self._seen = identity
        try:
            config = self.loader(self.path)
        except ConfigError as exc:
            log.error("keeping the running configuration; the new one is invalid: %s", exc)
            self.on_error()
            return False
        self.apply(config)
        log.info("configuration reloaded from %s: classes %s", self.path, _names(config))
        return True

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                self.check()
            except Exception:
                log.exception("configuration reload failed")
                self.on_error()


def _names(config: GatewayConfig) -> list[str]:
    return [c.name for c in config.classes]
