"""What a tool call through an MCP server over stdio costs, next to a direct Python tool.

The same computation (add two numbers) three ways, each called ``--calls`` times after
``--warmup`` calls, medians reported:

- ``direct``: the ``@tool`` function through ``ToolRegistry.execute`` (argument model,
  validation, the call) — what a built-in costs;
- ``mcp_stdio``: ``mcp__lab__add`` of the test server (``tests/fixtures/mcp/server.py``,
  the official SDK's ``MCPServer``) through the same registry: the schema check, the
  hop to the hub's event loop, JSON-RPC over the server's stdin/stdout and back;
- ``mcp_connect``: starting the server process and listing its tools (once per process
  and workspace in a run's life).

    .venv/bin/python bench/mcp_tools.py [--calls 500] [--warmup 50]

Prints one JSON object (microseconds).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from keel.core.mcp_config import parse_mcp_config
from keel.runtime.mcp_servers import McpHub
from keel.tools import Effect, ToolContext, ToolRegistry, ToolResult, tool

SERVER = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "mcp" / "server.py"


@tool(effect=Effect.READ)
def add(ctx: ToolContext, a: int, b: int) -> ToolResult:
    """Add two whole numbers."""
    return ToolResult(output=str(a + b))


def timed(call: Callable[[int], None], count: int) -> list[float]:
    samples = []
    for i in range(count):
        start = time.perf_counter()
        call(i)
        samples.append((time.perf_counter() - start) * 1e6)
    return samples


def summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "p50_us": round(statistics.median(ordered), 1),
        "p99_us": round(ordered[int(len(ordered) * 0.99) - 1], 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--warmup", type=int, default=50)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        ws = Path(scratch)
        ctx = ToolContext(workspace=ws, run_id="run_bench", call_id="c", owner="bench")
        direct = ToolRegistry([add])
        config = (
            f"[servers.lab]\ncommand = [{json.dumps(sys.executable)}, {json.dumps(str(SERVER))}]\n"
        )
        servers = parse_mcp_config(config, "mcp.toml")
        connects = []
        for _ in range(3):
            hub = McpHub(ws, servers)
            start = time.perf_counter()
            tools = hub.tools()
            connects.append((time.perf_counter() - start) * 1e6)
            hub.close()
        hub = McpHub(ws, servers)
        remote = ToolRegistry(hub.tools())
        try:
            results = {}
            for name, registry, tool_name in (
                ("direct", direct, "add"),
                ("mcp_stdio", remote, "mcp__lab__add"),
            ):

                def one(i: int, registry: ToolRegistry = registry, name: str = tool_name) -> None:
                    registry.execute(name, {"a": i, "b": 1}, ctx)

                timed(one, args.warmup)
                results[name] = summary(timed(one, args.calls))
            results["mcp_connect"] = {"p50_us": round(statistics.median(connects), 1), "runs": 3}
            results["tools_listed"] = len(tools)
        finally:
            hub.close()
    print(json.dumps({"calls": args.calls, **results}, indent=2))


if __name__ == "__main__":
    main()
