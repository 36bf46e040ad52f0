"""The tool registry: lookup, specs for the model, argument parsing and execution.

Every way a call can go wrong on the model's side — unknown tool, invalid JSON,
schema violations, a tool that refuses or crashes — surfaces as a ToolError whose
message is written for the model to correct itself; the loop records it and the
run goes on. Signals and run failures other than ToolError (an approval needed, a
lost lease, a broken store) pass through untouched: they steer or stop the run.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from pydantic import BaseModel

from keel.core.errors import KeelError, ToolError, UsageError
from keel.tools.base import Tool, ToolContext, ToolResult, ToolSchema


class ToolRegistry:
    """Tools by name, in registration order."""

    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        for item in tools:
            self.register(item)

    def register(self, tool: Tool) -> Tool:
        """Add ``tool``; a second tool with the same name is refused (UsageError)."""
        if not isinstance(tool, Tool):
            raise UsageError(f"{tool!r} is not a Tool; declare it with @tool(effect=...)")
        if tool.name in self._tools:
            raise UsageError(f"a tool named {tool.name!r} is already registered")
        self._tools[tool.name] = tool
        return tool

    def get(self, name: str) -> Tool:
        try:
            return self._tools[name]
        except KeyError:
            available = ", ".join(self._tools) or "(none)"
            raise ToolError(f"unknown tool {name!r}; available: {available}") from None

    def names(self) -> list[str]:
        return list(self._tools)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[Tool]:
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    def specs(self) -> list[ToolSchema]:
        """What the model is offered: name, description and JSON-schema parameters."""
        return [item.spec() for item in self._tools.values()]

    def parse_arguments(
        self, name: str, raw: str | Mapping[str, Any] | BaseModel | None
    ) -> BaseModel:
        """The validated arguments; ToolError for an unknown tool, ToolArgumentError else."""
        return self.get(name).parse_arguments(raw)

    def execute(
        self,
        name: str,
        raw_arguments: str | Mapping[str, Any] | BaseModel | None,
        ctx: ToolContext,
    ) -> ToolResult:
        """Validate and run one call; anything the tool raises comes back as a ToolError."""
        item = self.get(name)
        if item.control:
            raise UsageError(f"{name} is a control tool: the loop performs it, not execute()")
        args = item.parse_arguments(raw_arguments)
        try:
            return item.run(ctx, args)
        except ToolError:
            raise
        except UsageError as exc:
            raise ToolError(str(exc)) from exc
        except KeelError:
            raise
        except Exception as exc:
            raise ToolError(f"{name} failed: {type(exc).__name__}: {exc}") from exc
