"""The tools one run is offered (``RunTools.for_run``), and the MCP connections behind them.

A run gets the harness's tools narrowed to its options' allowlist (a child's contract,
``keel run --tools``: an unlisted tool is unknown to it), ``load_skill`` only when it
has skills, and the tools of its workspace's MCP servers (``.keel/mcp.toml``; not for
subagents). MCP servers are connected once per process and workspace, and again when
the file changed; ``close`` stops them.
"""

from __future__ import annotations

import threading
from pathlib import Path

from keel.core.mcp_config import McpServer
from keel.core.state import RunState
from keel.runtime.mcp_servers import McpHub, load_mcp_servers
from keel.tools.base import Tool
from keel.tools.registry import ToolRegistry

LOAD_SKILL = "load_skill"


class RunTools:
    """Builds each run's registry from ``base`` (see the module docstring)."""

    def __init__(self, base: ToolRegistry) -> None:
        self.base = base
        self._hubs: dict[Path, tuple[tuple[McpServer, ...], McpHub]] = {}
        self._lock = threading.Lock()

    def for_run(self, state: RunState) -> ToolRegistry:
        """The registry of ``state``'s run; ConfigError for a broken ``mcp.toml``."""
        allowed = state.options.tools
        skills = bool(state.options.skills)
        mcp = [] if state.options.workspace_kind else self.mcp_tools(Path(state.workspace))
        if allowed is None and not mcp and (skills or LOAD_SKILL not in self.base):
            return self.base
        return ToolRegistry(
            tool
            for tool in (*self.base, *mcp)
            if (allowed is None or tool.name in allowed) and (skills or tool.name != LOAD_SKILL)
        )

    def mcp_tools(self, workspace: Path) -> list[Tool]:
        """The tools of ``workspace``'s MCP servers (connecting them on first use)."""
        servers = load_mcp_servers(workspace)
        with self._lock:
            known = self._hubs.get(workspace)
            if known is not None and known[0] != servers:
                known[1].close()
                known = None
            if known is None:
                if not servers:
                    return []
                known = self._hubs[workspace] = (servers, McpHub(workspace, servers))
        return list(known[1].tools())

    def close(self) -> None:
        """Stop every MCP server this process started and close the connections."""
        with self._lock:
            hubs, self._hubs = list(self._hubs.values()), {}
        for _, hub in hubs:
            hub.close()
