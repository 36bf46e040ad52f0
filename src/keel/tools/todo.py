"""todo_write: the model's plan as a whole-list replace, with at most one item in progress."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from keel.core.errors import ToolError
from keel.tools.base import Effect, Recovery, ToolContext, ToolResult, tool

TodoStatus = Literal["pending", "in_progress", "completed"]
_MARKS = {"pending": "[ ]", "in_progress": "[>]", "completed": "[x]"}


class TodoItem(BaseModel):
    """One entry of the todo list as the model sends it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    content: Annotated[str, Field(min_length=1, description="What to do, in one line.")]
    status: Annotated[TodoStatus, Field(description="pending, in_progress or completed.")]


@tool(effect=Effect.STATE, recovery=Recovery.IDEMPOTENT)
def todo_write(
    ctx: ToolContext,
    todos: Annotated[
        list[TodoItem],
        Field(description="The complete new todo list; it replaces the previous one."),
    ],
) -> ToolResult:
    """Replace the todo list. Keep at most one item in_progress; mark items completed when done."""
    active = [item.content for item in todos if item.status == "in_progress"]
    if len(active) > 1:
        listed = ", ".join(repr(content) for content in active)
        raise ToolError(
            f"at most one todo may be in_progress, got {len(active)} ({listed}); "
            "keep one in_progress and mark the others pending or completed"
        )
    items = [{"content": item.content, "status": item.status} for item in todos]
    done = sum(item.status == "completed" for item in todos)
    lines = [f"todo list updated ({done}/{len(todos)} completed)"]
    lines += [f"{_MARKS[item.status]} {item.content}" for item in todos]
    return ToolResult(output="\n".join(lines), data={"todos": items})
