"""Delegation tools: hand bounded work to a subagent, collect what it found, hand over.

These are declarations only: what a call does is ``ToolContext.delegation``'s (the
harness's ``keel.runtime.delegation``), which enforces every contract in code — the
child's tools, mode, budget, depth and workspace — whatever the model asks for. All
four are ``state`` tools whose re-run is harmless: a spawn is keyed by its call, so a
resumed parent re-attaches to the child it already made instead of making another.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Protocol

from pydantic import Field

from keel.core.errors import ToolError
from keel.tools.base import Effect, Recovery, ToolContext, ToolResult, tool

MAX_TASK_CHARS = 20_000
MAX_WAIT_IDS = 16
MAX_WAIT_SECONDS = 3600.0
SPAWN_TIME_LIMIT_S = 7 * 24 * 3600.0  # a foreground child runs within the run's own budget
FailureWord = Literal["fail_fast", "best_effort", "retry", "escalate"]


class Delegation(Protocol):
    """What the harness does for the delegation tools (``keel.runtime.delegation``)."""

    def spawn(
        self,
        ctx: ToolContext,
        *,
        agent: str,
        task: str,
        inputs: dict[str, Any] | None,
        background: bool,
        on_failure: str | None,
    ) -> ToolResult: ...

    def wait(self, ctx: ToolContext, *, ids: list[str], timeout_seconds: float) -> ToolResult: ...

    def result(self, ctx: ToolContext, *, child: str) -> ToolResult: ...

    def handoff(self, ctx: ToolContext, *, agent: str, note: str) -> ToolResult: ...


def _delegation(ctx: ToolContext) -> Delegation:
    if ctx.delegation is None:
        raise ToolError("delegation is not available in this harness: do the work yourself")
    found: Delegation = ctx.delegation
    return found


@tool(effect=Effect.STATE, recovery=Recovery.IDEMPOTENT, time_limit_s=SPAWN_TIME_LIMIT_S)
def agent_spawn(
    ctx: ToolContext,
    agent: Annotated[
        str,
        Field(min_length=1, max_length=63, description="The agent spec to run, e.g. explorer."),
    ],
    task: Annotated[
        str,
        Field(
            min_length=1,
            max_length=MAX_TASK_CHARS,
            description="The child's whole task: it does not see your conversation.",
        ),
    ],
    inputs: Annotated[
        dict[str, Any] | None,
        Field(description="Facts the child needs (paths, ids, excerpts), as a JSON object."),
    ] = None,
    background: Annotated[
        bool,
        Field(
            description="false: wait for the child and get its result now; true: get its "
            "id now and collect the result later with agent_wait or agent_result."
        ),
    ] = False,
    on_failure: Annotated[
        FailureWord | None,
        Field(description="What a failure of the child does (default: the agent spec's)."),
    ] = None,
) -> ToolResult:
    """Hand a bounded piece of work to a subagent (a child run with its own tools, budget
    and workspace, never more than yours). Its result is an observation: status, summary,
    structured output, evidence, and for an isolated child its changes as a patch artifact
    you may integrate with apply_patch."""
    return _delegation(ctx).spawn(
        ctx,
        agent=agent,
        task=task,
        inputs=inputs,
        background=background,
        on_failure=on_failure,
    )


@tool(effect=Effect.STATE, recovery=Recovery.IDEMPOTENT, time_limit_s=MAX_WAIT_SECONDS + 60)
def agent_wait(
    ctx: ToolContext,
    ids: Annotated[
        list[str],
        Field(
            min_length=1,
            max_length=MAX_WAIT_IDS,
            description="Child run ids or task ids, as agent_spawn returned them.",
        ),
    ],
    timeout_seconds: Annotated[
        float, Field(ge=0, le=MAX_WAIT_SECONDS, description="How long to wait at most.")
    ] = 300.0,
) -> ToolResult:
    """Wait until every named child has ended (or waits for a person), or the timeout
    passes; returns each one's result or current status."""
    return _delegation(ctx).wait(ctx, ids=ids, timeout_seconds=timeout_seconds)


@tool(effect=Effect.STATE, recovery=Recovery.IDEMPOTENT)
def agent_result(
    ctx: ToolContext,
    id: Annotated[  # the contract's argument name
        str, Field(min_length=1, max_length=64, description="A child run id or task id.")
    ],
) -> ToolResult:
    """A child's result if it has ended, else its current status (never waits)."""
    return _delegation(ctx).result(ctx, child=id)


@tool(effect=Effect.STATE, recovery=Recovery.IDEMPOTENT)
def handoff(
    ctx: ToolContext,
    agent: Annotated[
        str, Field(min_length=1, max_length=63, description="The agent spec that takes over.")
    ],
    note: Annotated[
        str,
        Field(
            min_length=1,
            max_length=MAX_TASK_CHARS,
            description="What the next agent must know that the plan and todos do not say.",
        ),
    ],
) -> ToolResult:
    """Hand the whole task over to another agent: this run ends (completed, outcome
    handed_off) and a new run continues with the goal, plan, todos, notes and the
    remaining budget."""
    return _delegation(ctx).handoff(ctx, agent=agent, note=note)


DELEGATION_TOOLS = (agent_spawn, agent_wait, agent_result, handoff)
DELEGATION_TOOL_NAMES = frozenset(t.name for t in DELEGATION_TOOLS)

__all__ = [
    "DELEGATION_TOOLS",
    "DELEGATION_TOOL_NAMES",
    "Delegation",
    "agent_result",
    "agent_spawn",
    "agent_wait",
    "handoff",
]
