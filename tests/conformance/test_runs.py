"""The runs half of the Store contract: only the protocol is used, so every backend runs it."""

from __future__ import annotations

import re
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from keel.core.errors import (
    ConcurrentUpdate,
    InvalidTransition,
    LeaseHeld,
    LeaseLost,
    NotFound,
    RunNotFound,
    UsageError,
)
from keel.core.events import EventType, NewEvent
from keel.core.records import RunOptions
from keel.core.state import RunState
from keel.core.status import RunStatus
from keel.store.base import Store, iter_all_events
from keel.store.step import fold_step
from keel.testing.stores import (
    append,
    legal_step,
    make_run,
    model_step,
    move,
    reopened,
    tool_step,
)

# --- creating runs -------------------------------------------------------------------


def test_create_run_records_run_created_as_event_one(store: Store) -> None:
    run = make_run(store, goal="fix the build", workspace="/w", task_id="task_0000abcd")
    events = store.read_events(run.run_id)
    assert [e.seq for e in events] == [1]
    assert events[0].type is EventType.RUN_CREATED
    assert events[0].data["goal"] == "fix the build"
    assert events[0].data["options"] == run.options.to_dict()
    assert run.run_id.startswith("run_") and len(run.run_id) == 16
    assert run.status is RunStatus.RUNNING
    assert (run.goal, run.workspace, run.task_id, run.last_seq) == (
        "fix the build",
        "/w",
        "task_0000abcd",
        1,
    )


def test_create_run_returns_the_state_every_reader_sees_in_any_time_zone(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TZ", "Asia/Tokyo")
    time.tzset()
    try:
        run = make_run(store)
    finally:
        monkeypatch.undo()
        time.tzset()
    assert run.updated_at is not None
    assert datetime.fromisoformat(run.updated_at).utcoffset() == timedelta(0)
    with reopened(store) as cold:
        assert cold.load_run(run.run_id).to_dict() == run.to_dict()


def test_a_run_id_already_taken_is_drawn_again(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    taken = make_run(store)
    draw = uuid.uuid4
    planned = iter([uuid.UUID(taken.run_id.removeprefix("run_") + "0" * 20)])
    monkeypatch.setattr(uuid, "uuid4", lambda: next(planned, None) or draw())
    run = make_run(store, goal="another")
    monkeypatch.undo()
    assert next(planned, None) is None  # the taken id was drawn first
    assert run.run_id != taken.run_id and run.goal == "another"
    assert store.load_run(taken.run_id) == taken
    assert store.load_run(run.run_id) == run
    assert [len(store.read_events(r.run_id)) for r in (taken, run)] == [1, 1]


def test_create_run_queued_starts_in_queued(store: Store) -> None:
    run = make_run(store, queued=True)
    assert run.status is RunStatus.QUEUED
    assert store.load_run(run.run_id).status is RunStatus.QUEUED


def test_create_run_with_used_idempotency_key_returns_the_same_run(store: Store) -> None:
    first = make_run(store, idempotency_key="k-1", goal="one")
    again = make_run(store, idempotency_key="k-1", goal="something else")
    assert again.run_id == first.run_id
    assert again.goal == "one"
    assert len(store.read_events(first.run_id)) == 1
    assert len(store.list_runs()) == 1


def test_create_run_with_unknown_parent_is_refused(store: Store) -> None:
    with pytest.raises(RunNotFound):
        make_run(store, parent_id="run_000000000000")
    parent = make_run(store)
    child = make_run(store, parent_id=parent.run_id)
    assert store.load_run(child.run_id).parent_id == parent.run_id


def test_options_survive_the_round_trip(store: Store) -> None:
    options = RunOptions(model="openai:gpt", mode="auto", verify=("pytest -q", "ruff check"))
    run = make_run(store, options=options)
    assert store.load_run(run.run_id).options == options


# --- appending -----------------------------------------------------------------------


def test_sequence_numbers_run_one_two_three_without_gap(store: Store) -> None:
    state = make_run(store)
    for i in range(5):
        state, stored = append(store, state, [*model_step(), *tool_step(f"c{i}")])
        assert [e.seq for e in stored] == list(range(state.last_seq - 3, state.last_seq + 1))
    events = store.read_events(state.run_id)
    assert [e.seq for e in events] == list(range(1, 22))
    assert len({e.event_id for e in events}) == 21


def test_recorded_at_is_utc_and_parses_back(store: Store) -> None:
    state = make_run(store)
    append(store, state, model_step())
    for event in store.read_events(state.run_id):
        assert event.recorded_at.utcoffset() == timedelta(0)
        assert event.recorded_at.tzinfo is not None
        text = event.to_dict()["recorded_at"]
        assert text.endswith("+00:00")
        assert abs(event.recorded_at - event.recorded_at.astimezone(UTC)) == timedelta(0)


def test_stored_events_equal_what_append_returned(store: Store) -> None:
    state = make_run(store)
    _, stored = append(store, state, [*model_step(content="héllo ✓"), *tool_step("c1")])
    assert store.read_events(state.run_id, after=1) == stored


def test_stale_expected_seq_raises_concurrent_update_and_writes_nothing(store: Store) -> None:
    state = make_run(store)
    moved, _ = append(store, state, model_step())
    with pytest.raises(ConcurrentUpdate) as err:
        append(store, state, tool_step("c1"))
    assert (err.value.expected, err.value.actual) == (1, 3)
    assert [e.seq for e in store.read_events(state.run_id)] == [1, 2, 3]
    assert store.load_run(state.run_id) == moved


def test_append_to_unknown_run_raises_run_not_found(store: Store) -> None:
    with pytest.raises(RunNotFound):
        store.append_events("run_ffffffffffff", model_step(), expected_seq=1)


def test_empty_append_changes_nothing(store: Store) -> None:
    state = make_run(store)
    after, stored = store.append_events(state.run_id, [], expected_seq=1)
    assert stored == [] and after == state


def test_illegal_status_change_writes_nothing_even_after_legal_events(store: Store) -> None:
    state = make_run(store)
    with pytest.raises(InvalidTransition) as err:
        store.append_events(
            state.run_id,
            [
                *model_step(),
                NewEvent(type=EventType.STATUS_CHANGED, data={"to": "completed", "reason": "x"}),
            ],
            expected_seq=1,
        )
    assert "running" in str(err.value) and "completed" in str(err.value)
    assert store.load_run(state.run_id) == state
    assert len(store.read_events(state.run_id)) == 1


def test_terminal_run_cannot_leave_its_status(store: Store) -> None:
    state = make_run(store)
    state, _ = append(store, state, [move(state, RunStatus.CANCELLED, "user stopped it")])
    for target in ("running", "waiting", "queued"):
        with pytest.raises(InvalidTransition):
            store.append_events(
                state.run_id,
                [NewEvent(type=EventType.STATUS_CHANGED, data={"to": target, "reason": "x"})],
                expected_seq=state.last_seq,
            )
    assert store.load_run(state.run_id).status is RunStatus.CANCELLED


def test_blank_reason_is_refused_by_the_store(store: Store) -> None:
    state = make_run(store)
    with pytest.raises(InvalidTransition, match="reason"):
        store.append_events(
            state.run_id,
            [NewEvent(type=EventType.STATUS_CHANGED, data={"to": "failed", "reason": "  "})],
            expected_seq=1,
        )
    assert store.load_run(state.run_id).status is RunStatus.RUNNING


def test_reason_is_stored_and_clears_on_return_to_running(store: Store) -> None:
    state = make_run(store)
    state, _ = append(store, state, [move(state, RunStatus.PAUSED, "lunch")])
    assert store.load_run(state.run_id).reason == "lunch"
    raw_resume = NewEvent(type=EventType.STATUS_CHANGED, data={"to": "running", "reason": "stale"})
    state, stored = append(store, state, [raw_resume])
    assert stored[0].data["reason"] is None
    assert store.load_run(state.run_id).reason is None
    assert store.read_events(state.run_id)[-1].data["reason"] is None


def test_usage_and_validations_survive_waiting_and_resuming(store: Store) -> None:
    state = make_run(store)
    state, _ = append(store, state, model_step(input_tokens=70, output_tokens=30, cost=0.25))
    verified = legal_step(state, 6 + 12 * 1)  # a passed verification
    state, _ = append(store, state, verified)
    state, _ = append(store, state, legal_step(state, 8))  # a question -> waiting
    assert state.status is RunStatus.WAITING
    state, _ = append(store, state, legal_step(state, 0))  # answered -> running
    loaded = store.load_run(state.run_id)
    assert loaded.status is RunStatus.RUNNING and loaded.pending is None
    assert (loaded.usage.steps, loaded.usage.tokens, loaded.usage.cost) == (1, 100, 0.25)
    assert len(loaded.validations) == 1 and loaded.validations[0].passed


def test_waiting_run_shows_what_it_waits_for(store: Store) -> None:
    state = make_run(store)
    state, _ = append(store, state, legal_step(state, 7))  # approval request -> waiting
    loaded = store.load_run(state.run_id)
    assert loaded.status is RunStatus.WAITING
    assert loaded.pending is not None and loaded.pending.tool == "run_command"
    assert loaded.pending.arguments == {"argv": ["rm", "f0"]}


# --- the snapshot is the fold --------------------------------------------------------


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(choices=st.lists(st.integers(min_value=0, max_value=10_000), min_size=1, max_size=25))
def test_snapshot_equals_fold_of_events_for_random_legal_steps(
    store: Store, choices: list[int]
) -> None:
    state = make_run(store)
    for choice in choices:
        step = legal_step(state, choice)
        if not step:
            break
        state, _ = append(store, state, step)
    events = store.read_events(state.run_id)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    folded = RunState.from_events(events)
    assert store.load_run(state.run_id) == folded == state
    assert list(iter_all_events(store, state.run_id, page=7)) == events


# --- reading -------------------------------------------------------------------------


def test_read_events_after_and_limit(store: Store) -> None:
    state = make_run(store)
    for i in range(3):
        state, _ = append(store, state, tool_step(f"c{i}"))
    assert [e.seq for e in store.read_events(state.run_id, after=3)] == [4, 5, 6, 7]
    assert [e.seq for e in store.read_events(state.run_id, after=3, limit=2)] == [4, 5]
    assert store.read_events(state.run_id, after=7) == []


def test_reading_an_unknown_run_raises_run_not_found(store: Store) -> None:
    with pytest.raises(RunNotFound, match="run_123456789abc"):
        store.load_run("run_123456789abc")
    with pytest.raises(RunNotFound):
        store.read_events("run_123456789abc")


def test_list_runs_newest_first_and_by_status(store: Store) -> None:
    first = make_run(store, goal="first")
    second = make_run(store, goal="second", queued=True)
    third = make_run(store, goal="third")
    assert [r.run_id for r in store.list_runs()] == [third.run_id, second.run_id, first.run_id]
    assert [r.run_id for r in store.list_runs(status=RunStatus.QUEUED)] == [second.run_id]
    assert [r.run_id for r in store.list_runs(limit=1)] == [third.run_id]
    assert store.list_runs(status=RunStatus.COMPLETED) == []


def test_wait_for_events_returns_when_another_thread_appends(store: Store) -> None:
    state = make_run(store)
    assert store.wait_for_events(state.run_id, after=0, timeout=0.01) is True
    started = time.monotonic()
    assert store.wait_for_events(state.run_id, after=1, timeout=0.2) is False
    assert time.monotonic() - started >= 0.2

    def later() -> None:
        time.sleep(0.15)
        append(store, state, model_step())

    writer = threading.Thread(target=later)
    writer.start()
    started = time.monotonic()
    assert store.wait_for_events(state.run_id, after=1, timeout=5) is True
    assert time.monotonic() - started < 2
    writer.join()


# --- leases --------------------------------------------------------------------------


def test_run_lease_is_exclusive_until_released(store: Store) -> None:
    run = make_run(store)
    lease = store.acquire_run_lease(run.run_id, owner="worker-a", ttl=30)
    assert lease.owner == "worker-a" and lease.subject == run.run_id
    assert store.current_run_lease(run.run_id) == lease
    with pytest.raises(LeaseHeld) as err:
        store.acquire_run_lease(run.run_id, owner="worker-b", ttl=30)
    assert err.value.owner == "worker-a"
    store.release_run_lease(lease)
    assert store.current_run_lease(run.run_id) is None
    again = store.acquire_run_lease(run.run_id, owner="worker-b", ttl=30)
    assert again.token != lease.token


def test_renew_extends_a_held_lease(store: Store) -> None:
    run = make_run(store)
    lease = store.acquire_run_lease(run.run_id, owner="w", ttl=5)
    renewed = store.renew_run_lease(lease, ttl=60)
    assert renewed.token == lease.token
    assert renewed.expires_at > lease.expires_at + timedelta(seconds=50)


def test_expired_lease_can_be_taken_over_and_fences_the_old_holder(store: Store) -> None:
    state = make_run(store)
    old = store.acquire_run_lease(state.run_id, owner="dead", ttl=0.2)
    state, _ = append(store, state, model_step(), lease_token=old.token)
    time.sleep(0.3)
    assert store.current_run_lease(state.run_id) is None
    with pytest.raises(LeaseLost):
        append(store, state, tool_step("c1"), lease_token=old.token)
    new = store.acquire_run_lease(state.run_id, owner="alive", ttl=30)
    with pytest.raises(LeaseLost, match="alive"):
        store.renew_run_lease(old, ttl=30)
    with pytest.raises(LeaseLost):
        append(store, state, tool_step("c1"), lease_token=old.token)
    assert store.load_run(state.run_id) == state
    state, _ = append(store, state, tool_step("c1"), lease_token=new.token)
    assert state.last_seq == 5


def test_releasing_a_lease_that_is_not_ours_is_a_no_op(store: Store) -> None:
    run = make_run(store)
    old = store.acquire_run_lease(run.run_id, owner="a", ttl=0.1)
    time.sleep(0.2)
    new = store.acquire_run_lease(run.run_id, owner="b", ttl=30)
    store.release_run_lease(old)
    assert store.current_run_lease(run.run_id) == new


def test_claim_next_run_takes_the_oldest_queued_run_once(store: Store) -> None:
    assert store.claim_next_run(owner="w", ttl=30) is None
    make_run(store)  # running, not claimable
    first = make_run(store, queued=True)
    second = make_run(store, queued=True)
    claimed = store.claim_next_run(owner="w1", ttl=30)
    assert claimed is not None
    state, lease = claimed
    assert state.run_id == first.run_id and lease.owner == "w1"
    claimed2 = store.claim_next_run(owner="w2", ttl=30)
    assert claimed2 is not None and claimed2[0].run_id == second.run_id
    assert store.claim_next_run(owner="w3", ttl=30) is None


def test_claim_next_run_takes_a_running_run_whose_holder_let_go(store: Store) -> None:
    state = make_run(store)
    lease = store.acquire_run_lease(state.run_id, owner="cli", ttl=30)
    assert store.claim_next_run(owner="worker", ttl=30) is None  # held
    store.release_run_lease(lease)  # Ctrl-C, a graceful stop, or a wait for a person
    assert store.current_run_lease(state.run_id) is None
    claimed = store.claim_next_run(owner="worker", ttl=30)
    assert claimed is not None
    assert claimed[0].run_id == state.run_id and claimed[1].owner == "worker"
    assert store.claim_next_run(owner="other", ttl=30) is None


def test_claim_next_run_recovers_a_running_run_whose_holder_died(store: Store) -> None:
    state = make_run(store, queued=True)
    claimed = store.claim_next_run(owner="dead", ttl=0.2)
    assert claimed is not None
    state, lease = claimed
    append(store, state, [move(state, RunStatus.RUNNING)], lease_token=lease.token)
    assert store.claim_next_run(owner="other", ttl=30) is None
    time.sleep(0.3)
    again = store.claim_next_run(owner="other", ttl=30)
    assert again is not None
    assert again[0].run_id == state.run_id and again[0].status is RunStatus.RUNNING
    assert again[1].owner == "other"


def test_concurrent_claimers_never_share_a_run(store: Store) -> None:
    runs = {make_run(store, queued=True).run_id for _ in range(6)}
    won: list[str] = []
    lock = threading.Lock()

    def claimer(name: str) -> None:
        while (claimed := store.claim_next_run(owner=name, ttl=30)) is not None:
            with lock:
                won.append(claimed[0].run_id)

    threads = [threading.Thread(target=claimer, args=(f"w{i}",)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(won) == sorted(runs)


# --- artifacts -----------------------------------------------------------------------


def test_artifacts_are_content_addressed(store: Store) -> None:
    run = make_run(store)
    art = store.put_artifact(run.run_id, "pytest.log", b"3 passed\n")
    assert art.id.startswith("art_") and art.size == 9 and art.run_id == run.run_id
    same = store.put_artifact(run.run_id, "pytest.log", b"3 passed\n")
    assert same == art
    other = store.put_artifact(run.run_id, "ruff.log", b"All checks passed!\n")
    assert other.id != art.id
    got, content = store.get_artifact(art.id)
    assert got == art and content == b"3 passed\n"


def test_unknown_artifact_and_unknown_run_are_refused(store: Store) -> None:
    with pytest.raises(NotFound, match="art_nope"):
        store.get_artifact("art_nope")
    with pytest.raises(RunNotFound):
        store.put_artifact("run_000000000000", "x", b"x")


def test_a_step_folded_by_its_writer_is_stored_like_any_append(store: Store) -> None:
    run = make_run(store)
    first = fold_step(run, model_step(content="one"), now=datetime.now(UTC))
    both = first.then(fold_step(first.state, model_step(content="two"), now=datetime.now(UTC)))
    state, stored = store.append_folded(run.run_id, both)

    assert [e.seq for e in stored] == [2, 3, 4, 5]
    assert state.usage.steps == 2
    events = store.read_events(run.run_id)
    assert [e.seq for e in events] == [1, 2, 3, 4, 5]
    assert RunState.from_events(events).to_dict() == store.load_run(run.run_id).to_dict()
    assert store.load_run(run.run_id).to_dict() == state.to_dict()


def test_a_folded_step_on_a_stale_base_or_lost_lease_writes_nothing(store: Store) -> None:
    run = make_run(store)
    stale = fold_step(run, model_step(), now=datetime.now(UTC))
    moved, _ = append(store, run, model_step())
    with pytest.raises(ConcurrentUpdate):
        store.append_folded(run.run_id, stale)
    lease = store.acquire_run_lease(run.run_id, owner="a", ttl=30)
    step = fold_step(moved, model_step(), now=datetime.now(UTC))
    with pytest.raises(LeaseLost):
        store.append_folded(run.run_id, step, lease_token="not-the-token")
    assert store.load_run(run.run_id).last_seq == moved.last_seq
    state, _ = store.append_folded(run.run_id, step, lease_token=lease.token)
    assert state.last_seq == moved.last_seq + 2


@pytest.mark.parametrize(
    ("text", "words"),
    [("fix\x00it", "NUL character"), ("fix \ud800 it", "lone surrogate (U+D800)")],
)
def test_text_no_store_can_keep_is_refused_alike_by_every_backend(
    store: Store, text: str, words: str
) -> None:
    with pytest.raises(UsageError, match=rf"the goal contains a {re.escape(words)}"):
        store.create_run(goal=text, workspace="/ws", options=RunOptions())
    with pytest.raises(UsageError, match=rf"^the workspace path contains a {re.escape(words)}"):
        store.create_run(goal="fix it", workspace=f"/ws/{text}", options=RunOptions())
    with pytest.raises(UsageError, match=rf"the task's subject contains a {re.escape(words)}"):
        store.create_task(text, actor="alice")
    with pytest.raises(UsageError, match="the task's description contains"):
        store.create_task("ok", description=text, actor="alice")
    assert store.list_runs() == [] and store.list_tasks() == []
