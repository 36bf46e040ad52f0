"""The shared task graph's records and rules (pure).

A task's row is a fold of its own gapless history: ``apply_task_event`` is the
only way a task changes, so the store computes each new row with it inside the
same transaction that appends the event, and ``replay_task`` rebuilds the
identical row from the history alone.

Dependencies point from a task to the tasks that block it (``blocked_by``).
``validate_dependencies`` refuses self-, unknown and cyclic ones before
anything is written; a task is ready when it is pending and every blocker is
completed. A failed (or cancelled) blocker holds its dependents until it is
reopened with ``reopen_task`` (failed -> pending, a new attempt) and completed.

Leases: a holder's writes count only while its lease is unexpired. Once the
lease has expired the task is claimable by anyone (the claim records a
``task_reclaimed`` event naming the previous owner), and every write of the old
holder — heartbeat, complete, fail, release, link — is refused with
``LeaseLost``, whether or not someone has reclaimed it yet.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import StrEnum
from typing import Any

from keel.core.errors import DependencyError


class TaskStatus(StrEnum):
    PENDING = "pending"  # waiting for blockers or a claimer
    IN_PROGRESS = "in_progress"  # claimed; owner holds a lease
    COMPLETED = "completed"  # done by its owner (terminal)
    FAILED = "failed"  # given up by its owner; may be reopened
    CANCELLED = "cancelled"  # withdrawn (terminal)


class TaskEventType(StrEnum):
    """Types of a task's history entries; stored strings, never renamed."""

    CREATED = "task_created"  # subject, description, blocked_by, options, idempotency_key
    DEPENDENCIES_ADDED = "dependencies_added"  # blocked_by: the blockers added
    RECLAIMED = "task_reclaimed"  # previous_owner, previous_token, lease_expired_at
    CLAIMED = "task_claimed"  # owner, token, attempt, lease_expires_at
    HEARTBEAT = "task_heartbeat"  # lease_expires_at
    RUN_LINKED = "run_linked"  # run_id
    COMPLETED = "task_completed"  # result
    FAILED = "task_failed"  # reason
    RELEASED = "task_released"  # the owner gave the task back to pending
    REOPENED = "task_reopened"  # a failed task is pending again


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
    result: str | None = None  # completion result, or the failure reason
    run_id: str | None = None
    options: dict[str, Any] = field(default_factory=dict)  # run options for workers
    idempotency_key: str | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    version: int = 0  # number of events in the task's history
    # Derived on read from the blockers' statuses; not part of the stored row.
    waiting_on: tuple[str, ...] = ()  # blockers not yet completed
    held_by_failed: tuple[str, ...] = ()  # of those, the failed or cancelled ones

    @property
    def ready(self) -> bool:
        """Pending with every blocker completed: the next claim may take it."""
        return self.status is TaskStatus.PENDING and not self.waiting_on

    def row(self) -> Task:
        """The stored row alone (derived fields cleared), as ``replay_task`` rebuilds it."""
        return replace(self, waiting_on=(), held_by_failed=())

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "subject": self.subject,
            "description": self.description,
            "status": self.status.value,
            "owner": self.owner,
            "blocked_by": list(self.blocked_by),
            "waiting_on": list(self.waiting_on),
            "held_by_failed": list(self.held_by_failed),
            "ready": self.ready,
            "lease_token": self.lease_token,
            "lease_expires_at": _iso(self.lease_expires_at),
            "attempt": self.attempt,
            "result": self.result,
            "run_id": self.run_id,
            "options": self.options,
            "idempotency_key": self.idempotency_key,
            "created_at": _iso(self.created_at),
            "updated_at": _iso(self.updated_at),
            "version": self.version,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskEvent:
    """One entry of a task's own gapless history."""

    task_id: str
    seq: int
    type: str
    actor: str
    recorded_at: datetime
    data: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {
            "task_id": self.task_id,
            "seq": self.seq,
            "type": self.type,
            "actor": self.actor,
            "recorded_at": self.recorded_at.isoformat(),
            "data": self.data,
        }


def new_task_id() -> str:
    """``task_`` + 8 hex digits; the store retries on the rare collision."""
    return "task_" + secrets.token_hex(4)


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


# --- dependencies and readiness ------------------------------------------------------


def validate_dependencies(
    task_id: str,
    blocked_by: Iterable[str],
    *,
    existing: Callable[[Sequence[str]], set[str]],
    blockers_of: Callable[[str], Iterable[str]],
    current: Iterable[str] = (),
) -> tuple[str, ...]:
    """The new blockers of ``task_id`` in order, without repeats or ones already present.

    Raises DependencyError naming the tasks, before the caller writes anything, for a
    self-dependency, unknown ids (``existing`` returns which of the given ids exist) or
    a cycle (``blockers_of`` gives a task's current blockers), whose message is the path
    ``task_a -> task_b -> task_a`` read as "task_a is blocked by task_b …".
    """
    present = set(current)
    new: list[str] = []
    for blocker in blocked_by:
        if blocker == task_id:
            raise DependencyError(f"task {task_id} cannot be blocked by itself")
        if blocker not in present and blocker not in new:
            new.append(blocker)
    if not new:
        return ()
    found = existing(new)
    missing = [b for b in new if b not in found]
    if missing:
        raise DependencyError(
            f"task {task_id} cannot be blocked by unknown task(s) {', '.join(missing)}; "
            "`keel tasks list` shows the ids"
        )
    for blocker in new:
        path = _path_to(blocker, task_id, blockers_of)
        if path is not None:
            cycle = " -> ".join([task_id, *path])
            raise DependencyError(f"dependency would close a cycle: {cycle}; nothing was changed")
    return tuple(new)


def _path_to(
    start: str, target: str, blockers_of: Callable[[str], Iterable[str]]
) -> list[str] | None:
    """A ``blocked_by`` path from ``start`` to ``target`` (both included), if one exists."""
    parent: dict[str, str | None] = {start: None}
    stack = [start]
    while stack:
        node = stack.pop()
        if node == target:
            path = [node]
            while (prev := parent[path[-1]]) is not None:
                path.append(prev)
            return path[::-1]
        for nxt in blockers_of(node):
            if nxt not in parent:
                parent[nxt] = node
                stack.append(nxt)
    return None


def waiting_on(blockers: Mapping[str, TaskStatus]) -> tuple[str, ...]:
    """The blockers (in the given order) that are not completed."""
    return tuple(b for b, s in blockers.items() if s is not TaskStatus.COMPLETED)


def held_by_failed(blockers: Mapping[str, TaskStatus]) -> tuple[str, ...]:
    """The blockers that failed or were cancelled: they hold dependents until reopened."""
    return tuple(b for b, s in blockers.items() if s in (TaskStatus.FAILED, TaskStatus.CANCELLED))


def is_ready(status: TaskStatus, blockers: Mapping[str, TaskStatus]) -> bool:
    """A task is ready when it is pending and every blocker is completed."""
    return status is TaskStatus.PENDING and not waiting_on(blockers)


def with_blockers(task: Task, blockers: Mapping[str, TaskStatus]) -> Task:
    """``task`` with its derived fields filled from its blockers' statuses."""
    waiting, failed = waiting_on(blockers), held_by_failed(blockers)
    if waiting == task.waiting_on and failed == task.held_by_failed:
        return task  # the common case (nothing holds it): no copy
    return replace(task, waiting_on=waiting, held_by_failed=failed)


def blocked_reason(task: Task) -> str | None:
    """Why a pending task is not ready, naming the blockers; None when nothing holds it."""
    if task.status is not TaskStatus.PENDING or not task.waiting_on:
        return None
    if task.held_by_failed:
        failed = ", ".join(task.held_by_failed)
        return f"held by failed blocker {failed}"
    return f"waiting on {', '.join(task.waiting_on)}"


# --- the fold --------------------------------------------------------------------------


def _time(value: Any) -> datetime | None:
    return datetime.fromisoformat(value) if value is not None else None


def apply_task_event(task: Task | None, event: TaskEvent) -> Task:
    """The task after ``event``; ``task`` is None only before ``task_created``."""
    kind = TaskEventType(event.type)
    d = event.data
    if task is None:
        if kind is not TaskEventType.CREATED:
            raise ValueError(f"history of {event.task_id} must start with task_created")
        return Task(
            id=event.task_id,
            subject=d["subject"],
            description=d.get("description", ""),
            blocked_by=tuple(d.get("blocked_by", ())),
            options=dict(d.get("options") or {}),
            idempotency_key=d.get("idempotency_key"),
            created_at=event.recorded_at,
            updated_at=event.recorded_at,
            version=event.seq,
        )
    if event.seq != task.version + 1:
        raise ValueError(f"history of {task.id} has a gap: {task.version} then {event.seq}")
    at, seq = event.recorded_at, event.seq
    match kind:
        case TaskEventType.DEPENDENCIES_ADDED:
            blocked_by = (*task.blocked_by, *d["blocked_by"])
            return replace(task, blocked_by=blocked_by, updated_at=at, version=seq)
        case TaskEventType.RECLAIMED | TaskEventType.RELEASED:
            return _unleased(task, TaskStatus.PENDING, task.result, at, seq)
        case TaskEventType.CLAIMED:
            return replace(
                task,
                status=TaskStatus.IN_PROGRESS,
                owner=d["owner"],
                lease_token=d["token"],
                lease_expires_at=_time(d["lease_expires_at"]),
                attempt=d["attempt"],
                updated_at=at,
                version=seq,
            )
        case TaskEventType.HEARTBEAT:
            expires = _time(d["lease_expires_at"])
            return replace(task, lease_expires_at=expires, updated_at=at, version=seq)
        case TaskEventType.RUN_LINKED:
            return replace(task, run_id=d["run_id"], updated_at=at, version=seq)
        case TaskEventType.COMPLETED:
            return _finished(task, TaskStatus.COMPLETED, d.get("result"), at, seq)
        case TaskEventType.FAILED:
            return _finished(task, TaskStatus.FAILED, d.get("reason"), at, seq)
        case TaskEventType.REOPENED:
            return _unleased(task, TaskStatus.PENDING, None, at, seq)
        case TaskEventType.CREATED:
            raise ValueError(f"task {task.id} was created twice in its history")


def _unleased(task: Task, status: TaskStatus, result: str | None, at: datetime, seq: int) -> Task:
    """Back to no owner and no lease (release, reclaim, reopen)."""
    return replace(
        task,
        status=status,
        owner=None,
        lease_token=None,
        lease_expires_at=None,
        result=result,
        updated_at=at,
        version=seq,
    )


def _finished(task: Task, status: TaskStatus, result: str | None, at: datetime, seq: int) -> Task:
    """Completed or failed: the owner stays on record, the lease ends."""
    return replace(
        task,
        status=status,
        result=result,
        lease_token=None,
        lease_expires_at=None,
        updated_at=at,
        version=seq,
    )


def replay_task(events: Iterable[TaskEvent]) -> Task:
    """Rebuild a task's stored row from its history alone."""
    task: Task | None = None
    for event in events:
        task = apply_task_event(task, event)
    if task is None:
        raise ValueError("an empty history describes no task")
    return task
