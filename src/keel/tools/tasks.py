"""Task-graph tools for agents: the owner is always the run's identity.

The model never names an owner: every claim, completion, failure and
cancellation is made as ``ctx.owner`` (``run:<run_id>``), so one agent cannot act
for another. Store refusals (blocked task, not the owner, unknown id, cycle) become
tool errors the model can read and act on.

A claim lasts ``run_claim_lease()`` seconds (``KEEL_TASK_LEASE``, default 600); the
run's heartbeat renews it while the run executes and the run's end releases it
(``keel.runtime.task_claims``), so the length only matters while the run is stopped.
"""

from __future__ import annotations

import json
import math
import os
from typing import Annotated, Any

from pydantic import Field

from keel.core.errors import ConfigError, KeelError, ToolError
from keel.core.tasks import Task, TaskStatus, blocked_reason
from keel.store.base import Store
from keel.tools.base import Effect, Recovery, Tool, ToolContext, ToolResult, tool

TASK_LEASE_VARIABLE = "KEEL_TASK_LEASE"
DEFAULT_RUN_CLAIM_LEASE_S = 600.0  # how long a stopped run keeps what it claimed


def run_claim_lease() -> float:
    """Seconds a run's task claim lasts past its last renewal: ``KEEL_TASK_LEASE``, else
    600. ConfigError for anything but a positive, finite number."""
    raw = os.environ.get(TASK_LEASE_VARIABLE, "").strip()
    if not raw:
        return DEFAULT_RUN_CLAIM_LEASE_S
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise ConfigError(
            f"{TASK_LEASE_VARIABLE}={raw!r}: give a run's task claims a lease in seconds, e.g. 600"
        )
    return seconds


def _store(ctx: ToolContext) -> Store:
    if ctx.store is None:
        raise ToolError("the task tools need a store; this run has none")
    return ctx.store


def _view(task: Task) -> dict[str, Any]:
    view: dict[str, Any] = {
        "id": task.id,
        "subject": task.subject,
        "status": task.status.value,
        "owner": task.owner,
        "blocked_by": list(task.blocked_by),
    }
    if task.status is TaskStatus.IN_PROGRESS and task.lease_expires_at is not None:
        view["lease_expires_at"] = task.lease_expires_at.isoformat(timespec="seconds")
    if task.description:
        view["description"] = task.description
    if task.result:
        view["result"] = task.result
    reason = blocked_reason(task)
    if reason:
        view["waiting"] = reason
    return view


def _result(payload: Any) -> ToolResult:
    return ToolResult(output=json.dumps(payload, indent=1, default=str))


def _guard(call: Any) -> Any:
    try:
        return call()
    except ToolError:
        raise
    except KeelError as exc:
        raise ToolError(str(exc)) from None


@tool(effect=Effect.STATE, recovery=Recovery.IDEMPOTENT)
def create_task(
    ctx: ToolContext,
    subject: Annotated[str, Field(min_length=1, description="What must be done, in a line.")],
    description: Annotated[str, Field(description="Details for whoever takes it.")] = "",
) -> ToolResult:
    """Create a task in the shared task graph (idempotent per call)."""
    task = _guard(
        lambda: _store(ctx).create_task(
            subject,
            description=description,
            actor=ctx.owner,
            idempotency_key=f"{ctx.run_id}:{ctx.call_id}",
        )
    )
    return _result(_view(task))


@tool(effect=Effect.STATE, recovery=Recovery.IDEMPOTENT)
def add_dependency(
    ctx: ToolContext,
    task_id: Annotated[str, Field(description="The task that must wait.")],
    blocked_by: Annotated[list[str], Field(min_length=1, description="Tasks it waits for.")],
) -> ToolResult:
    """Make a pending task wait for others; cycles and unknown tasks are refused."""
    task = _guard(lambda: _store(ctx).add_dependencies(task_id, blocked_by, actor=ctx.owner))
    return _result(_view(task))


@tool(effect=Effect.READ)
def list_tasks(
    ctx: ToolContext,
    status: Annotated[TaskStatus | None, Field(description="Only tasks in this status.")] = None,
    ready: Annotated[bool, Field(description="Only tasks that can be claimed now.")] = False,
) -> ToolResult:
    """List tasks of the shared graph."""
    tasks = _guard(lambda: _store(ctx).list_tasks(status=status, ready=ready))
    return _result([_view(t) for t in tasks])


@tool(effect=Effect.READ)
def get_task(ctx: ToolContext, task_id: str) -> ToolResult:
    """Show one task with its blockers."""
    return _result(_view(_guard(lambda: _store(ctx).get_task(task_id))))


@tool(effect=Effect.STATE, recovery=Recovery.MANUAL)
def claim_task(
    ctx: ToolContext,
    task_id: Annotated[
        str | None, Field(description="The task to claim; omit for the oldest ready one.")
    ] = None,
) -> ToolResult:
    """Claim a task for this run; it must be pending with every blocker completed.

    The claim is renewed while this run executes; if the run ends without completing
    or failing the task, it goes back to pending for someone else."""
    task = _guard(
        lambda: _store(ctx).claim_task(
            owner=ctx.owner, lease_seconds=run_claim_lease(), task_id=task_id
        )
    )
    if task is None:
        return _result({"claimed": None, "note": "no task is ready to claim"})
    return _result({"claimed": _view(task)})


@tool(effect=Effect.STATE, recovery=Recovery.IDEMPOTENT)
def complete_task(
    ctx: ToolContext,
    task_id: str,
    result: Annotated[str | None, Field(description="What was done.")] = None,
) -> ToolResult:
    """Complete a task this run owns; says which tasks became ready by it."""
    ready = _guard(lambda: _store(ctx).complete_task(task_id, owner=ctx.owner, result=result))
    return _result({"completed": task_id, "now_ready": [_view(t) for t in ready]})


@tool(effect=Effect.STATE, recovery=Recovery.IDEMPOTENT)
def fail_task(
    ctx: ToolContext,
    task_id: str,
    reason: Annotated[str, Field(min_length=1, description="Why it cannot be done.")],
) -> ToolResult:
    """Give up a task this run owns; its dependents stay blocked."""
    task = _guard(lambda: _store(ctx).fail_task(task_id, owner=ctx.owner, reason=reason))
    return _result(_view(task))


@tool(effect=Effect.STATE, recovery=Recovery.IDEMPOTENT)
def cancel_task(
    ctx: ToolContext,
    task_id: str,
    reason: Annotated[str, Field(min_length=1, description="Why it will not be done.")],
) -> ToolResult:
    """Withdraw a task for good: one this run holds, or one nobody holds (pending or
    failed). Tasks blocked by it can then never be claimed, and say so."""
    task = _guard(lambda: _store(ctx).cancel_task(task_id, actor=ctx.owner, reason=reason))
    return _result(_view(task))


TASK_TOOLS: tuple[Tool, ...] = (
    create_task,
    add_dependency,
    list_tasks,
    get_task,
    claim_task,
    complete_task,
    fail_task,
    cancel_task,
)
