"""The shared task graph's records and rules (pure).

A task's row is a fold of its own gapless history: ``apply_task_event`` is the
only way a task changes, so the store computes each new row with it inside the
same transaction that appends the event, and ``replay_task`` rebuilds the
identical row from the history alone.

Dependencies point from a task to the tasks that block it (``blocked_by``).
``validate_dependencies`` refuses self-, unknown and cyclic ones before
anything is written; a task is ready when it is pending and every blocker is
completed. A failed blocker holds its dependents until it is reopened with
``reopen_task`` (failed -> pending, a new attempt) and completed; a cancelled one
never completes, so its dependents can never be claimed (``blocked_reason`` says so).

Cancelling (``check_cancel``): anyone may cancel a pending or failed task (nobody
holds it) or an in-progress one whose lease has lapsed; while the lease is live only
its owner may. Completed and cancelled tasks are final.

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

from keel.core.errors import (
    DependencyError,
    InvalidTaskTransition,
    LeaseLost,
    NotOwner,
    UsageError,
)


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
    RELEASED = "task_released"  # reason?: the owner (or its ended run) gave it back
    REOPENED = "task_reopened"  # a failed task is pending again
    CANCELLED = "task_cancelled"  # reason, previous_status, previous_owner?


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
    held_by_failed: tuple[str, ...] = ()  # of those, the failed ones (until reopened)
    held_by_cancelled: tuple[str, ...] = ()  # of those, the cancelled ones (for good)

    @property
    def ready(self) -> bool:
        """Pending with every blocker completed: the next claim may take it."""
        return self.status is TaskStatus.PENDING and not self.waiting_on

    @property
    def blocked_for_good(self) -> bool:
        """Pending behind a cancelled blocker: no claim will ever take it."""
        return self.status is TaskStatus.PENDING and bool(self.held_by_cancelled)

    def row(self) -> Task:
        """The stored row alone (derived fields cleared), as ``replay_task`` rebuilds it."""
        return replace(self, waiting_on=(), held_by_failed=(), held_by_cancelled=())

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
            "held_by_cancelled": list(self.held_by_cancelled),
            "ready": self.ready,
            "blocked_for_good": self.blocked_for_good,
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
    """The blockers that failed: they hold dependents until reopened and completed."""
    return tuple(b for b, s in blockers.items() if s is TaskStatus.FAILED)


def held_by_cancelled(blockers: Mapping[str, TaskStatus]) -> tuple[str, ...]:
    """The blockers that were cancelled: they hold dependents for good."""
    return tuple(b for b, s in blockers.items() if s is TaskStatus.CANCELLED)


def is_ready(status: TaskStatus, blockers: Mapping[str, TaskStatus]) -> bool:
    """A task is ready when it is pending and every blocker is completed."""
    return status is TaskStatus.PENDING and not waiting_on(blockers)


def with_blockers(task: Task, blockers: Mapping[str, TaskStatus]) -> Task:
    """``task`` with its derived fields filled from its blockers' statuses."""
    waiting = waiting_on(blockers)
    failed, cancelled = held_by_failed(blockers), held_by_cancelled(blockers)
    if (waiting, failed, cancelled) == (
        task.waiting_on,
        task.held_by_failed,
        task.held_by_cancelled,
    ):
        return task  # the common case (nothing holds it): no copy
    return replace(task, waiting_on=waiting, held_by_failed=failed, held_by_cancelled=cancelled)


def blocked_reason(task: Task) -> str | None:
    """Why a pending task is not ready, naming the blockers; None when nothing holds it.

    A cancelled blocker is named first: it never completes, so the task can never be
    claimed, and the reason says so rather than letting anyone wait for it.
    """
    if task.status is not TaskStatus.PENDING or not task.waiting_on:
        return None
    if task.held_by_cancelled:
        return cancelled_blockers_reason(task.id, task.held_by_cancelled)
    if task.held_by_failed:
        failed = ", ".join(task.held_by_failed)
        return f"held by failed blocker {failed}"
    return f"waiting on {', '.join(task.waiting_on)}"


def cancelled_blockers_reason(task_id: str, cancelled: Sequence[str]) -> str:
    """The words for a task held by cancelled blockers (shown by list, show, graph, claim)."""
    named = ", ".join(f"{b} (cancelled)" for b in cancelled)
    return (
        f"blocked by {named}: a cancelled task never completes, so {task_id} can never be "
        f"claimed; cancel it too (`keel tasks cancel {task_id} --reason TEXT`)"
    )


def claim_refusal_for_blockers(task_id: str, blockers: Mapping[str, TaskStatus]) -> str | None:
    """Why open blockers keep ``task_id`` from being claimed (None: none are open)."""
    cancelled = held_by_cancelled(blockers)
    if cancelled:
        return cancelled_blockers_reason(task_id, cancelled)
    still = {b: s for b, s in blockers.items() if s is not TaskStatus.COMPLETED}
    if not still:
        return None
    return "blocked by " + ", ".join(f"{b} ({s.value})" for b, s in still.items())


# --- cancelling ------------------------------------------------------------------------


def check_holder(
    task: Task, *, owner: str, token: str | None, action: str, lease_live: bool
) -> None:
    """Refuse a write by anyone but the current, unexpired lease holder (both stores).

    A token that is not the task's current one is ``LeaseLost`` whatever else holds;
    without a token the owner name decides (a person claiming in one command and
    completing in the next). An expired lease is ``LeaseLost`` even if no one has
    reclaimed the task yet. Returns only if the write may pass.
    """
    if token is not None and task.lease_token != token:
        if task.status is TaskStatus.IN_PROGRESS:
            detail = f"task {task.id} was reclaimed by {task.owner}"
        else:
            detail = f"task {task.id} is now {task.status.value}"
        raise LeaseLost(task.id, detail)
    if task.status is TaskStatus.PENDING:
        raise NotOwner(task.id, None, owner)
    if task.status is not TaskStatus.IN_PROGRESS:
        raise InvalidTaskTransition(
            task.id, task.status.value, f"only an in-progress task can be {action}"
        )
    if task.owner != owner:
        raise NotOwner(task.id, task.owner, owner)
    if not lease_live:
        expires = task.lease_expires_at
        raise LeaseLost(
            task.id,
            f"the lease expired at {expires.isoformat() if expires else '?'}; "
            "claim the task again to go on",
        )


def check_cancel(task: Task, *, actor: str, reason: str, lease_live: bool) -> None:
    """Raise why ``actor`` may not cancel ``task`` now; return when it may.

    Anyone may cancel a pending or failed task, and an in-progress one whose lease has
    lapsed (it is up for grabs anyway); while the lease is live only its owner may.
    Completed and cancelled tasks are final. A blank reason is refused.
    """
    check_cancel_reason(reason)
    if task.status in (TaskStatus.COMPLETED, TaskStatus.CANCELLED):
        raise InvalidTaskTransition(
            task.id, task.status.value, "a completed or cancelled task cannot be cancelled"
        )
    if task.status is TaskStatus.IN_PROGRESS and lease_live and task.owner != actor:
        raise NotOwner(task.id, task.owner, actor)


def check_cancel_reason(reason: str) -> None:
    """A cancellation says why: a blank reason is refused before anything is read."""
    if not reason.strip():
        raise UsageError("cancelling a task needs a reason: --reason TEXT")


def cancel_data(task: Task, reason: str) -> dict[str, Any]:
    """The ``task_cancelled`` event's data for cancelling ``task`` as it is now."""
    data: dict[str, Any] = {"reason": reason, "previous_status": task.status.value}
    if task.status is TaskStatus.IN_PROGRESS:
        data["previous_owner"] = task.owner
    return data


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
        case TaskEventType.CANCELLED:
            return _finished(task, TaskStatus.CANCELLED, d.get("reason"), at, seq)
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
    """Completed, failed or cancelled: the owner stays on record, the lease ends."""
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
