"""``.keel/mcp.toml``: the MCP servers whose tools a run in this workspace is offered.

    [servers.files]                      # a server run over stdio
    command = ["python3", "files.py"]    # argv, run in the workspace (or ``cwd``)
    env = ["FILES_TOKEN"]                # the ONLY variables it gets from keel's
                                         # environment, by name (plus PATH, HOME, ...)
    [servers.tracker]                    # a server reached over streamable HTTP
    url = "http://127.0.0.1:8931/mcp"
    headers = { Authorization = "TRACKER_AUTH" }   # header -> variable holding its value
    timeout_seconds = 60                 # one call's limit (default 120)

    [servers.tracker.tools.search]       # per tool: how the harness treats it
    effect = "read"                      # default external
    recovery = "replay_safe"             # default manual

A server's tools are offered as ``mcp__SERVER__TOOL``. Pure: parses text, no I/O.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from typing import Any, Final

from keel.core.errors import ConfigError

MCP_FILE: Final = (".keel", "mcp.toml")
SERVER_NAME: Final = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]|_(?!_))*")  # no "__": it separates
ENV_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
HEADER_NAME: Final = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # an RFC 9110 token
EFFECTS: Final = ("read", "write", "execute", "external", "state")
RECOVERIES: Final = ("replay_safe", "idempotent", "manual")
DEFAULT_TIMEOUT_S: Final = 120.0
PREFIX: Final = "mcp__"


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolOverride:
    effect: str = "external"
    recovery: str = "manual"


@dataclass(frozen=True, slots=True, kw_only=True)
class McpServer:
    """One server entry: ``command`` (stdio) or ``url`` (streamable HTTP), never both."""

    name: str
    command: tuple[str, ...] = ()
    cwd: str | None = None  # relative to the workspace
    url: str | None = None
    env: tuple[str, ...] = ()  # variable names passed through
    headers: tuple[tuple[str, str], ...] = ()  # (header, variable name)
    timeout_s: float = DEFAULT_TIMEOUT_S
    tools: dict[str, ToolOverride] = field(default_factory=dict)

    def override(self, tool: str) -> ToolOverride:
        return self.tools.get(tool, ToolOverride())

    def tool_name(self, tool: str) -> str:
        """The name the model sees for the server's ``tool``."""
        return f"{PREFIX}{self.name}__{tool}"


def parse_mcp_config(text: str, source: str) -> tuple[McpServer, ...]:
    """The servers of an ``mcp.toml``; ConfigError ``SOURCE: servers.NAME.KEY: ...``."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: not valid TOML: {exc}") from None
    unknown = sorted(set(data) - {"servers"})
    if unknown:
        raise ConfigError(f"{source}: unknown key {unknown[0]!r}; the file has [servers.NAME] only")
    servers = data.get("servers", {})
    if not isinstance(servers, dict):
        raise ConfigError(f"{source}: servers must be a table of [servers.NAME]")
    return tuple(
        _server(name, entry, f"{source}: servers.{name}") for name, entry in servers.items()
    )


def _server(name: str, entry: Any, where: str) -> McpServer:
    if not SERVER_NAME.fullmatch(name) or len(name) > 32:
        raise ConfigError(f"{where}: a server name is 1-32 of A-Z a-z 0-9 - and single _ (no '__')")
    if not isinstance(entry, dict):
        raise ConfigError(f"{where}: must be a table")
    known = {"command", "cwd", "url", "env", "headers", "timeout_seconds", "tools"}
    extra = sorted(set(entry) - known)
    if extra:
        raise ConfigError(f"{where}: unknown key {extra[0]!r}; known: {', '.join(sorted(known))}")
    command = entry.get("command")
    url = entry.get("url")
    if (command is None) == (url is None):
        raise ConfigError(f"{where}: give either command = [argv...] (stdio) or url (HTTP)")
    argv: tuple[str, ...] = ()
    if command is not None:
        if (
            not isinstance(command, list)
            or not command
            or not all(isinstance(a, str) and a and "\x00" not in a for a in command)
        ):
            raise ConfigError(f"{where}.command: a non-empty list of non-empty strings (argv)")
        argv = tuple(command)
    if url is not None and (
        not isinstance(url, str)
        or not re.match(r"https?://[^\s/]+", url)
        or any(c.isspace() for c in url)
    ):
        raise ConfigError(f"{where}.url: an http:// or https:// URL")
    cwd = entry.get("cwd")
    if cwd is not None and (
        not isinstance(cwd, str) or cwd.startswith("/") or ".." in cwd.split("/")
    ):
        raise ConfigError(f"{where}.cwd: a path inside the workspace, relative to it")
    env = entry.get("env", [])
    if not isinstance(env, list) or not all(
        isinstance(n, str) and ENV_NAME.fullmatch(n) for n in env
    ):
        raise ConfigError(f"{where}.env: a list of environment variable names")
    headers = entry.get("headers", {})
    if not isinstance(headers, dict) or not all(
        isinstance(k, str)
        and HEADER_NAME.fullmatch(k)
        and isinstance(v, str)
        and ENV_NAME.fullmatch(v)
        for k, v in headers.items()
    ):
        raise ConfigError(
            f"{where}.headers: a table of header name = environment variable name "
            "(the value is read from the variable, never written in the file)"
        )
    timeout = entry.get("timeout_seconds", DEFAULT_TIMEOUT_S)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout <= 3600:
        raise ConfigError(f"{where}.timeout_seconds: a number of seconds above 0, at most 3600")
    return McpServer(
        name=name,
        command=argv,
        cwd=cwd,
        url=url,
        env=tuple(env),
        headers=tuple(sorted(headers.items())),
        timeout_s=float(timeout),
        tools=_overrides(entry.get("tools", {}), f"{where}.tools"),
    )


def _overrides(tools: Any, where: str) -> dict[str, ToolOverride]:
    if not isinstance(tools, dict):
        raise ConfigError(f"{where}: a table of [..tools.TOOL] tables")
    found: dict[str, ToolOverride] = {}
    for tool, entry in tools.items():
        at = f"{where}.{tool}"
        if not isinstance(entry, dict) or set(entry) - {"effect", "recovery"}:
            raise ConfigError(f"{at}: a table with effect and/or recovery only")
        effect = entry.get("effect", "external")
        recovery = entry.get("recovery", "manual")
        if effect not in EFFECTS:
            raise ConfigError(f"{at}.effect: one of {', '.join(EFFECTS)}")
        if recovery not in RECOVERIES:
            raise ConfigError(f"{at}.recovery: one of {', '.join(RECOVERIES)}")
        found[tool] = ToolOverride(effect=effect, recovery=recovery)
    return found
