"""Tools the model can call: the registry, argument validation and the built-ins."""

from keel.tools.base import (
    Effect,
    Recovery,
    Tool,
    ToolContext,
    ToolResult,
    ToolSchema,
    tool,
)
from keel.tools.builtin import BUILTIN_TOOLS, default_registry
from keel.tools.registry import ToolRegistry
from keel.tools.workspace import resolve_in_workspace, sha256_file

__all__ = [
    "BUILTIN_TOOLS",
    "Effect",
    "Recovery",
    "Tool",
    "ToolContext",
    "ToolRegistry",
    "ToolResult",
    "ToolSchema",
    "default_registry",
    "resolve_in_workspace",
    "sha256_file",
    "tool",
]
