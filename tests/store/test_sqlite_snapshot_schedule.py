"""A run's snapshot schedule survives what its writer's process does between appends:
reading the run back (load, list, children, an empty append, create_run again with its
idempotency key, a claim) and storing steps its writer folded and joined
(``FoldedStep.then``) rewrite the snapshot exactly when plain appends would."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest

from keel.core.events import EventType, NewEvent
from keel.core.state import RunState
from keel.core.status import RunStatus
from keel.store.sqlite.runs import SNAPSHOT_EVERY, STATE_CACHE_SIZE
from keel.store.sqlite.store import SQLiteStore
from keel.store.step import dump_json, fold_step
from keel.testing.stores import append, make_run, move, tool_step, write_calls


def snapshot_seq(db: Path, run_id: str) -> int:
    with sqlite3.connect(db) as conn:
        (text,) = conn.execute(
            "SELECT snapshot FROM run_snapshots WHERE run_id = ?", (run_id,)
        ).fetchone()
    return int(json.loads(text)["last_seq"])


def claim_after_its_lease_lapsed(store: SQLiteStore, child: RunState) -> object:
    store.acquire_run_lease(child.run_id, owner="gone", ttl=0.01)
    time.sleep(0.05)
    claimed = store.claim_next_run(owner="w", ttl=30)
    assert claimed is not None and claimed[0] == child
    return claimed


READS: dict[str, Callable[[SQLiteStore, RunState], object]] = {
    "load_run": lambda store, child: store.load_run(child.run_id),
    "list_runs": lambda store, child: store.list_runs(),
    "child_runs": lambda store, child: store.child_runs(child.parent_id or ""),
    "empty append": lambda store, child: store.append_events(
        child.run_id, [], expected_seq=child.last_seq
    ),
    "create_run again": lambda store, child: make_run(
        store, parent_id=child.parent_id, idempotency_key="the child"
    ),
    "claim_next_run": claim_after_its_lease_lapsed,
}


@pytest.mark.parametrize("read", sorted(READS))
def test_reading_a_run_keeps_its_snapshot_due_on_time(tmp_path: Path, read: str) -> None:
    db = tmp_path / "keel.db"
    store = SQLiteStore(db)
    try:
        parent = make_run(store)
        child = make_run(store, parent_id=parent.run_id, idempotency_key="the child")
        state = write_calls(store, child, SNAPSHOT_EVERY // 2 - 1)  # two events a call
        READS[read](store, state)
        assert snapshot_seq(db, child.run_id) == 1  # not yet due
        state = write_calls(store, state, 1, start=SNAPSHOT_EVERY)
        assert snapshot_seq(db, child.run_id) == state.last_seq == SNAPSHOT_EVERY + 1
    finally:
        store.close()


def test_joined_steps_keep_the_snapshot_until_due(tmp_path: Path) -> None:
    """Two folded steps joined into one store as one step: no status change, so a
    large state's snapshot stays where it was (its rewrite is not due yet)."""
    db = tmp_path / "keel.db"
    store = SQLiteStore(db)
    try:
        run = make_run(store, goal="g" * 10_000)
        now = datetime.now(UTC)
        first = fold_step(run, tool_step("c1"), now=now)
        second = fold_step(first.state, tool_step("c2"), now=now)
        joined = first.then(second)
        assert joined.base_status is RunStatus.RUNNING
        state, stored = store.append_folded(run.run_id, joined)
        assert [e.seq for e in stored] == [2, 3, 4, 5]
        assert state.to_dict() == second.state.to_dict()
        assert snapshot_seq(db, run.run_id) == 1
        state, _ = append(store, state, [move(state, RunStatus.PAUSED, "paused")])
        assert snapshot_seq(db, run.run_id) == state.last_seq == 6
    finally:
        store.close()


def notes_of_total_text(count: int, total: int) -> list[NewEvent]:
    """``count`` notes whose stored JSON texts add up to exactly ``total`` characters."""
    frame = len(dump_json({"text": ""}))
    spare = total - count * frame
    assert spare >= count
    sizes = [spare // count] * count
    sizes[0] += spare - sum(sizes)
    return [NewEvent(type=EventType.NOTE_ADDED, data={"text": "n" * size}) for size in sizes]


@pytest.mark.parametrize(("short", "rewritten"), [(0, True), (1, False)])
def test_a_snapshot_is_due_once_the_text_after_it_reaches_its_size(
    tmp_path: Path, short: int, rewritten: bool
) -> None:
    """Exactly as much event text after the snapshot as the snapshot holds makes it due;
    one character less does not (with enough events after it either way)."""
    db = tmp_path / "keel.db"
    store = SQLiteStore(db)
    try:
        run = make_run(store)
        with sqlite3.connect(db) as conn:
            (first,) = conn.execute("SELECT snapshot FROM run_snapshots").fetchone()
        notes = notes_of_total_text(SNAPSHOT_EVERY - 1, len(first) - short)
        state, _ = append(store, run, notes)
        assert snapshot_seq(db, run.run_id) == 1
        state, _ = append(store, state, [NewEvent(type=EventType.NOTE_ADDED, data={"text": "x"})])
        assert state.last_seq == SNAPSHOT_EVERY + 1
        assert snapshot_seq(db, run.run_id) == (state.last_seq if rewritten else 1)
    finally:
        store.close()


def test_the_states_of_the_last_cache_size_runs_touched_stay_remembered(tmp_path: Path) -> None:
    """A run among the ``STATE_CACHE_SIZE`` runs its process touched last keeps its
    place in the snapshot schedule: the text after its snapshot is still counted."""
    db = tmp_path / "keel.db"
    store = SQLiteStore(db)
    try:
        run = make_run(store)
        state = write_calls(store, run, SNAPSHOT_EVERY // 2 - 1)
        for _ in range(STATE_CACHE_SIZE - 1):
            make_run(store)
        state = write_calls(store, state, 1, start=SNAPSHOT_EVERY)
        assert snapshot_seq(db, run.run_id) == state.last_seq == SNAPSHOT_EVERY + 1
    finally:
        store.close()


def test_the_run_written_last_stays_remembered_when_the_cache_is_full(tmp_path: Path) -> None:
    """With more runs than the cache holds, the oldest are forgotten, not the newest."""
    db = tmp_path / "keel.db"
    store = SQLiteStore(db)
    try:
        for _ in range(STATE_CACHE_SIZE):
            make_run(store)
        run = make_run(store)
        state = write_calls(store, run, SNAPSHOT_EVERY // 2)
        assert snapshot_seq(db, run.run_id) == state.last_seq == SNAPSHOT_EVERY + 1
    finally:
        store.close()


def test_a_process_that_reads_a_large_run_then_writes_keeps_its_snapshot(tmp_path: Path) -> None:
    """A second process reads a run with a 60 kB snapshot, then appends 50 events: far
    less text than the snapshot holds, so the snapshot is not rewritten."""
    db = tmp_path / "keel.db"
    first, second = SQLiteStore(db), SQLiteStore(db)
    try:
        run = make_run(first, goal="g" * 60_000)
        state = write_calls(second, second.load_run(run.run_id), SNAPSHOT_EVERY // 2 + 1)
        assert state.last_seq == SNAPSHOT_EVERY + 3
        assert snapshot_seq(db, run.run_id) == 1
        assert first.load_run(run.run_id).to_dict() == state.to_dict()
    finally:
        first.close()
        second.close()


def test_a_second_process_rewrites_a_small_snapshot_once_its_text_outweighs_it(
    tmp_path: Path,
) -> None:
    db = tmp_path / "keel.db"
    first, second = SQLiteStore(db), SQLiteStore(db)
    try:
        run = make_run(first)
        state = write_calls(first, run, SNAPSHOT_EVERY // 2 - 1)  # not yet due
        calls = SNAPSHOT_EVERY // 2 - 1
        while snapshot_seq(db, run.run_id) == 1:
            state = write_calls(second, state, 1, start=calls)
            calls += 1
            assert calls < SNAPSHOT_EVERY, "the second process never rewrote the snapshot"
    finally:
        first.close()
        second.close()


def paused_and_resumed(store: SQLiteStore, state: RunState) -> RunState:
    """Two status changes: the snapshot is rewritten at the second, the run's last seq."""
    state, _ = append(store, state, [move(state, RunStatus.PAUSED, "lunch")])
    state, _ = append(store, state, [move(state, RunStatus.RUNNING)])
    return state


def test_after_a_status_change_the_next_rewrite_is_due_snapshot_every_events_later(
    tmp_path: Path,
) -> None:
    db = tmp_path / "keel.db"
    store = SQLiteStore(db)
    try:
        state = paused_and_resumed(store, make_run(store))
        rewritten = state.last_seq
        assert snapshot_seq(db, state.run_id) == rewritten == 3
        state = write_calls(store, state, SNAPSHOT_EVERY // 2 - 1)  # two events a call
        assert snapshot_seq(db, state.run_id) == rewritten  # not yet due
        state = write_calls(store, state, 1, start=SNAPSHOT_EVERY)
        assert snapshot_seq(db, state.run_id) == state.last_seq == rewritten + SNAPSHOT_EVERY
    finally:
        store.close()


def test_after_a_status_change_a_large_snapshot_waits_again_for_as_much_event_text(
    tmp_path: Path,
) -> None:
    """The rewrite a status change made counts its own size: a 60 kB snapshot is not
    rewritten after SNAPSHOT_EVERY small events, only once their text outweighs it."""
    db = tmp_path / "keel.db"
    store = SQLiteStore(db)
    try:
        state = paused_and_resumed(store, make_run(store, goal="g" * 60_000))
        rewritten = state.last_seq
        assert snapshot_seq(db, state.run_id) == rewritten
        state = write_calls(store, state, SNAPSHOT_EVERY)  # 2 x SNAPSHOT_EVERY events
        assert snapshot_seq(db, state.run_id) == rewritten
        assert store.load_run(state.run_id).to_dict() == state.to_dict()
    finally:
        store.close()
