"""Task-graph fixtures for tests of any backend: the four-task example and history checks."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from keel.core.tasks import Task, TaskEvent, TaskEventType, replay_task
from keel.store.base import Store


@dataclass(frozen=True, slots=True, kw_only=True)
class FourTasks:
    """create database; write API (after database); add tests (after API); write docs
    (after database) — created in that order, so "oldest first" is this order."""

    database: Task
    api: Task
    tests: Task
    docs: Task


def four_task_example(store: Store, *, actor: str = "planner") -> FourTasks:
    """Create the four-task example; dependencies are added after the tasks exist."""
    database = store.create_task("create database", actor=actor)
    api = store.create_task("write API", actor=actor)
    tests = store.create_task("add tests", actor=actor)
    docs = store.create_task("write docs", actor=actor)
    api = store.add_dependencies(api.id, [database.id], actor=actor)
    tests = store.add_dependencies(tests.id, [api.id], actor=actor)
    docs = store.add_dependencies(docs.id, [database.id], actor=actor)
    return FourTasks(database=database, api=api, tests=tests, docs=docs)


def lease_intervals(events: list[TaskEvent]) -> list[tuple[str, float, float]]:
    """``(owner, start, end)`` of each claim in a history, in epoch seconds.

    A lease ends at its last granted expiry, or earlier when the task was completed,
    failed, released or cancelled.
    """
    out: list[tuple[str, float, float]] = []
    current: tuple[str, float, float] | None = None
    for e in events:
        kind = TaskEventType(e.type)
        at = e.recorded_at.timestamp()
        if kind is TaskEventType.CLAIMED:
            if current is not None:
                out.append(current)
            current = (e.data["owner"], at, _epoch(e.data["lease_expires_at"]))
        elif current is not None and kind is TaskEventType.HEARTBEAT:
            current = (current[0], current[1], _epoch(e.data["lease_expires_at"]))
        elif current is not None and kind in _LEASE_ENDS:
            out.append((current[0], current[1], min(current[2], at)))
            current = None
    if current is not None:
        out.append(current)
    return out


_LEASE_ENDS = (
    TaskEventType.COMPLETED,
    TaskEventType.FAILED,
    TaskEventType.RELEASED,
    TaskEventType.CANCELLED,
)


def _epoch(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def assert_history_reproduces(store: Store, task_id: str) -> list[TaskEvent]:
    """The task's history is numbered 1..n and its replay equals the stored row."""
    events = store.task_events(task_id)
    assert [e.seq for e in events] == list(range(1, len(events) + 1)), "history has a gap"
    stored = store.get_task(task_id).row()
    assert replay_task(events) == stored, f"replay of {task_id} differs from its row"
    return events
