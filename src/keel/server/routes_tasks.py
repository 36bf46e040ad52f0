"""``/tasks``: list and create tasks, and the task graph for the console's DAG."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Request
from pydantic import BaseModel, ConfigDict, Field

from keel.core.tasks import Task, TaskStatus
from keel.server.auth import Caller, require_token
from keel.server.context import context_of
from keel.server.views import task_view

router = APIRouter(tags=["tasks"])
IDEMPOTENCY_NAMESPACE = "api:"


class TaskIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    subject: str = Field(min_length=1, max_length=1000)
    description: str = Field("", max_length=100_000)
    blocked_by: list[str] = Field(default_factory=list, description="Ids of blocking tasks.")


@router.get("/tasks")
def list_tasks(
    request: Request, status: TaskStatus | None = None, ready: bool = False
) -> dict[str, Any]:
    """Tasks oldest first; ``ready=true``: pending ones whose blockers all completed."""
    tasks = context_of(request).store.list_tasks(status=status, ready=ready)
    return {"tasks": [task_view(task) for task in tasks]}


@router.post("/tasks", status_code=201)
def create_task(
    body: TaskIn,
    request: Request,
    caller: Annotated[Caller, Depends(require_token)],
    idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
) -> dict[str, Any]:
    """A new pending task (a missing, self- or cyclic blocker is a 409 naming it)."""
    task = context_of(request).store.create_task(
        body.subject,
        description=body.description,
        blocked_by=body.blocked_by,
        actor=caller.by,
        idempotency_key=IDEMPOTENCY_NAMESPACE + idempotency_key if idempotency_key else None,
    )
    return task_view(task)


@router.get("/tasks/graph")
def task_graph(request: Request) -> dict[str, Any]:
    """Every task as a node and every dependency as an edge from blocker to task."""
    tasks = context_of(request).store.list_tasks()
    return graph_of(tasks)


def graph_of(tasks: list[Task]) -> dict[str, Any]:
    known = {task.id for task in tasks}
    return {
        "nodes": [
            {
                "id": task.id,
                "subject": task.subject,
                "status": task.status.value,
                "owner": task.owner,
                "ready": task.ready,
                "blocked_for_good": task.blocked_for_good,
                "run_id": task.run_id,
            }
            for task in tasks
        ],
        "edges": [
            {"from": blocker, "to": task.id}
            for task in tasks
            for blocker in task.blocked_by
            if blocker in known
        ],
    }
