"""Runs the chart's Argo CD health check as Lua 5.1 (Argo CD runs gopher-lua, a Lua 5.1)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lupa.lua51 import LuaRuntime

SCRIPT = (
    Path(__file__).resolve().parent.parent / "charts/specfleet/files/argocd-health.lua"
).read_text()


def health(obj: dict[str, Any], script: str = SCRIPT) -> dict[str, str]:
    lua = LuaRuntime(unpack_returned_tuples=True)
    assert lua.execute("return _VERSION") == "Lua 5.1"
    lua.globals().obj = _to_lua(lua, obj)
    result = lua.execute(script)
    return {"status": result["status"], "message": result["message"]}


def _to_lua(lua: LuaRuntime, value: Any) -> Any:
    if isinstance(value, dict):
        return lua.table_from({k: _to_lua(lua, v) for k, v in value.items()})
    if isinstance(value, list):
        return lua.table_from([_to_lua(lua, v) for v in value])
    return value
