"""Pure JSON views of Keel's records, shared by every route and the console.

``run_view(state)`` is what ``GET /runs/{id}`` returns; it reads nothing but the state
it is given (one ``load_run`` per request). A pending approval carries a ``preview``:
exactly what would run — the command line of ``run_command``, the path of a file tool
and, for ``edit_file``/``write_file``, a unified diff of the change the call asks for.
"""

from __future__ import annotations

import difflib
import shlex
from typing import Any

from keel.core.budget import Budget, Usage
from keel.core.records import PendingRequest
from keel.core.state import RunState
from keel.core.tasks import Task
from keel.core.verifiers import evidence_map

DIFF_PREVIEW_LINES = 400  # longer diffs are cut, with a line saying how many were left out


def run_view(state: RunState) -> dict[str, Any]:
    """The run as the API shows it (see the server design: fields are stable)."""
    options = state.options
    result = state.result or {}
    return {
        "id": state.run_id,
        "parent_id": state.parent_id,
        "task_id": state.task_id,
        "goal": state.goal,
        "workspace": state.workspace,
        "status": state.status.value,
        "reason": state.reason,
        "creator": getattr(options, "creator", None),
        "updated_at": state.updated_at,
        "last_seq": state.last_seq,
        "mode": state.mode,
        "model": options.model,
        "verify": list(options.verify),
        "tools": None if options.tools is None else list(options.tools),
        "agent": (options.agent or {}).get("name"),
        "budget": budget_view(options.budget),
        "context_tokens": options.context_tokens,
        "context_summary": options.context_summary,
        "usage": usage_view(state.usage),
        "todos": [{"content": t.content, "status": t.status} for t in state.todos],
        "plan": state.plan,
        "evidence": evidence_map(result),
        "result": state.result,
        "pending": pending_view(state.pending),
        "children": [
            {"id": run_id, "agent": child.agent, "status": child.status}
            for run_id, child in state.children.items()
        ],
        "follows": getattr(options, "follows", None),
    }


def budget_view(budget: Budget) -> dict[str, Any]:
    return {
        "max_steps": budget.max_steps,
        "max_tool_calls": budget.max_tool_calls,
        "max_tokens": budget.max_tokens,
        "max_cost": budget.max_cost,
        "timeout_s": budget.max_wall_seconds,
    }


def usage_view(usage: Usage) -> dict[str, Any]:
    return {
        "steps": usage.steps,
        "tool_calls": usage.tool_calls,
        "tokens": usage.tokens,
        "cost": usage.cost,
        "wall_seconds": usage.wall_seconds,
    }


def pending_view(pending: PendingRequest | None) -> dict[str, Any] | None:
    if pending is None:
        return None
    view = pending.to_dict()
    view["preview"] = call_preview(pending.tool, pending.arguments or {})
    return view


def call_preview(tool: str | None, arguments: dict[str, Any]) -> dict[str, str | None]:
    """``{command, path, diff}`` of a tool call: what a person approves."""
    argv = arguments.get("argv")
    command = (
        shlex.join(str(part) for part in argv)
        if tool == "run_command" and isinstance(argv, list)
        else None
    )
    raw_path = arguments.get("path")
    path = raw_path if isinstance(raw_path, str) else None
    diff: str | None = None
    if tool == "edit_file" and path is not None:
        diff = unified_diff(
            str(arguments.get("old_text", "")), str(arguments.get("new_text", "")), path, path
        )
    elif tool == "write_file" and path is not None:
        diff = unified_diff("", str(arguments.get("content", "")), "(current content)", path)
    return {"command": command, "path": path, "diff": diff}


def unified_diff(before: str, after: str, old_name: str, new_name: str) -> str:
    lines = list(
        difflib.unified_diff(
            before.splitlines(keepends=True),
            after.splitlines(keepends=True),
            fromfile=f"a/{old_name}",
            tofile=f"b/{new_name}",
        )
    )
    shown = [line if line.endswith("\n") else line + "\n" for line in lines[:DIFF_PREVIEW_LINES]]
    if len(lines) > DIFF_PREVIEW_LINES:
        shown.append(f"… {len(lines) - DIFF_PREVIEW_LINES} more diff lines not shown\n")
    return "".join(shown)


def task_view(task: Task) -> dict[str, Any]:
    """A task as ``GET /tasks`` shows it: ``Task.to_dict`` without its lease token (the
    fencing token of whoever holds the task; a reader has no use for it)."""
    view = task.to_dict()
    del view["lease_token"]
    return view
