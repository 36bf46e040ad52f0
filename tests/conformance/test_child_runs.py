"""Runs in a tree, on every backend: a run's children, who may claim a child run, and
that nothing new starts on a run that has ended (outcomes of what began still land)."""

from __future__ import annotations

import time

import pytest

from keel.core.errors import InvalidTransition, RunNotFound
from keel.core.events import EventType, NewEvent
from keel.core.state import RunState
from keel.core.status import RunStatus
from keel.store.base import Store
from keel.store.step import STARTS_ACTION
from keel.testing.stores import append, make_run, move, reopened, tool_step

# --- Store.child_runs ----------------------------------------------------------------


def test_child_runs_are_the_direct_children_oldest_first(store: Store) -> None:
    parent = make_run(store)
    make_run(store)  # unrelated
    first = make_run(store, parent_id=parent.run_id, queued=True, task_id="task_00000001")
    second = make_run(store, parent_id=parent.run_id, queued=True)
    third = make_run(store, parent_id=parent.run_id)
    grandchild = make_run(store, parent_id=first.run_id, queued=True)

    assert [c.run_id for c in store.child_runs(parent.run_id)] == [
        first.run_id,
        second.run_id,
        third.run_id,
    ]
    assert [c.run_id for c in store.child_runs(first.run_id)] == [grandchild.run_id]
    assert store.child_runs(grandchild.run_id) == []
    assert store.child_runs(second.run_id) == []

    # Each child as it is now (not as created), and the same from a cold instance.
    append(store, second, [move(second, RunStatus.CANCELLED, "parent_cancelled")])
    listed = store.child_runs(parent.run_id)
    assert [c.status for c in listed] == [
        RunStatus.QUEUED,
        RunStatus.CANCELLED,
        RunStatus.RUNNING,
    ]
    assert listed[1].reason == "parent_cancelled"
    assert listed[0].task_id == "task_00000001" and listed[0].parent_id == parent.run_id
    with reopened(store) as other:
        cold = other.child_runs(parent.run_id)
    assert [(c.run_id, c.status, c.last_seq) for c in cold] == [
        (c.run_id, c.status, c.last_seq) for c in listed
    ]
    assert cold == listed


def test_child_runs_of_an_unknown_run_is_refused(store: Store) -> None:
    with pytest.raises(RunNotFound):
        store.child_runs("run_000000000000")


# --- claim_next_run and child runs ---------------------------------------------------


def test_claim_next_run_never_picks_a_queued_run_that_has_a_task(store: Store) -> None:
    parent = make_run(store)
    child = make_run(store, parent_id=parent.run_id, queued=True, task_id="task_0000abcd")
    plain = make_run(store, queued=True)  # newer, but the only one a run claimer may take
    claimed = store.claim_next_run(owner="worker", ttl=30)
    assert claimed is not None and claimed[0].run_id == plain.run_id
    assert store.claim_next_run(owner="worker", ttl=30) is None
    assert store.current_run_lease(child.run_id) is None  # left to whoever claims its task


def test_claim_next_run_recovers_a_child_run_whose_executor_died(store: Store) -> None:
    parent = make_run(store)
    child = make_run(store, parent_id=parent.run_id, queued=True, task_id="task_0000abcd")
    # Its task's claimer leases and starts it, then dies: the lease lapses.
    lease = store.acquire_run_lease(child.run_id, owner="executor", ttl=0.3)
    append(store, child, [move(child, RunStatus.RUNNING)], lease_token=lease.token)
    assert store.claim_next_run(owner="worker", ttl=30) is None  # still held
    time.sleep(0.4)
    claimed = store.claim_next_run(owner="worker", ttl=30)
    assert claimed is not None
    assert claimed[0].run_id == child.run_id and claimed[0].status is RunStatus.RUNNING
    assert claimed[1].owner == "worker"


# --- nothing starts on an ended run -----------------------------------------------------


def ended_runs(store: Store) -> list[RunState]:
    """One run in each terminal status."""
    runs = []
    for status in (RunStatus.FAILED, RunStatus.BLOCKED, RunStatus.CANCELLED):
        run = make_run(store)
        runs.append(append(store, run, [move(run, status, "it ended")])[0])
    run = make_run(store)
    run, _ = append(store, run, [move(run, RunStatus.VERIFYING, "the model asked to finish")])
    runs.append(append(store, run, [move(run, RunStatus.COMPLETED, "verified")])[0])
    return runs


STARTS = [
    NewEvent(
        type=EventType.TOOL_STARTED,
        data={"call_id": "c9", "tool": "write_file", "arguments": {}, "effect": "write"},
    ),
    NewEvent(type=EventType.MODEL_REQUESTED, data={"step": 2, "messages": 3}),
    NewEvent(type=EventType.VERIFICATION_STARTED, data={"commands": ["pytest -q"]}),
    NewEvent(
        type=EventType.SUBAGENT_SPAWNED,
        data={"call_id": "c9", "child_run_id": "run_00000000abcd", "agent": "explorer"},
    ),
    NewEvent(
        type=EventType.APPROVAL_REQUESTED,
        data={"call_id": "c9", "tool": "run_command", "arguments": {}, "digest": "d"},
    ),
    NewEvent(type=EventType.INPUT_REQUESTED, data={"call_id": "c9", "question": "which?"}),
    NewEvent(type=EventType.PLAN_WRITTEN, data={"content": "# plan"}),
    NewEvent(type=EventType.TODO_UPDATED, data={"todos": []}),
    NewEvent(type=EventType.MODE_CHANGED, data={"from": "plan", "to": "edit"}),
    NewEvent(type=EventType.NOTE_ADDED, data={"text": "note"}),
    NewEvent(type=EventType.RUN_RESUMED, data={"owner": "w", "incarnation": 2}),
    NewEvent(type=EventType.BUDGET_WARNING, data={"dimension": "steps", "used": 9, "limit": 10}),
    NewEvent(type=EventType.NO_PROGRESS_DETECTED, data={"repeated": "read_file"}),
    NewEvent(type=EventType.RETRY_SCHEDULED, data={"attempt": 2, "wait_s": 1.0}),
]


def test_the_refused_events_are_exactly_the_ones_that_start_something() -> None:
    assert {e.type for e in STARTS} == STARTS_ACTION


def test_no_action_starts_on_an_ended_run(store: Store) -> None:
    for run in ended_runs(store):
        for event in STARTS:
            with pytest.raises(InvalidTransition, match="no new action may start"):
                append(store, run, [event])
        assert store.load_run(run.run_id).last_seq == run.last_seq  # nothing written
        assert len(store.read_events(run.run_id)) == run.last_seq


def test_a_step_that_ends_the_run_cannot_also_start_something(store: Store) -> None:
    run = make_run(store)
    note = NewEvent(type=EventType.NOTE_ADDED, data={"text": "after the end"})
    with pytest.raises(InvalidTransition, match=f"run {run.run_id} is cancelled"):
        append(store, run, [move(run, RunStatus.CANCELLED, "stop"), note])
    assert store.load_run(run.run_id).status is RunStatus.RUNNING  # the whole step refused
    # The same events the other way round are a legal step.
    state, _ = append(store, run, [note, move(run, RunStatus.CANCELLED, "stop")])
    assert state.status is RunStatus.CANCELLED


def test_outcomes_of_what_already_began_are_recorded_on_an_ended_run(store: Store) -> None:
    run = make_run(store)
    started = tool_step("c1")[:1] + tool_step("c2")[:1] + tool_step("c3", tool="run_command")[:1]
    run, _ = append(store, run, [*started])
    run, _ = append(store, run, [move(run, RunStatus.CANCELLED, "stop")])
    outcomes = [
        tool_step("c1")[1],
        NewEvent(
            type=EventType.TOOL_FAILED,
            data={"call_id": "c2", "tool": "write_file", "message": "disk full"},
        ),
        NewEvent(
            type=EventType.PROCESS_STARTED,
            data={"call_id": "c3", "pgid": 4242, "host": "h", "boot_id": "b", "start": 1},
        ),
        NewEvent(type=EventType.PROCESS_SETTLED, data={"call_id": "c3", "outcome": "killed"}),
        NewEvent(
            type=EventType.CALL_RECONCILED,
            data={"call_id": "c3", "outcome": "not_done", "detail": "killed on cancel"},
        ),
        NewEvent(
            type=EventType.MODEL_RESPONDED,
            data={"content": "late", "tool_calls": [], "usage": {"input_tokens": 5}},
        ),
        NewEvent(
            type=EventType.SUBAGENT_FINISHED,
            data={"call_id": "c4", "child_run_id": "run_00000000abcd", "status": "cancelled"},
        ),
        NewEvent(type=EventType.VERIFICATION_PASSED, data={"records": []}),
        NewEvent(type=EventType.VERIFICATION_FAILED, data={"records": []}),
        NewEvent(type=EventType.LEASE_TAKEN_OVER, data={"owner": "dead", "pid": 1}),
        NewEvent(type=EventType.TASK_LINKED, data={"task_id": "task_0000abcd"}),
    ]
    for event in outcomes:
        run, stored = append(store, run, [event])
        assert [e.type for e in stored] == [event.type]
    assert run.status is RunStatus.CANCELLED
    assert [e.type for e in store.read_events(run.run_id)][-len(outcomes) :] == [
        e.type for e in outcomes
    ]


# --- a child's task waits for its run --------------------------------------------------


@pytest.mark.parametrize("marker", ["child_of", "handoff_from"])
def test_a_child_task_is_not_work_until_its_run_is_linked(store: Store, marker: str) -> None:
    parent = make_run(store)
    child_task = store.create_task(
        "explorer: look", actor=f"run:{parent.run_id}", options={marker: parent.run_id}
    )
    plain = store.create_task("plain work", actor="tester")
    # a claimer looking for any work skips the child's task (its parent makes its run) ...
    first = store.claim_task(owner="worker", lease_seconds=30)
    assert first is not None and first.id == plain.id
    assert store.claim_task(owner="worker", lease_seconds=30) is None
    # ... while its parent claims it by id, links its run, and hands it back
    claimed = store.claim_task(owner="parent", lease_seconds=30, task_id=child_task.id)
    assert claimed is not None and claimed.lease_token is not None
    child = make_run(store, parent_id=parent.run_id, queued=True, task_id=child_task.id)
    store.link_task_run(child_task.id, child.run_id, owner="parent", token=claimed.lease_token)
    store.release_task(child_task.id, owner="parent", token=claimed.lease_token, reason="go")
    # now it is anyone's work
    taken = store.claim_task(owner="worker", lease_seconds=30)
    assert taken is not None and taken.id == child_task.id and taken.run_id == child.run_id
