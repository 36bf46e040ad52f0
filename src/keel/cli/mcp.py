"""``keel mcp list``: the MCP servers of ``.keel/mcp.toml``, their state and their tools.

Each server is connected exactly as a run connects it (``keel.runtime.mcp_servers``) and
closed again. A server that cannot start is listed with why, and the command exits 2.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from keel.cli.common import (
    JsonOption,
    WorkspaceOption,
    console,
    err_console,
    keel_errors,
    print_json,
    shown,
)

mcp_app = typer.Typer(help="MCP servers (.keel/mcp.toml) and their tools.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    """Add ``keel mcp …`` to ``app``."""
    app.add_typer(mcp_app, name="mcp")


@mcp_app.command("list")
@keel_errors
def list_command(
    workspace: Path = WorkspaceOption,
    json_out: bool = JsonOption,
) -> None:
    """Connect each server, list its tools, and say which could not start (exit 2)."""
    # imported here, not at every `keel` start: it loads the tools and the MCP client
    from keel.runtime.mcp_servers import McpHub, load_mcp_servers  # noqa: PLC0415

    root = workspace.resolve()
    servers = load_mcp_servers(root)
    hub = McpHub(root, servers)
    try:
        hub.tools()
        statuses = hub.statuses()
        rows: list[dict[str, Any]] = [
            {
                "name": s.name,
                "transport": s.transport,
                "state": s.state,
                "tools": list(s.tools),
                "error": s.error,
            }
            for s in statuses
        ]
    finally:
        hub.close()
    broken = [row for row in rows if row["state"] != "running"]
    if json_out:
        print_json(rows)
    elif not rows:
        console.print("no MCP servers: add .keel/mcp.toml", highlight=False)
    else:
        table = Table(box=None, header_style="bold")
        for column in ("SERVER", "TRANSPORT", "STATE"):
            table.add_column(column, no_wrap=True)
        table.add_column("TOOLS / ERROR", overflow="fold", min_width=20)
        for row in rows:
            running = row["state"] == "running"
            detail = ", ".join(row["tools"]) if running else str(row["error"] or "")
            state = str(row["state"]) if running else f"[red]{row['state']}[/]"
            table.add_row(shown(str(row["name"])), str(row["transport"]), state, shown(detail))
        console.print(table)
    if broken:
        err_console.print(
            f"{len(broken)} MCP server(s) could not start: their tools are not offered",
            highlight=False,
        )
        raise typer.Exit(2)
