"""A task as a fold of its own history, its JSON form, and the words of the refusals
both stores share (keel.core.tasks, pure)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from keel.core.errors import DependencyError, InvalidTaskTransition, LeaseLost, NotOwner, UsageError
from keel.core.tasks import (
    Task,
    TaskEvent,
    TaskStatus,
    apply_task_event,
    blocked_reason,
    check_cancel_reason,
    check_holder,
    replay_task,
    validate_dependencies,
    with_blockers,
)

T0 = datetime(2026, 2, 1, 9, 0, tzinfo=UTC)


def at(minutes: int) -> datetime:
    return T0 + timedelta(minutes=minutes)


def event(seq: int, kind: str, **data: Any) -> TaskEvent:
    return TaskEvent(
        task_id="task_1", seq=seq, type=kind, actor="a", recorded_at=at(seq), data=data
    )


LEASE = at(60).isoformat()
HISTORY = [
    event(1, "task_created", subject="build", blocked_by=[], options={"m": 1}, idempotency_key="k"),
    event(2, "dependencies_added", blocked_by=["task_0"]),
    event(3, "task_claimed", owner="w1", token="t1", attempt=1, lease_expires_at=LEASE),
    event(4, "task_heartbeat", lease_expires_at=at(90).isoformat()),
    event(5, "run_linked", run_id="run_9"),
]


@pytest.mark.parametrize("upto", range(1, 6))
def test_every_event_moves_the_tasks_updated_time(upto: int) -> None:
    task = replay_task(HISTORY[:upto])
    assert (task.updated_at, task.version) == (at(upto), upto)
    assert task.created_at == at(1)


def test_a_release_a_reclaim_and_a_reopen_each_move_the_updated_time_and_drop_the_lease() -> None:
    held = replay_task(HISTORY)
    for kind in ("task_released", "task_reclaimed"):
        task = apply_task_event(held, event(6, kind))
        assert (task.updated_at, task.owner, task.lease_token, task.lease_expires_at) == (
            at(6),
            None,
            None,
            None,
        )
        assert task.status is TaskStatus.PENDING
    failed = apply_task_event(held, event(6, "task_failed", reason="broke"))
    reopened = apply_task_event(failed, event(7, "task_reopened"))
    assert (reopened.updated_at, reopened.result, reopened.status) == (
        at(7),
        None,
        TaskStatus.PENDING,
    )


def test_a_history_from_before_descriptions_reads_an_empty_one() -> None:
    assert replay_task([event(1, "task_created", subject="s")]).description == ""


def test_a_second_creation_or_no_history_at_all_is_refused() -> None:
    with pytest.raises(ValueError, match=r"^task task_1 was created twice in its history$"):
        replay_task([HISTORY[0], event(2, "task_created", subject="again")])
    with pytest.raises(ValueError, match=r"^an empty history describes no task$"):
        replay_task([])


def test_a_task_and_an_event_as_json() -> None:
    task = with_blockers(replay_task(HISTORY), {"task_0": TaskStatus.FAILED})
    assert task.to_dict() == {
        "id": "task_1",
        "subject": "build",
        "description": "",
        "status": "in_progress",
        "owner": "w1",
        "blocked_by": ["task_0"],
        "waiting_on": ["task_0"],
        "held_by_failed": ["task_0"],
        "held_by_cancelled": [],
        "ready": False,
        "blocked_for_good": False,
        "lease_token": "t1",
        "lease_expires_at": at(90).isoformat(),
        "attempt": 1,
        "result": None,
        "run_id": "run_9",
        "options": {"m": 1},
        "idempotency_key": "k",
        "created_at": at(1).isoformat(),
        "updated_at": at(5).isoformat(),
        "version": 5,
    }
    assert HISTORY[4].to_dict() == {
        "task_id": "task_1",
        "seq": 5,
        "type": "run_linked",
        "actor": "a",
        "recorded_at": at(5).isoformat(),
        "data": {"run_id": "run_9"},
    }
    assert Task(id="t", subject="s").to_dict()["lease_expires_at"] is None


def test_why_a_pending_task_waits_names_every_blocker() -> None:
    task = Task(id="task_1", subject="s")
    assert blocked_reason(
        with_blockers(task, {"a": TaskStatus.PENDING, "b": TaskStatus.IN_PROGRESS})
    ) == ("waiting on a, b")
    assert blocked_reason(
        with_blockers(task, {"a": TaskStatus.FAILED, "b": TaskStatus.FAILED})
    ) == ("held by failed blocker a, b")
    assert blocked_reason(
        with_blockers(task, {"a": TaskStatus.CANCELLED, "b": TaskStatus.CANCELLED})
    ) == (
        "blocked by a (cancelled), b (cancelled): a cancelled task never completes, so task_1 can "
        "never be claimed; cancel it too (`keel tasks cancel task_1 --reason TEXT`)"
    )


def test_unknown_blockers_are_named_with_where_to_find_the_ids() -> None:
    with pytest.raises(DependencyError) as err:
        validate_dependencies("t", ["x", "y"], existing=lambda ids: set(), blockers_of=lambda i: ())
    assert str(err.value) == (
        "task t cannot be blocked by unknown task(s) x, y; `keel tasks list` shows the ids"
    )


HELD = replay_task(HISTORY[:3])
LOST = "lease on task_1 is no longer held by this process; nothing was written"


@pytest.mark.parametrize(
    ("task", "owner", "token", "live", "error", "message"),
    [
        (
            HELD,
            "w1",
            "stale",
            True,
            LeaseLost,
            f"{LOST} (task task_1 was reclaimed by w1)",
        ),
        (
            apply_task_event(HELD, event(4, "task_completed")),
            "w1",
            "t1",
            True,
            LeaseLost,
            f"{LOST} (task task_1 is now completed)",
        ),
        (
            Task(id="task_1", subject="s"),
            "bob",
            None,
            True,
            NotOwner,
            "task task_1 is not claimed by anyone; bob cannot change it",
        ),
        (
            apply_task_event(HELD, event(4, "task_completed")),
            "w1",
            None,
            True,
            InvalidTaskTransition,
            "task task_1 is completed: only an in-progress task can be heartbeaten",
        ),
        (HELD, "bob", None, True, NotOwner, "task task_1 is owned by w1; bob cannot change it"),
        (
            HELD,
            "w1",
            "t1",
            False,
            LeaseLost,
            f"{LOST} (the lease expired at {LEASE}; claim the task again to go on)",
        ),
    ],
)
def test_a_write_by_anyone_but_the_live_holder_is_refused_saying_why(
    task: Task, owner: str, token: str | None, live: bool, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        check_holder(task, owner=owner, token=token, action="heartbeaten", lease_live=live)


def test_a_lease_without_an_expiry_is_named_as_unknown_when_it_lapses() -> None:
    task = Task(
        id="task_1", subject="s", status=TaskStatus.IN_PROGRESS, owner="w1", lease_token="t"
    )
    with pytest.raises(
        LeaseLost, match=r"\(the lease expired at \?; claim the task again to go on\)$"
    ):
        check_holder(task, owner="w1", token="t", action="x", lease_live=False)


def test_a_cancellation_needs_a_reason() -> None:
    with pytest.raises(UsageError, match=r"^cancelling a task needs a reason: --reason TEXT$"):
        check_cancel_reason(" ")
