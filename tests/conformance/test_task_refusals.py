"""The task half of the Store contract, its refusals word for word: what each write
refuses, naming the task, the holder and what to do (every backend)."""

from __future__ import annotations

import re
import time
from collections.abc import Callable

import pytest

from keel.core.errors import (
    DependencyError,
    InvalidTaskTransition,
    LeaseLost,
    NotOwner,
    StoreError,
    TaskNotClaimable,
    UsageError,
)
from keel.core.tasks import Task, TaskStatus
from keel.store.base import Store

LONG = 60.0


def claimed(store: Store, task: Task, owner: str = "alice") -> Task:
    got = store.claim_task(owner=owner, lease_seconds=LONG, task_id=task.id)
    assert got is not None
    return got


def refused(error: type[Exception], message: str) -> pytest.RaisesContext[Exception]:
    return pytest.raises(error, match=f"^{re.escape(message)}$")


def test_a_task_reads_back_as_created(store: Store) -> None:
    task = store.create_task("build", actor="p", idempotency_key="build-1")
    again = store.get_task(task.id)
    assert (again.description, again.options, again.idempotency_key) == ("", {}, "build-1")


@pytest.mark.parametrize("subject", ["", "  "])
def test_a_task_needs_a_subject(store: Store, subject: str) -> None:
    with refused(UsageError, "a task needs a non-empty subject"):
        store.create_task(subject, actor="p")


def test_task_options_must_be_json(store: Store) -> None:
    with pytest.raises(UsageError, match=r"^task options must be JSON: "):
        store.create_task("build", actor="p", options={"when": object()})


def test_a_taken_id_is_skipped_and_a_broken_id_source_is_refused(store: Store) -> None:
    first = store.create_task("a", actor="p")
    ids = iter([first.id, "task_0000beef"])
    store.task_id_factory = lambda: next(ids)  # type: ignore[attr-defined]
    assert store.create_task("b", actor="p").id == "task_0000beef"
    store.task_id_factory = lambda: first.id  # type: ignore[attr-defined]
    with pytest.raises(StoreError, match=r"fresh task ids"):
        store.create_task("c", actor="p")


def test_only_a_pending_unclaimed_task_gains_blockers(store: Store) -> None:
    blocker, task = store.create_task("a", actor="p"), store.create_task("b", actor="p")
    claimed(store, task)
    with refused(
        InvalidTaskTransition,
        f"task {task.id} is in_progress: only a pending, unclaimed task can gain blockers",
    ):
        store.add_dependencies(task.id, [blocker.id], actor="p")


def test_only_a_failed_task_is_reopened_and_its_reopening_carries_nothing(store: Store) -> None:
    task = store.create_task("a", actor="p")
    with refused(
        InvalidTaskTransition, f"task {task.id} is pending: only a failed task can be reopened"
    ):
        store.reopen_task(task.id, actor="p")
    held = claimed(store, task)
    store.fail_task(task.id, owner="alice", reason="broke", token=held.lease_token)
    store.reopen_task(task.id, actor="p")
    assert store.task_events(task.id)[-1].data == {}


@pytest.mark.parametrize("seconds", [0, -1])
def test_a_lease_must_last_some_time(store: Store, seconds: float) -> None:
    task = store.create_task("a", actor="p")
    message = f"a lease must last a positive number of seconds, not {seconds}"
    with refused(UsageError, message):
        store.claim_task(owner="alice", lease_seconds=seconds, task_id=task.id)
    held = claimed(store, task)
    assert held.lease_token is not None
    with refused(UsageError, message):
        store.heartbeat_task(task.id, owner="alice", token=held.lease_token, lease_seconds=seconds)


def test_failing_needs_a_reason(store: Store) -> None:
    task = store.create_task("a", actor="p")
    held = claimed(store, task)
    with refused(UsageError, "failing a task needs a reason"):
        store.fail_task(task.id, owner="alice", reason="  ", token=held.lease_token)


def test_each_write_of_a_task_no_longer_in_progress_says_what_could_not_be_done(
    store: Store,
) -> None:
    task = store.create_task("a", actor="p")
    held = claimed(store, task)
    assert held.lease_token is not None
    store.complete_task(task.id, owner="alice", token=held.lease_token)
    writes = {
        "completed": lambda: store.complete_task(task.id, owner="alice"),
        "failed": lambda: store.fail_task(task.id, owner="alice", reason="r"),
        "released": lambda: store.release_task(task.id, owner="alice", token=""),
    }
    for action, write in writes.items():
        with pytest.raises((InvalidTaskTransition, LeaseLost)) as err:
            write()
        if isinstance(err.value, InvalidTaskTransition):
            assert str(err.value) == (
                f"task {task.id} is completed: only an in-progress task can be {action}"
            )


@pytest.mark.parametrize(
    ("action", "write"),
    [
        (
            "heartbeaten",
            lambda s, t: s.heartbeat_task(t.id, owner="bob", token=None, lease_seconds=5),
        ),
        ("completed", lambda s, t: s.complete_task(t.id, owner="bob")),
        ("failed", lambda s, t: s.fail_task(t.id, owner="bob", reason="r")),
        ("linked to a run", lambda s, t: s.link_task_run(t.id, "run_1", owner="bob", token=None)),
    ],
)
def test_a_write_by_someone_else_names_the_holder(
    store: Store, action: str, write: Callable[[Store, Task], object]
) -> None:
    task = store.create_task("a", actor="p")
    claimed(store, task)
    with refused(NotOwner, f"task {task.id} is owned by alice; bob cannot change it"):
        write(store, task)
    done = store.create_task("b", actor="p")
    held = claimed(store, done)
    store.complete_task(done.id, owner="alice", token=held.lease_token)
    with refused(
        InvalidTaskTransition,
        f"task {done.id} is completed: only an in-progress task can be {action}",
    ):
        write(store, done)


def test_releasing_without_a_reason_records_none(store: Store) -> None:
    task = store.create_task("a", actor="p")
    held = claimed(store, task)
    assert held.lease_token is not None
    store.release_task(task.id, owner="alice", token=held.lease_token)
    assert store.task_events(task.id)[-1].data == {}


def test_a_claim_of_a_task_that_cannot_be_claimed_says_why(store: Store) -> None:
    blocker = store.create_task("a", actor="p")
    waiting = store.create_task("b", actor="p", blocked_by=[blocker.id])
    with refused(
        TaskNotClaimable, f"task {waiting.id} cannot be claimed: blocked by {blocker.id} (pending)"
    ):
        claimed(store, waiting)
    held = claimed(store, blocker)
    assert held.lease_expires_at is not None
    with refused(
        TaskNotClaimable,
        f"task {blocker.id} cannot be claimed: alice holds it until "
        f"{held.lease_expires_at.isoformat()}",
    ):
        claimed(store, blocker, owner="bob")
    store.fail_task(blocker.id, owner="alice", reason="r", token=held.lease_token)
    with refused(
        TaskNotClaimable,
        f"task {blocker.id} cannot be claimed: it failed; reopen it first (`keel tasks reopen`)",
    ):
        claimed(store, blocker)
    done = store.create_task("c", actor="p")
    held = claimed(store, done)
    store.complete_task(done.id, owner="alice", token=held.lease_token)
    with refused(TaskNotClaimable, f"task {done.id} cannot be claimed: it is completed"):
        claimed(store, done)


def test_a_reclaim_records_the_lease_it_took_over(store: Store) -> None:
    task = store.create_task("a", actor="p")
    held = claimed(store, task)
    assert held.lease_token is not None
    held = store.heartbeat_task(task.id, owner="alice", token=held.lease_token, lease_seconds=0.05)
    time.sleep(0.1)
    claimed(store, task, owner="bob")
    reclaimed = store.task_events(task.id)[-2]
    assert reclaimed.type == "task_reclaimed"
    assert held.lease_expires_at is not None
    assert reclaimed.data == {
        "previous_owner": "alice",
        "previous_token": held.lease_token,
        "lease_expired_at": held.lease_expires_at.isoformat(),
    }


def test_ready_tasks_of_a_status_other_than_pending_are_none(store: Store) -> None:
    task = store.create_task("a", actor="p")
    assert [t.id for t in store.list_tasks(ready=True, status=TaskStatus.PENDING)] == [task.id]
    assert store.list_tasks(ready=True, status=TaskStatus.IN_PROGRESS) == []


def test_a_task_keeps_its_description_in_its_row_and_its_history(store: Store) -> None:
    task = store.create_task("build", description="with the release flags", actor="p")
    assert task.description == "with the release flags"
    assert store.get_task(task.id).description == "with the release flags"
    assert store.task_events(task.id)[0].data["description"] == "with the release flags"


def test_a_new_task_blocked_by_an_unknown_task_is_refused_naming_both(store: Store) -> None:
    store.task_id_factory = lambda: "task_0000cafe"  # type: ignore[attr-defined]
    with refused(
        DependencyError,
        "task task_0000cafe cannot be blocked by unknown task(s) task_00000000; "
        "`keel tasks list` shows the ids",
    ):
        store.create_task("b", actor="p", blocked_by=["task_00000000"])
    assert store.list_tasks() == []


def test_a_claim_held_by_a_cancelled_blocker_names_the_task_to_cancel(store: Store) -> None:
    blocker = store.create_task("a", actor="p")
    waiting = store.create_task("b", actor="p", blocked_by=[blocker.id])
    store.cancel_task(blocker.id, actor="p", reason="not needed")
    with refused(
        TaskNotClaimable,
        f"task {waiting.id} cannot be claimed: blocked by {blocker.id} (cancelled): a cancelled "
        f"task never completes, so {waiting.id} can never be claimed; cancel it too "
        f"(`keel tasks cancel {waiting.id} --reason TEXT`)",
    ):
        claimed(store, waiting)
