"""Cancelling, in pure code: who may cancel, the fold of ``task_cancelled``, and what a
task held by a cancelled blocker says about itself."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from keel.core.errors import InvalidTaskTransition, NotOwner, UsageError
from keel.core.tasks import (
    Task,
    TaskEvent,
    TaskEventType,
    TaskStatus,
    apply_task_event,
    blocked_reason,
    cancel_data,
    check_cancel,
    claim_refusal_for_blockers,
    with_blockers,
)

T0 = datetime(2025, 1, 1, tzinfo=UTC)
HELD = Task(id="t", subject="s", status=TaskStatus.IN_PROGRESS, owner="alice", lease_token="k")


@pytest.mark.parametrize(
    ("task", "actor", "lease_live", "refused"),
    [
        (Task(id="t", subject="s"), "anyone", False, None),
        (Task(id="t", subject="s", status=TaskStatus.FAILED, owner="bo"), "anyone", False, None),
        (HELD, "alice", True, None),
        (HELD, "bob", True, NotOwner),
        (HELD, "bob", False, None),  # the lease lapsed: up for grabs, so anyone may
        (
            Task(id="t", subject="s", status=TaskStatus.COMPLETED),
            "alice",
            False,
            InvalidTaskTransition,
        ),
        (
            Task(id="t", subject="s", status=TaskStatus.CANCELLED),
            "alice",
            False,
            InvalidTaskTransition,
        ),
    ],
)
def test_who_may_cancel(
    task: Task, actor: str, lease_live: bool, refused: type[Exception] | None
) -> None:
    if refused is None:
        check_cancel(task, actor=actor, reason="why", lease_live=lease_live)
    else:
        with pytest.raises(refused, match="task t is"):
            check_cancel(task, actor=actor, reason="why", lease_live=lease_live)


def test_a_cancellation_needs_a_reason() -> None:
    with pytest.raises(UsageError, match="needs a reason"):
        check_cancel(Task(id="t", subject="s"), actor="a", reason=" \n", lease_live=False)


def test_the_fold_ends_the_lease_keeps_the_owner_and_records_why() -> None:
    data = cancel_data(HELD, "not needed")
    assert data == {
        "reason": "not needed",
        "previous_status": "in_progress",
        "previous_owner": "alice",
    }
    event = TaskEvent(
        task_id="t",
        seq=HELD.version + 1,
        type=TaskEventType.CANCELLED.value,
        actor="alice",
        recorded_at=T0 + timedelta(seconds=5),
        data=data,
    )
    cancelled = apply_task_event(HELD, event)
    assert (cancelled.status, cancelled.owner, cancelled.lease_token, cancelled.result) == (
        TaskStatus.CANCELLED,
        "alice",
        None,
        "not needed",
    )
    assert cancel_data(Task(id="t", subject="s"), "dup") == {
        "reason": "dup",
        "previous_status": "pending",
    }


def test_a_cancelled_blocker_holds_for_good_and_is_named_before_a_failed_one() -> None:
    blockers = {"a": TaskStatus.FAILED, "b": TaskStatus.CANCELLED, "c": TaskStatus.COMPLETED}
    task = with_blockers(Task(id="t", subject="s", blocked_by=("a", "b", "c")), blockers)
    assert (task.held_by_failed, task.held_by_cancelled) == (("a",), ("b",))
    assert task.blocked_for_good and not task.ready
    reason = blocked_reason(task)
    assert reason is not None
    assert reason.startswith("blocked by b (cancelled): a cancelled task never completes")
    assert "t can never be claimed" in reason and "keel tasks cancel t" in reason
    assert claim_refusal_for_blockers("t", blockers) == reason
    assert task.to_dict()["blocked_for_good"] is True
    assert task.row() == Task(id="t", subject="s", blocked_by=("a", "b", "c"))


def test_a_failed_blocker_alone_is_not_for_good() -> None:
    blockers = {"a": TaskStatus.FAILED, "b": TaskStatus.PENDING}
    task = with_blockers(Task(id="t", subject="s", blocked_by=("a", "b")), blockers)
    assert not task.blocked_for_good
    assert blocked_reason(task) == "held by failed blocker a"
    assert claim_refusal_for_blockers("t", blockers) == "blocked by a (failed), b (pending)"
    assert claim_refusal_for_blockers("t", {"a": TaskStatus.COMPLETED}) is None
    finished = with_blockers(Task(id="t", subject="s", status=TaskStatus.COMPLETED), blockers)
    assert not finished.blocked_for_good  # only a pending task can be stranded
