"""The built-in tools (names and arguments are part of SPEC.md's contract)."""

from __future__ import annotations

from keel.tools.base import Tool
from keel.tools.commands import run_command
from keel.tools.control import ask_user, plan_exit, request_completion
from keel.tools.delegation import DELEGATION_TOOLS
from keel.tools.files import edit_file, read_file, write_file
from keel.tools.patches import apply_patch
from keel.tools.plan import plan_write
from keel.tools.registry import ToolRegistry
from keel.tools.search import glob, grep, list_dir
from keel.tools.skills import load_skill
from keel.tools.tasks import TASK_TOOLS
from keel.tools.todo import todo_write

BUILTIN_TOOLS: tuple[Tool, ...] = (
    read_file,
    list_dir,
    glob,
    grep,
    write_file,
    edit_file,
    apply_patch,
    run_command,
    todo_write,
    request_completion,
    ask_user,
    plan_write,
    plan_exit,
    load_skill,
    *TASK_TOOLS,
    *DELEGATION_TOOLS,
)


def default_registry() -> ToolRegistry:
    """A fresh registry holding the built-ins; register more tools on it freely."""
    return ToolRegistry(BUILTIN_TOOLS)
