"""``.keel/hooks.toml``: the middleware a run in this workspace gets besides the Python ones.

    [middleware]
    use = ["audit"]                       # entry points of the ``keel.middleware`` group

    [write_size]                          # the built-in guard on written files
    max_bytes = 1_000_000                 # write_file content / edit_file new_text

    [[hooks]]                             # a command asked at one point
    name = "no-force-push"
    point = "before_tool"                 # before_model, after_model, before_tool,
                                          # after_tool, before_complete, on_event
    command = [".keel/hooks/check.py"]    # argv; its program lives under .keel/ or
                                          # outside the workspace
    tools = ["run_command"]               # before_tool/after_tool: only these tools
    timeout_seconds = 10                  # default 10; passing it is the hook's error
    on_error = "closed"                   # "closed" (deny) or "open" (ignored)
    order = 0                             # lower first; ties keep file order
    env = ["HOOK_TOKEN"]                  # the ONLY variables it gets by name (plus PATH...)

A hook reads the point's context as one JSON object on stdin and prints its decision
as one JSON object (``keel.core.middleware.decision_from_json``). Pure: parses text.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from typing import Any, Final

from keel.core.errors import ConfigError
from keel.core.middleware import Point

HOOKS_FILE: Final = (".keel", "hooks.toml")
HOOK_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
ENV_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
ENTRY_POINT_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
DEFAULT_TIMEOUT_S: Final = 10.0
MAX_TIMEOUT_S: Final = 600.0
TOOL_POINTS: Final = frozenset({Point.BEFORE_TOOL, Point.AFTER_TOOL})
HOOK_KEYS: Final = frozenset(
    {"name", "point", "command", "tools", "timeout_seconds", "on_error", "order", "env"}
)


@dataclass(frozen=True, slots=True, kw_only=True)
class HookEntry:
    """One ``[[hooks]]`` entry, checked."""

    name: str
    point: Point
    command: tuple[str, ...]
    tools: tuple[str, ...] | None = None  # None: every tool
    timeout_s: float = DEFAULT_TIMEOUT_S
    on_error: str = "closed"
    order: int = 0
    env: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class HooksConfig:
    """What a workspace's ``hooks.toml`` asks for (empty without the file)."""

    hooks: tuple[HookEntry, ...] = ()
    use: tuple[str, ...] = ()  # entry point names (group ``keel.middleware``)
    write_max_bytes: int | None = None  # the write-size guard; None: not enabled


def parse_hooks_config(text: str, source: str) -> HooksConfig:
    """The hooks of a ``hooks.toml``; ConfigError ``SOURCE: WHERE: what is wrong``."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: not valid TOML: {exc}") from None
    unknown = sorted(set(data) - {"hooks", "middleware", "write_size"})
    if unknown:
        raise ConfigError(
            f"{source}: unknown key {unknown[0]!r}; the file has [[hooks]], [middleware] "
            "and [write_size]"
        )
    entries = data.get("hooks", [])
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise ConfigError(f"{source}: hooks must be an array of [[hooks]] tables")
    hooks = tuple(_hook(entry, f"{source}: hooks[{i}]") for i, entry in enumerate(entries))
    names = [h.name for h in hooks]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(f"{source}: two hooks are named {twice[0]!r}; give each its own name")
    return HooksConfig(
        hooks=hooks,
        use=_use(data.get("middleware", {}), f"{source}: middleware"),
        write_max_bytes=_write_size(data.get("write_size"), f"{source}: write_size"),
    )


def _hook(entry: dict[str, Any], where: str) -> HookEntry:
    unknown = sorted(set(entry) - HOOK_KEYS)
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r}; expected {sorted(HOOK_KEYS)}")
    name = entry.get("name")
    if not isinstance(name, str) or not HOOK_NAME.fullmatch(name):
        raise ConfigError(f"{where}.name: letters, digits, '_', '.', '-' (at most 64)")
    where = f"{where} ({name})"
    try:
        point = Point(str(entry.get("point")))
    except ValueError:
        raise ConfigError(
            f"{where}.point: one of {', '.join(p.value for p in Point)}, got {entry.get('point')!r}"
        ) from None
    command = entry.get("command")
    if (
        not isinstance(command, list)
        or not command
        or not all(isinstance(a, str) and a and "\x00" not in a for a in command)
    ):
        raise ConfigError(f"{where}.command: a non-empty argv list of strings")
    tools = entry.get("tools")
    if tools is not None:
        if point not in TOOL_POINTS:
            raise ConfigError(f"{where}.tools: only for before_tool and after_tool hooks")
        if not isinstance(tools, list) or not all(isinstance(t, str) and t for t in tools):
            raise ConfigError(f"{where}.tools: a list of tool names")
    timeout = entry.get("timeout_seconds", DEFAULT_TIMEOUT_S)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise ConfigError(f"{where}.timeout_seconds: a number of seconds")
    if not 0 < timeout <= MAX_TIMEOUT_S:
        raise ConfigError(f"{where}.timeout_seconds: above 0 and at most {MAX_TIMEOUT_S:g}")
    on_error = entry.get("on_error", "closed")
    if on_error not in ("closed", "open"):
        raise ConfigError(f"{where}.on_error: 'closed' (deny) or 'open' (ignored)")
    order = entry.get("order", 0)
    if isinstance(order, bool) or not isinstance(order, int):
        raise ConfigError(f"{where}.order: a whole number")
    env = entry.get("env", [])
    if not isinstance(env, list) or not all(
        isinstance(v, str) and ENV_NAME.fullmatch(v) for v in env
    ):
        raise ConfigError(f"{where}.env: a list of environment variable names")
    return HookEntry(
        name=name,
        point=point,
        command=tuple(command),
        tools=None if tools is None else tuple(tools),
        timeout_s=float(timeout),
        on_error=on_error,
        order=order,
        env=tuple(env),
    )


def _use(table: Any, where: str) -> tuple[str, ...]:
    if not isinstance(table, dict) or set(table) - {"use"}:
        raise ConfigError(f"{where}: a table with use = [entry point names] only")
    use = table.get("use", [])
    if not isinstance(use, list) or not all(
        isinstance(n, str) and ENTRY_POINT_NAME.fullmatch(n) for n in use
    ):
        raise ConfigError(f"{where}.use: a list of entry point names (group keel.middleware)")
    return tuple(dict.fromkeys(use))


def _write_size(table: Any, where: str) -> int | None:
    if table is None:
        return None
    if not isinstance(table, dict) or set(table) != {"max_bytes"}:
        raise ConfigError(f"{where}: a table with max_bytes only")
    value = table["max_bytes"]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{where}.max_bytes: a whole number of bytes, 1 or more")
    return value


__all__ = ["HOOKS_FILE", "HookEntry", "HooksConfig", "parse_hooks_config"]
