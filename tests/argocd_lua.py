"""Runs the chart's Argo CD Lua (the health check, the resource actions) as Argo CD does: Lua 5.1
(Argo CD runs gopher-lua, a Lua 5.1) in its sandbox, and for an action the patch it would send.

Argo CD's sandbox (util/lua/lua.go, oslib_safe.go): the base, package and table libraries, and
an `os` with only `time` and `date`, reached through `require("os")` (the global `os` is not set);
no `string` library and no string methods, no `math`, `io` or `debug`. The sandbox here gives a
script exactly that, so a script that passes here does not call what Argo CD lacks."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from lupa.lua51 import LuaRuntime, lua_type

FILES = Path(__file__).resolve().parent.parent / "charts/specfleet/files"
SCRIPT = (FILES / "argocd-health.lua").read_text()
ACTIONS = yaml.safe_load((FILES / "argocd-actions.yaml").read_text())
"""The value of argocd-cm's resource.customizations.actions.specfleet.dev_SpecModel."""
DISCOVERY: str = ACTIONS["discovery.lua"]
ACTION: dict[str, str] = {d["name"]: d["action.lua"] for d in ACTIONS["definitions"]}

SANDBOX = """
local base = {"assert", "error", "getmetatable", "ipairs", "next", "pairs", "pcall", "print",
  "rawequal", "rawget", "rawset", "select", "setmetatable", "tonumber", "tostring", "type",
  "unpack", "xpcall", "_VERSION"}
return function(source, obj, date)
  local safeOs = {time = os.time, date = date or os.date}
  local env = {obj = obj, table = table}
  for _, name in ipairs(base) do
    env[name] = _G[name]
  end
  env._G = env
  env.require = function(name)
    if name == "os" then
      return safeOs
    end
    error("module " .. name .. " not found")
  end
  local chunk = assert(loadstring(source))
  setfenv(chunk, env)
  debug.setmetatable("", nil)
  return chunk()
end
"""


def run(script: str, obj: dict[str, Any], date: Callable[[str], str] | None = None) -> Any:
    """The script's return value, as JSON-like Python (gopher-json decodes an empty table as []);
    `date` stands in for os.date (a clock the test sets)."""
    lua = LuaRuntime(unpack_returned_tuples=True)
    assert lua.execute("return _VERSION") == "Lua 5.1"
    return _from_lua(lua.execute(SANDBOX)(script, _to_lua(lua, obj), date))


def health(obj: dict[str, Any], script: str = SCRIPT) -> dict[str, str]:
    result = run(script, obj)
    return {"status": result["status"], "message": result["message"]}


def discover(obj: dict[str, Any]) -> dict[str, bool]:
    """Each action discovery.lua offers, and whether it is disabled."""
    return {name: bool(a.get("disabled", False)) for name, a in run(DISCOVERY, obj).items()}


def display_names(obj: dict[str, Any]) -> dict[str, str]:
    return {name: a["displayName"] for name, a in run(DISCOVERY, obj).items()}


def act(
    obj: dict[str, Any], action: str, date: Callable[[str], str] | None = None
) -> dict[str, Any]:
    """The JSON merge patch Argo CD sends for the action: CreateMergePatch(live, returned), the
    returned object first cleaned as Argo CD cleans it (an empty array where the live object has a
    map becomes that map again: cleanReturnedObj)."""
    returned = run(ACTION[action], obj, date)
    assert isinstance(returned, dict), f"{action} returned {returned!r}"
    patch: dict[str, Any] = merge_patch(obj, _clean(returned, obj))
    return patch


def merge_patch(old: Any, new: Any) -> Any:
    """RFC 7386: what turns `old` into `new`; None removes a key."""
    if not isinstance(old, dict) or not isinstance(new, dict):
        return new
    patch: dict[str, Any] = {k: None for k in old if k not in new}
    for key, value in new.items():
        if key not in old:
            patch[key] = value
        elif old[key] != value:
            patch[key] = merge_patch(old[key], value)
    return patch


def apply_patch(obj: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return patch
    result = dict(obj) if isinstance(obj, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = apply_patch(result.get(key), value)
    return result


def _clean(new: dict[str, Any], old: dict[str, Any]) -> dict[str, Any]:
    for key, before in old.items():
        after = new.get(key)
        if isinstance(after, dict) and isinstance(before, dict):
            new[key] = _clean(after, before)
        elif after == [] and isinstance(before, dict):
            new[key] = before
    return new


def _to_lua(lua: LuaRuntime, value: Any) -> Any:
    if isinstance(value, dict):
        return lua.table_from({k: _to_lua(lua, v) for k, v in value.items()})
    if isinstance(value, list):
        return lua.table_from([_to_lua(lua, v) for v in value])
    return value


def _from_lua(value: Any) -> Any:
    if lua_type(value) != "table":
        return value
    items = {k: _from_lua(v) for k, v in value.items()}
    if set(items) == set(range(1, len(items) + 1)):
        return [items[i] for i in range(1, len(items) + 1)]
    return items
