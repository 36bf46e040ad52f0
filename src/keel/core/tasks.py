"""The shared task graph's records (pure).

Dependency validation and readiness live here too (see ``validate_dependencies``
and ``is_ready``); the store calls them inside its transactions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any


class TaskStatus(StrEnum):
    PENDING = "pending"  # waiting for blockers or a claimer
    IN_PROGRESS = "in_progress"  # claimed; owner holds a lease
    COMPLETED = "completed"  # done by its owner (terminal)
    FAILED = "failed"  # given up by its owner; may be reopened
    CANCELLED = "cancelled"  # withdrawn (terminal)


@dataclass(frozen=True, slots=True, kw_only=True)
class Task:
    id: str
    subject: str
    description: str = ""
    status: TaskStatus = TaskStatus.PENDING
    owner: str | None = None
    blocked_by: tuple[str, ...] = ()
    lease_token: str | None = None
    lease_expires_at: datetime | None = None
    attempt: int = 0
    result: str | None = None
    run_id: str | None = None
    options: dict[str, Any] = field(default_factory=dict)  # run options for workers
    idempotency_key: str | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    version: int = 0  # number of events in the task's history


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskEvent:
    """One entry of a task's own gapless history."""

    task_id: str
    seq: int
    type: str
    actor: str
    recorded_at: datetime
    data: dict[str, Any]
