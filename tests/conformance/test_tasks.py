"""The task half of the Store contract: only the protocol is used, so every backend runs it."""

from __future__ import annotations

import re
import threading
import time
from datetime import timedelta

import pytest

from keel.core.errors import (
    DependencyError,
    InvalidTaskTransition,
    LeaseLost,
    NotOwner,
    TaskNotClaimable,
    TaskNotFound,
    UsageError,
)
from keel.core.status import RunStatus
from keel.core.tasks import Task, TaskEventType, TaskStatus, blocked_reason
from keel.store.base import Store
from keel.testing.stores import append, make_run, move
from keel.testing.tasks import assert_history_reproduces, four_task_example

LONG = 60.0  # a lease that never expires during a test
SHORT = 0.3  # a lease a test waits out


def claimed(store: Store, owner: str = "alice", task_id: str | None = None) -> Task:
    task = store.claim_task(owner=owner, lease_seconds=LONG, task_id=task_id)
    assert task is not None
    return task


def expire(store: Store, task: Task) -> None:
    """Let the holder's lease run out in real time (heartbeat it short, then wait)."""
    assert task.owner is not None and task.lease_token is not None
    store.heartbeat_task(task.id, owner=task.owner, token=task.lease_token, lease_seconds=0.05)
    time.sleep(0.1)


def subjects(tasks: list[Task]) -> list[str]:
    return [t.subject for t in tasks]


# --- creating and reading ------------------------------------------------------------


def test_create_records_task_created_as_event_one(store: Store) -> None:
    task = store.create_task(
        "create database", description="sqlite", actor="planner", options={"model": "m"}
    )
    assert re.fullmatch(r"task_[0-9a-f]{8}", task.id)
    assert (task.status, task.owner, task.attempt, task.version) == (TaskStatus.PENDING, None, 0, 1)
    assert task.options == {"model": "m"} and task.ready
    events = store.task_events(task.id)
    assert [(e.seq, e.type, e.actor) for e in events] == [(1, "task_created", "planner")]
    assert events[0].data["subject"] == "create database"
    assert task.created_at == task.updated_at == events[0].recorded_at
    assert store.get_task(task.id) == task


def test_unknown_task_ids_raise_task_not_found_everywhere(store: Store) -> None:
    for call in (
        lambda: store.get_task("task_00000000"),
        lambda: store.task_events("task_00000000"),
        lambda: store.claim_task(owner="a", lease_seconds=LONG, task_id="task_00000000"),
        lambda: store.complete_task("task_00000000", owner="a"),
        lambda: store.add_dependencies("task_00000000", [], actor="a"),
    ):
        with pytest.raises(TaskNotFound, match="task_00000000"):
            call()


def test_list_filters_by_status_and_readiness_oldest_first(store: Store) -> None:
    ex = four_task_example(store)
    assert subjects(store.list_tasks()) == [
        "create database",
        "write API",
        "add tests",
        "write docs",
    ]
    assert subjects(store.list_tasks(ready=True)) == ["create database"]
    claimed(store)
    assert subjects(store.list_tasks(status=TaskStatus.IN_PROGRESS)) == ["create database"]
    assert subjects(store.list_tasks(status=TaskStatus.PENDING)) == [
        "write API",
        "add tests",
        "write docs",
    ]
    assert store.list_tasks(ready=True) == []
    api = store.get_task(ex.api.id)
    assert api.blocked_by == (ex.database.id,) and api.waiting_on == (ex.database.id,)


def test_idempotency_key_gives_one_task_to_32_concurrent_creates(store: Store) -> None:
    results: list[Task] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(32)

    def create() -> None:
        try:
            barrier.wait()
            results.append(store.create_task("nightly build", actor="cron", idempotency_key="k1"))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=create) for _ in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == []
    assert len({t.id for t in results}) == 1 and len(results) == 32
    assert len(store.list_tasks()) == 1


def test_idempotency_key_stays_reserved_after_completion(store: Store) -> None:
    first = store.create_task("deploy", actor="cron", idempotency_key="deploy-42")
    task = claimed(store)
    store.complete_task(task.id, owner="alice", token=task.lease_token, result="shipped")
    again = store.create_task("deploy (retry)", actor="cron", idempotency_key="deploy-42")
    assert again.id == first.id
    assert again.status is TaskStatus.COMPLETED and again.subject == "deploy"
    assert len(store.list_tasks()) == 1


# --- dependencies --------------------------------------------------------------------


def test_cycle_is_rejected_with_its_path_and_nothing_written(store: Store) -> None:
    ex = four_task_example(store)
    before = {t.id: store.task_events(t.id) for t in store.list_tasks()}
    with pytest.raises(DependencyError) as info:
        store.add_dependencies(ex.database.id, [ex.docs.id, ex.tests.id], actor="planner")
    message = str(info.value)
    assert f"{ex.database.id} -> {ex.docs.id} -> {ex.database.id}" in message
    assert {t.id: store.task_events(t.id) for t in store.list_tasks()} == before
    assert store.get_task(ex.database.id).blocked_by == ()
    with pytest.raises(DependencyError) as info:
        store.add_dependencies(ex.database.id, [ex.tests.id], actor="planner")
    path = f"{ex.database.id} -> {ex.tests.id} -> {ex.api.id} -> {ex.database.id}"
    assert path in str(info.value)


def test_self_and_unknown_dependencies_are_rejected_before_anything_is_written(
    store: Store,
) -> None:
    a = store.create_task("a", actor="p")
    b = store.create_task("b", actor="p")
    with pytest.raises(DependencyError, match=f"{a.id} cannot be blocked by itself"):
        store.add_dependencies(a.id, [b.id, a.id], actor="p")
    with pytest.raises(DependencyError, match="task_ffffffff"):
        store.add_dependencies(a.id, [b.id, "task_ffffffff"], actor="p")
    with pytest.raises(DependencyError, match="task_ffffffff"):
        store.create_task("c", actor="p", blocked_by=["task_ffffffff"])
    assert store.get_task(a.id).version == 1 and store.get_task(a.id).blocked_by == ()
    assert len(store.list_tasks()) == 2


def test_dependencies_only_on_a_pending_unclaimed_task(store: Store) -> None:
    a = store.create_task("a", actor="p")
    b = store.create_task("b", actor="p")
    claimed(store, task_id=a.id)
    with pytest.raises(InvalidTaskTransition, match="only a pending, unclaimed task"):
        store.add_dependencies(a.id, [b.id], actor="p")


def test_a_completed_blocker_does_not_hold_a_new_dependent(store: Store) -> None:
    a = store.create_task("a", actor="p")
    task = claimed(store)
    store.complete_task(task.id, owner="alice")
    b = store.create_task("b", actor="p", blocked_by=[a.id])
    assert b.ready and b.blocked_by == (a.id,) and b.waiting_on == ()
    assert claimed(store).id == b.id


def test_adding_a_blocker_twice_records_nothing_new(store: Store) -> None:
    a = store.create_task("a", actor="p")
    b = store.create_task("b", actor="p", blocked_by=[a.id])
    again = store.add_dependencies(b.id, [a.id], actor="p")
    assert again.version == b.version and again.blocked_by == (a.id,)


# --- the four-task example -----------------------------------------------------------


def test_four_task_example_claims_in_dependency_then_age_order(store: Store) -> None:
    ex = four_task_example(store)

    def next_subject(owner: str) -> str | None:
        task = store.claim_task(owner=owner, lease_seconds=LONG)
        return task.subject if task else None

    assert next_subject("alice") == "create database"
    assert next_subject("bob") is None  # everything else waits on the database
    store.complete_task(ex.database.id, owner="alice")
    assert next_subject("alice") == "write API"  # API and docs are ready; API is older
    assert next_subject("bob") == "write docs"
    assert next_subject("carol") is None  # tests wait on the API, still in progress
    store.complete_task(ex.api.id, owner="alice")
    assert next_subject("carol") == "add tests"
    assert next_subject("dave") is None


def test_completion_reports_exactly_the_tasks_it_made_ready(store: Store) -> None:
    ex = four_task_example(store)
    db = claimed(store, task_id=ex.database.id)
    now_ready = store.complete_task(db.id, owner="alice", token=db.lease_token)
    assert {t.id for t in now_ready} == {ex.api.id, ex.docs.id}
    assert all(t.ready for t in now_ready)
    api = claimed(store, "bob", task_id=ex.api.id)
    assert [t.id for t in store.complete_task(api.id, owner="bob", token=api.lease_token)] == [
        ex.tests.id
    ]
    docs = claimed(store, "carol", task_id=ex.docs.id)
    assert store.complete_task(docs.id, owner="carol", token=docs.lease_token) == []


def test_completion_does_not_report_a_task_still_waiting_on_another_blocker(store: Store) -> None:
    a = store.create_task("a", actor="p")
    b = store.create_task("b", actor="p")
    c = store.create_task("c", actor="p", blocked_by=[a.id, b.id])
    ready_before = store.create_task("d", actor="p")
    ta = claimed(store, task_id=a.id)
    assert store.complete_task(a.id, owner="alice", token=ta.lease_token) == []
    tb = claimed(store, task_id=b.id)
    assert [t.id for t in store.complete_task(b.id, owner="alice", token=tb.lease_token)] == [c.id]
    assert store.get_task(ready_before.id).ready


def test_claim_of_a_blocked_task_names_its_open_blocker(store: Store) -> None:
    ex = four_task_example(store)
    with pytest.raises(TaskNotClaimable) as info:
        store.claim_task(owner="alice", lease_seconds=LONG, task_id=ex.tests.id)
    assert ex.api.id in str(info.value) and ex.database.id not in str(info.value)
    assert store.task_events(ex.tests.id)[-1].type != TaskEventType.CLAIMED


def test_non_owner_completion_is_refused_and_changes_nothing(store: Store) -> None:
    ex = four_task_example(store)
    db = claimed(store, "alice")
    before = store.task_events(db.id)
    with pytest.raises(NotOwner, match="owned by alice; mallory cannot change it"):
        store.complete_task(ex.database.id, owner="mallory")
    with pytest.raises(NotOwner):
        store.fail_task(ex.database.id, owner="mallory", reason="sabotage")
    with pytest.raises(NotOwner, match="not claimed by anyone"):
        store.complete_task(ex.api.id, owner="mallory")
    assert store.task_events(db.id) == before
    assert store.get_task(db.id).status is TaskStatus.IN_PROGRESS


# --- claims and leases ---------------------------------------------------------------


def test_claim_records_owner_attempt_token_and_database_lease(store: Store) -> None:
    store.create_task("a", actor="p")
    task = store.claim_task(owner="alice", lease_seconds=45.0)
    assert task is not None
    assert (task.status, task.owner, task.attempt) == (TaskStatus.IN_PROGRESS, "alice", 1)
    assert task.lease_token is not None and re.fullmatch(r"[0-9a-f]{32}", task.lease_token)
    event = store.task_events(task.id)[-1]
    assert (event.type, event.actor, event.data["token"]) == (
        "task_claimed",
        "alice",
        task.lease_token,
    )
    assert task.lease_expires_at is not None
    lease = task.lease_expires_at - event.recorded_at
    assert abs(lease - timedelta(seconds=45)) < timedelta(milliseconds=1)


def test_claim_without_ready_task_returns_none(store: Store) -> None:
    assert store.claim_task(owner="alice", lease_seconds=LONG) is None
    claimed(store, task_id=store.create_task("a", actor="p").id)
    assert store.claim_task(owner="bob", lease_seconds=LONG) is None


def test_a_held_task_cannot_be_claimed_by_anyone_else(store: Store) -> None:
    task = claimed(store, task_id=store.create_task("a", actor="p").id)
    with pytest.raises(TaskNotClaimable, match="alice holds it"):
        store.claim_task(owner="bob", lease_seconds=LONG, task_id=task.id)


def test_finished_tasks_are_not_claimable(store: Store) -> None:
    a = claimed(store, task_id=store.create_task("a", actor="p").id)
    store.complete_task(a.id, owner="alice")
    with pytest.raises(TaskNotClaimable, match="completed"):
        store.claim_task(owner="bob", lease_seconds=LONG, task_id=a.id)


def test_heartbeat_extends_the_lease_and_a_stale_token_changes_nothing(store: Store) -> None:
    task = claimed(store, task_id=store.create_task("a", actor="p").id)
    assert task.lease_token and task.lease_expires_at
    beat = store.heartbeat_task(task.id, owner="alice", token=task.lease_token, lease_seconds=600)
    assert beat.lease_expires_at is not None and beat.lease_expires_at > task.lease_expires_at
    assert store.task_events(task.id)[-1].type == "task_heartbeat"
    before = store.task_events(task.id)
    with pytest.raises(LeaseLost):
        store.heartbeat_task(task.id, owner="alice", token="0" * 32, lease_seconds=600)
    with pytest.raises(LeaseLost):
        store.complete_task(task.id, owner="alice", token="0" * 32)
    assert store.task_events(task.id) == before


def test_expired_lease_is_reclaimed_inside_the_claim_and_recorded(store: Store) -> None:
    task = store.create_task("a", actor="p")
    first = store.claim_task(owner="alice", lease_seconds=SHORT)
    assert first is not None
    assert store.claim_task(owner="bob", lease_seconds=LONG) is None
    time.sleep(SHORT + 0.1)
    second = store.claim_task(owner="bob", lease_seconds=LONG)
    assert second is not None and second.id == task.id
    assert (second.owner, second.attempt) == ("bob", 2)
    assert second.lease_token != first.lease_token
    reclaim, claim = store.task_events(task.id)[-2:]
    assert (reclaim.type, reclaim.actor) == ("task_reclaimed", "bob")
    assert reclaim.data["previous_owner"] == "alice"
    assert reclaim.data["previous_token"] == first.lease_token
    assert (claim.type, claim.data["owner"]) == ("task_claimed", "bob")
    assert reclaim.recorded_at == claim.recorded_at


def test_old_holder_is_refused_everything_after_a_reclaim(store: Store) -> None:
    store.create_task("a", actor="p")
    old = claimed(store, "alice")
    expire(store, old)
    new = claimed(store, "bob", task_id=old.id)
    token = old.lease_token
    assert token is not None
    before = store.task_events(old.id)
    for write in (
        lambda: store.heartbeat_task(old.id, owner="alice", token=token, lease_seconds=LONG),
        lambda: store.complete_task(old.id, owner="alice", token=token),
        lambda: store.fail_task(old.id, owner="alice", reason="x", token=token),
        lambda: store.release_task(old.id, owner="alice", token=token),
        lambda: store.link_task_run(old.id, "run_x", owner="alice", token=token),
    ):
        with pytest.raises(LeaseLost, match="reclaimed by bob"):
            write()
    with pytest.raises(NotOwner):  # token-less, by name: still not the owner
        store.complete_task(old.id, owner="alice")
    assert store.task_events(old.id) == before
    assert store.get_task(old.id).row() == store.get_task(new.id).row()
    assert store.get_task(old.id).owner == "bob"


def test_expired_but_unreclaimed_holder_is_refused_and_task_stays_claimable(
    store: Store,
) -> None:
    store.create_task("a", actor="p")
    task = claimed(store, "alice")
    expire(store, task)
    token = task.lease_token
    assert token is not None
    before = store.task_events(task.id)
    with pytest.raises(LeaseLost, match="expired"):
        store.heartbeat_task(task.id, owner="alice", token=token, lease_seconds=LONG)
    with pytest.raises(LeaseLost, match="expired"):
        store.complete_task(task.id, owner="alice", token=token)
    with pytest.raises(LeaseLost, match="expired"):
        store.complete_task(task.id, owner="alice")
    assert store.task_events(task.id) == before
    again = claimed(store, "alice")  # the same owner may claim again: a new attempt
    assert (again.id, again.attempt) == (task.id, 2)


def test_tokenless_completion_by_the_owner_is_accepted(store: Store) -> None:
    store.create_task("a", actor="p")
    task = claimed(store, "alice@laptop")
    assert store.complete_task(task.id, owner="alice@laptop", result="done") == []
    done = store.get_task(task.id)
    assert (done.status, done.result, done.lease_token) == (TaskStatus.COMPLETED, "done", None)
    with pytest.raises(InvalidTaskTransition, match="completed"):
        store.complete_task(task.id, owner="alice@laptop")


def test_release_gives_the_task_back_and_fences_the_old_token(store: Store) -> None:
    store.create_task("a", actor="p")
    task = claimed(store, "alice")
    assert task.lease_token is not None
    released = store.release_task(task.id, owner="alice", token=task.lease_token)
    assert (released.status, released.owner, released.attempt) == (TaskStatus.PENDING, None, 1)
    with pytest.raises(LeaseLost):
        store.complete_task(task.id, owner="alice", token=task.lease_token)
    assert claimed(store, "bob").attempt == 2


def test_release_records_its_reason_in_the_history(store: Store) -> None:
    store.create_task("a", actor="p")
    task = claimed(store, "run:run_1")
    assert task.lease_token is not None
    store.release_task(
        task.id, owner="run:run_1", token=task.lease_token, reason="run run_1 ended failed"
    )
    last = store.task_events(task.id)[-1]
    assert (last.type, last.actor, last.data) == (
        "task_released",
        "run:run_1",
        {"reason": "run run_1 ended failed"},
    )
    assert_history_reproduces(store, task.id)


def test_tasks_held_by_lists_one_owners_claims_oldest_first(store: Store) -> None:
    first = store.create_task("a", actor="p")
    other = store.create_task("b", actor="p")
    second = store.create_task("c", actor="p")
    done = store.create_task("d", actor="p")
    claimed(store, "run:r1", task_id=second.id)
    claimed(store, "run:r1", task_id=first.id)
    claimed(store, "someone", task_id=other.id)
    claimed(store, "run:r1", task_id=done.id)
    store.complete_task(done.id, owner="run:r1")
    held = store.tasks_held_by("run:r1")
    assert [t.id for t in held] == [first.id, second.id]
    assert all(t.status is TaskStatus.IN_PROGRESS and t.lease_token for t in held)
    assert store.tasks_held_by("nobody") == []


def test_link_task_run_records_the_run_under_the_lease(store: Store) -> None:
    store.create_task("a", actor="p")
    task = claimed(store, "alice")
    assert task.lease_token is not None
    linked = store.link_task_run(task.id, "run_0123", owner="alice", token=task.lease_token)
    assert linked.run_id == "run_0123"
    assert store.task_events(task.id)[-1].data == {"run_id": "run_0123"}


# --- failure and reopening -----------------------------------------------------------


def test_failed_blocker_holds_dependents_and_is_named_by_list_and_get(store: Store) -> None:
    ex = four_task_example(store)
    db = claimed(store, task_id=ex.database.id)
    failed = store.fail_task(db.id, owner="alice", reason="disk full", token=db.lease_token)
    assert (failed.status, failed.result) == (TaskStatus.FAILED, "disk full")
    assert store.list_tasks(ready=True) == []
    assert store.claim_task(owner="bob", lease_seconds=LONG) is None
    listed = {t.id: t for t in store.list_tasks()}
    assert listed[ex.api.id].held_by_failed == (ex.database.id,)
    assert listed[ex.docs.id].held_by_failed == (ex.database.id,)
    assert listed[ex.tests.id].held_by_failed == ()  # waits on API, which did not fail
    assert listed[ex.tests.id].waiting_on == (ex.api.id,)
    assert store.get_task(ex.api.id).held_by_failed == (ex.database.id,)
    with pytest.raises(TaskNotClaimable, match=f"{ex.database.id} \\(failed\\)"):
        store.claim_task(owner="bob", lease_seconds=LONG, task_id=ex.api.id)


def test_a_reopened_task_is_a_new_attempt_and_then_unblocks_its_dependents(store: Store) -> None:
    ex = four_task_example(store)
    db = claimed(store, task_id=ex.database.id)
    store.fail_task(db.id, owner="alice", reason="disk full")
    with pytest.raises(TaskNotClaimable, match="reopen"):
        store.claim_task(owner="bob", lease_seconds=LONG, task_id=db.id)
    reopened = store.reopen_task(db.id, actor="lead")
    assert (reopened.status, reopened.owner, reopened.result) == (TaskStatus.PENDING, None, None)
    retry = claimed(store, "bob")
    assert (retry.id, retry.attempt) == (db.id, 2)
    assert {t.id for t in store.complete_task(db.id, owner="bob")} == {ex.api.id, ex.docs.id}
    kinds = [e.type for e in store.task_events(db.id)]
    assert kinds[1:] == [
        "task_claimed",
        "task_failed",
        "task_reopened",
        "task_claimed",
        "task_completed",
    ]


def test_only_a_failed_task_can_be_reopened(store: Store) -> None:
    task = store.create_task("a", actor="p")
    with pytest.raises(InvalidTaskTransition, match="only a failed task"):
        store.reopen_task(task.id, actor="lead")


# --- history -------------------------------------------------------------------------


def test_every_history_is_gapless_and_replays_to_the_stored_row(store: Store) -> None:
    ex = four_task_example(store)
    db = claimed(store, "alice")
    assert db.lease_token is not None
    store.heartbeat_task(db.id, owner="alice", token=db.lease_token, lease_seconds=LONG)
    store.link_task_run(db.id, "run_1", owner="alice", token=db.lease_token)
    store.complete_task(db.id, owner="alice", token=db.lease_token, result="ok")
    api = claimed(store, "bob")
    store.fail_task(api.id, owner="bob", reason="flaky")
    store.reopen_task(api.id, actor="lead")
    api = claimed(store, "carol", task_id=api.id)
    expire(store, api)
    claimed(store, "dave", task_id=api.id)
    docs = claimed(store, "erin", task_id=ex.docs.id)
    assert docs.lease_token is not None
    store.release_task(docs.id, owner="erin", token=docs.lease_token)
    for task in store.list_tasks():
        events = assert_history_reproduces(store, task.id)
        assert all(e.actor for e in events)
    assert store.get_task(ex.database.id).version == 5


def test_a_task_whose_run_waits_for_a_person_is_not_claimable_until_answered(
    store: Store,
) -> None:
    task = store.create_task("deploy", actor="lead")
    held = store.claim_task(owner="w1", lease_seconds=30)
    assert held is not None and held.lease_token is not None
    run = make_run(store, task_id=task.id)
    store.link_task_run(task.id, run.run_id, owner="w1", token=held.lease_token)
    waiting, _ = append(store, run, [move(run, RunStatus.WAITING, "approval:call_1")])
    store.release_task(task.id, owner="w1", token=held.lease_token)

    assert store.claim_task(owner="w2", lease_seconds=30) is None
    append(store, waiting, [move(waiting, RunStatus.RUNNING)])
    again = store.claim_task(owner="w2", lease_seconds=30)
    assert again is not None and again.id == task.id and again.run_id == run.run_id


# --- cancellation --------------------------------------------------------------------


def test_anyone_cancels_a_pending_task_and_the_history_says_who_and_why(store: Store) -> None:
    task = store.create_task("write docs", actor="lead")
    cancelled = store.cancel_task(task.id, actor="bob", reason="docs moved to the wiki")
    assert (cancelled.status, cancelled.result, cancelled.owner) == (
        TaskStatus.CANCELLED,
        "docs moved to the wiki",
        None,
    )
    assert not cancelled.ready
    last = assert_history_reproduces(store, task.id)[-1]
    assert (last.type, last.actor) == ("task_cancelled", "bob")
    assert last.data == {"reason": "docs moved to the wiki", "previous_status": "pending"}
    assert store.get_task(task.id) == cancelled
    assert store.list_tasks(status=TaskStatus.CANCELLED) == [cancelled]


def test_only_the_owner_cancels_a_task_it_holds(store: Store) -> None:
    store.create_task("a", actor="p")
    task = claimed(store, "alice")
    with pytest.raises(NotOwner, match="owned by alice; bob cannot"):
        store.cancel_task(task.id, actor="bob", reason="not needed")
    assert store.get_task(task.id) == task  # nothing changed
    cancelled = store.cancel_task(task.id, actor="alice", reason="not needed")
    assert (cancelled.status, cancelled.owner, cancelled.lease_token) == (
        TaskStatus.CANCELLED,
        "alice",
        None,
    )
    last = assert_history_reproduces(store, task.id)[-1]
    assert last.data == {
        "reason": "not needed",
        "previous_status": "in_progress",
        "previous_owner": "alice",
    }
    with pytest.raises(LeaseLost):  # the holder's lease ended with the task
        store.complete_task(task.id, owner="alice", token=task.lease_token)


def test_anyone_cancels_a_lapsed_claim_or_a_failed_task(store: Store) -> None:
    store.create_task("a", actor="p")
    store.create_task("b", actor="p")
    lapsed = claimed(store, "alice")
    expire(store, lapsed)
    assert store.cancel_task(lapsed.id, actor="bob", reason="abandoned").status is (
        TaskStatus.CANCELLED
    )
    assert store.task_events(lapsed.id)[-1].data["previous_owner"] == "alice"
    failing = claimed(store, "carol")
    store.fail_task(failing.id, owner="carol", reason="flaky")
    withdrawn = store.cancel_task(failing.id, actor="bob", reason="will not retry")
    assert (withdrawn.status, withdrawn.result) == (TaskStatus.CANCELLED, "will not retry")
    for task_id in (lapsed.id, failing.id):
        assert_history_reproduces(store, task_id)


def test_finished_tasks_and_blank_reasons_are_refused_and_change_nothing(store: Store) -> None:
    store.create_task("a", actor="p")
    done = claimed(store, "alice")
    store.complete_task(done.id, owner="alice")
    gone = store.create_task("b", actor="p")
    store.cancel_task(gone.id, actor="lead", reason="dup")
    for task_id, status in ((done.id, "completed"), (gone.id, "cancelled")):
        before = store.get_task(task_id)
        with pytest.raises(InvalidTaskTransition, match=f"is {status}: a completed or cancelled"):
            store.cancel_task(task_id, actor="lead", reason="again")
        assert store.get_task(task_id) == before
    fresh = store.create_task("c", actor="p")
    with pytest.raises(UsageError, match="needs a reason"):
        store.cancel_task(fresh.id, actor="lead", reason="  ")
    assert store.get_task(fresh.id).status is TaskStatus.PENDING
    with pytest.raises(TaskNotFound):
        store.cancel_task("task_00000000", actor="lead", reason="x")
    with pytest.raises(TaskNotClaimable, match="it is cancelled"):
        store.claim_task(owner="bob", lease_seconds=LONG, task_id=gone.id)


def test_dependents_of_a_cancelled_task_say_so_and_are_never_claimable(store: Store) -> None:
    ex = four_task_example(store)
    store.cancel_task(ex.database.id, actor="lead", reason="using a hosted database")
    listed = {t.id: t for t in store.list_tasks()}
    for dependent in (ex.api.id, ex.docs.id):
        task = listed[dependent]
        assert task.held_by_cancelled == (ex.database.id,) and task.held_by_failed == ()
        assert task.blocked_for_good and not task.ready
        reason = blocked_reason(task)
        assert reason is not None
        assert f"blocked by {ex.database.id} (cancelled)" in reason
        assert "can never be claimed" in reason
        assert store.get_task(dependent).blocked_for_good
        with pytest.raises(TaskNotClaimable, match=f"{ex.database.id} \\(cancelled\\).*never"):
            store.claim_task(owner="bob", lease_seconds=LONG, task_id=dependent)
    assert not listed[ex.tests.id].blocked_for_good  # waits on the API, not cancelled itself
    assert store.list_tasks(ready=True) == []
    assert store.claim_task(owner="bob", lease_seconds=LONG) is None
