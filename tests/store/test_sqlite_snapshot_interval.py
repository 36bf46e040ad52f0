"""When the SQLite store rewrites a run's snapshot: often for a small state, rarely for a
large one (its rewrite would otherwise dominate every step), and always on a status change;
whichever it is, a reader in another process gets the state the writer folded."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from keel.core.state import RunState
from keel.core.status import RunStatus
from keel.store.sqlite.runs import SNAPSHOT_EVERY
from keel.store.sqlite.store import SQLiteStore
from keel.testing.stores import append, make_run, move, write_calls


def snapshot_seq(db: Path, run_id: str) -> int:
    with sqlite3.connect(db) as conn:
        (text,) = conn.execute(
            "SELECT snapshot FROM run_snapshots WHERE run_id = ?", (run_id,)
        ).fetchone()
    return int(json.loads(text)["last_seq"])


def same_as_a_fresh_reader(db: Path, state: RunState) -> None:
    reader = SQLiteStore(db)
    try:
        assert reader.load_run(state.run_id).to_dict() == state.to_dict()
    finally:
        reader.close()


def test_a_small_state_is_rewritten_every_snapshot_every_events(tmp_path: Path) -> None:
    db = tmp_path / "keel.db"
    store = SQLiteStore(db)
    try:
        run = make_run(store)
        state = write_calls(store, run, SNAPSHOT_EVERY // 2 - 1)  # two events a call
        assert state.last_seq == SNAPSHOT_EVERY - 1
        assert snapshot_seq(db, run.run_id) == 1  # not yet due
        state = write_calls(store, state, 1, start=SNAPSHOT_EVERY)
        assert state.last_seq == SNAPSHOT_EVERY + 1
        assert snapshot_seq(db, run.run_id) == SNAPSHOT_EVERY + 1
        same_as_a_fresh_reader(db, state)
    finally:
        store.close()


def event_text(db: Path, run_id: str, after: int, before: int) -> int:
    """JSON characters of the run's events stored with after < seq < before."""
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "SELECT data FROM events WHERE run_id = ? AND seq > ? AND seq < ?",
            (run_id, after, before),
        )
        return sum(len(text) for (text,) in rows)


def test_a_large_state_waits_for_as_much_event_text_as_it_holds(tmp_path: Path) -> None:
    db = tmp_path / "keel.db"
    store = SQLiteStore(db)
    try:
        run = make_run(store, goal="g" * 60_000)  # a 60 kB snapshot
        with sqlite3.connect(db) as conn:
            (first,) = conn.execute("SELECT snapshot FROM run_snapshots").fetchone()
        size = len(first)
        state = write_calls(store, run, 3 * SNAPSHOT_EVERY)
        assert snapshot_seq(db, run.run_id) == 1  # 6 x SNAPSHOT_EVERY events: less text
        assert event_text(db, run.run_id, 1, state.last_seq + 1) < size
        same_as_a_fresh_reader(db, state)
        calls = 3 * SNAPSHOT_EVERY
        while snapshot_seq(db, run.run_id) == 1:  # more calls until the text outweighs it
            state = write_calls(store, state, 1, start=calls)
            calls += 1
            assert calls < 10_000
        # Rewritten by the first step after the text stored since reached its size.
        rewriting_step = state.last_seq - 1  # a call is two events
        assert snapshot_seq(db, run.run_id) == state.last_seq
        assert event_text(db, run.run_id, 1, rewriting_step) >= size
        assert event_text(db, run.run_id, 1, rewriting_step - 2) < size
        same_as_a_fresh_reader(db, state)
    finally:
        store.close()


def test_a_status_change_always_rewrites_the_snapshot(tmp_path: Path) -> None:
    db = tmp_path / "keel.db"
    store = SQLiteStore(db)
    try:
        run = make_run(store, goal="g" * 60_000)
        state = write_calls(store, run, 2)
        assert snapshot_seq(db, run.run_id) == 1
        state, _ = append(store, state, [move(state, RunStatus.PAUSED, "paused")])
        assert snapshot_seq(db, run.run_id) == state.last_seq
        same_as_a_fresh_reader(db, state)
    finally:
        store.close()


def test_a_writer_with_a_cold_cache_folds_on_the_stored_snapshot(tmp_path: Path) -> None:
    """A second process appending to a large-state run (its cache holds nothing) reads
    the snapshot and its tail, and what both processes then read agrees."""
    db = tmp_path / "keel.db"
    first = SQLiteStore(db)
    second = SQLiteStore(db)
    try:
        run = make_run(first, goal="g" * 60_000)
        state = write_calls(first, run, 30)
        state = write_calls(second, state, 30, start=30)
        assert first.load_run(run.run_id).to_dict() == state.to_dict()
        assert state.last_seq == 121 and len(state.changed_files) == 60
        same_as_a_fresh_reader(db, state)
    finally:
        first.close()
        second.close()
