"""plan_write: the plan is a file of the workspace (``plans/PLAN.md``), written like any other.

It goes through the same confinement as write_file (descriptor-relative resolution,
no symlink out of the workspace, protected paths refused) and the same permission
gate: the policy sees a write of ``plans/PLAN.md``, allowed in plan mode because
writing the plan is what plan mode is for, and needing approval in ask mode.
The loop records ``plan_written`` from the result's ``data["plan"]``.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from keel.core.guard import PLAN_FILE
from keel.core.pathnames import shown_path
from keel.tools.base import Effect, Recovery, ToolContext, ToolResult, tool
from keel.tools.files import encode_text
from keel.tools.workspace import sha256_bytes, write_in_workspace, write_target


def _plan_intent(ctx: ToolContext, content: str) -> dict[str, str]:
    rel = write_target(ctx.workspace, PLAN_FILE, ctx.guard)
    return {shown_path(rel): sha256_bytes(encode_text(content, "content"))}


@tool(effect=Effect.WRITE, recovery=Recovery.VERIFY_THEN_CONTINUE, intent=_plan_intent)
def plan_write(
    ctx: ToolContext,
    content: Annotated[str, Field(min_length=1, description="The plan, as markdown.")],
) -> ToolResult:
    """Record (or replace) the plan for this task; it is kept in plans/PLAN.md."""
    data = encode_text(content, "content")
    rel = shown_path(write_in_workspace(ctx.workspace, PLAN_FILE, data, ctx.guard))
    return ToolResult(
        output=f"plan saved ({rel})",
        changed_files={rel: sha256_bytes(data)},
        data={"plan": content},
    )
