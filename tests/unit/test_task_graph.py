"""The pure task-graph rules: dependency validation, readiness, and the history fold."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest

from keel.core.errors import DependencyError
from keel.core.tasks import (
    Task,
    TaskEvent,
    TaskEventType,
    TaskStatus,
    apply_task_event,
    blocked_reason,
    is_ready,
    new_task_id,
    replay_task,
    validate_dependencies,
    with_blockers,
)

T0 = datetime(2025, 1, 1, tzinfo=UTC)


def check(graph: dict[str, list[str]], task: str, blockers: list[str]) -> tuple[str, ...]:
    """validate_dependencies over an in-memory graph ``{task: its blockers}``."""
    return validate_dependencies(
        task,
        blockers,
        existing=lambda ids: {i for i in ids if i in graph},
        blockers_of=lambda t: graph.get(t, []),
        current=graph.get(task, []),
    )


def test_new_task_id_is_task_and_eight_hex_digits() -> None:
    ids = {new_task_id() for _ in range(200)}
    assert all(re.fullmatch(r"task_[0-9a-f]{8}", i) for i in ids)
    assert len(ids) == 200


def test_self_dependency_is_rejected_naming_the_task() -> None:
    with pytest.raises(DependencyError, match="task_a cannot be blocked by itself"):
        check({"task_a": []}, "task_a", ["task_a"])


def test_unknown_blockers_are_rejected_naming_each_of_them() -> None:
    with pytest.raises(DependencyError, match="unknown task\\(s\\) task_x, task_y"):
        check({"task_a": [], "task_b": []}, "task_a", ["task_b", "task_x", "task_y"])


def test_two_task_cycle_is_rejected_with_its_path() -> None:
    graph = {"task_a": [], "task_b": ["task_a"]}
    with pytest.raises(DependencyError, match="cycle: task_a -> task_b -> task_a;"):
        check(graph, "task_a", ["task_b"])


def test_long_cycle_names_every_task_on_the_path() -> None:
    # d is blocked by c, c by b, b by a; making a wait for d closes a -> d -> c -> b -> a.
    graph = {"a": [], "b": ["a"], "c": ["b"], "d": ["c"], "e": ["a"]}
    with pytest.raises(DependencyError) as info:
        check(graph, "a", ["e", "d"])
    assert "a -> e -> a" in str(info.value)  # the first offending blocker is reported
    with pytest.raises(DependencyError, match="cycle: a -> d -> c -> b -> a;"):
        check(graph, "a", ["d"])


def test_diamond_is_not_a_cycle() -> None:
    graph = {"db": [], "api": ["db"], "docs": ["db"], "tests": ["api"]}
    assert check(graph, "tests", ["docs", "api"]) == ("docs",)


def test_repeated_and_already_present_blockers_are_dropped_in_order() -> None:
    graph = {"a": [], "b": [], "c": [], "t": ["a"]}
    assert check(graph, "t", ["c", "a", "b", "c"]) == ("c", "b")
    assert check(graph, "t", ["a"]) == ()


def test_ready_only_when_pending_and_every_blocker_completed() -> None:
    done, pending = TaskStatus.COMPLETED, TaskStatus.PENDING
    assert is_ready(pending, {})
    assert is_ready(pending, {"a": done, "b": done})
    assert not is_ready(pending, {"a": done, "b": TaskStatus.IN_PROGRESS})
    assert not is_ready(TaskStatus.IN_PROGRESS, {})
    assert not is_ready(TaskStatus.FAILED, {"a": done})


def test_blocked_reason_names_the_failed_blocker_that_holds_a_task() -> None:
    task = with_blockers(
        Task(id="t", subject="s", blocked_by=("a", "b", "c")),
        {"a": TaskStatus.COMPLETED, "b": TaskStatus.FAILED, "c": TaskStatus.PENDING},
    )
    assert task.waiting_on == ("b", "c")
    assert task.held_by_failed == ("b",)
    assert not task.ready
    reason = blocked_reason(task)
    assert reason is not None and "failed blocker b" in reason
    waiting = with_blockers(Task(id="t", subject="s", blocked_by=("c",)), {"c": TaskStatus.PENDING})
    assert blocked_reason(waiting) == "waiting on c"
    assert blocked_reason(Task(id="t", subject="s")) is None


def _event(seq: int, kind: TaskEventType, actor: str = "me", **data: object) -> TaskEvent:
    return TaskEvent(
        task_id="task_1",
        seq=seq,
        type=kind.value,
        actor=actor,
        recorded_at=T0 + timedelta(seconds=seq),
        data=dict(data),
    )


def test_replaying_a_history_rebuilds_every_field_of_the_row() -> None:
    lease = (T0 + timedelta(seconds=60)).isoformat()
    history = [
        _event(
            1,
            TaskEventType.CREATED,
            subject="build",
            description="d",
            blocked_by=["x"],
            options={"model": "m"},
            idempotency_key="k",
        ),
        _event(2, TaskEventType.DEPENDENCIES_ADDED, blocked_by=["y"]),
        _event(
            3,
            TaskEventType.CLAIMED,
            "w1",
            owner="w1",
            token="t1",
            attempt=1,
            lease_expires_at=lease,
        ),
        _event(4, TaskEventType.RECLAIMED, "w2", previous_owner="w1", previous_token="t1"),
        _event(
            5,
            TaskEventType.CLAIMED,
            "w2",
            owner="w2",
            token="t2",
            attempt=2,
            lease_expires_at=lease,
        ),
        _event(6, TaskEventType.RUN_LINKED, "w2", run_id="run_1"),
        _event(7, TaskEventType.FAILED, "w2", reason="broke"),
        _event(8, TaskEventType.REOPENED),
        _event(
            9,
            TaskEventType.CLAIMED,
            "w3",
            owner="w3",
            token="t3",
            attempt=3,
            lease_expires_at=lease,
        ),
        _event(10, TaskEventType.COMPLETED, "w3", result="done"),
    ]
    task = replay_task(history)
    assert task == Task(
        id="task_1",
        subject="build",
        description="d",
        status=TaskStatus.COMPLETED,
        owner="w3",
        blocked_by=("x", "y"),
        attempt=3,
        result="done",
        run_id="run_1",
        options={"model": "m"},
        idempotency_key="k",
        created_at=T0 + timedelta(seconds=1),
        updated_at=T0 + timedelta(seconds=10),
        version=10,
    )


def test_a_gap_in_the_history_is_refused() -> None:
    created = apply_task_event(None, _event(1, TaskEventType.CREATED, subject="s"))
    with pytest.raises(ValueError, match="gap"):
        apply_task_event(created, _event(3, TaskEventType.REOPENED))


def test_a_history_must_start_with_task_created() -> None:
    with pytest.raises(ValueError, match="must start with task_created"):
        replay_task([_event(1, TaskEventType.REOPENED)])


def test_release_and_reclaim_return_the_task_to_pending_without_a_lease() -> None:
    lease = (T0 + timedelta(seconds=60)).isoformat()
    claimed = replay_task(
        [
            _event(1, TaskEventType.CREATED, subject="s"),
            _event(
                2, TaskEventType.CLAIMED, owner="w", token="t", attempt=1, lease_expires_at=lease
            ),
        ]
    )
    for kind in (TaskEventType.RELEASED, TaskEventType.RECLAIMED):
        after = apply_task_event(claimed, _event(3, kind))
        assert (after.status, after.owner, after.lease_token, after.lease_expires_at) == (
            TaskStatus.PENDING,
            None,
            None,
            None,
        )
        assert after.attempt == 1
