"""Migration 0007 on a SQLite file written before it: each run's snapshot moves from its
``runs`` row to ``run_snapshots``, and every run reads, checks, counts and goes on exactly
as before — while an append no longer rewrites a row that holds the snapshot."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from keel.core.errors import StoreError
from keel.core.events import Event, EventType, NewEvent
from keel.core.records import RunOptions
from keel.core.state import RunState
from keel.core.stats import RunStats
from keel.core.status import RunStatus
from keel.store.migrate import discover, migrate
from keel.store.sqlite.connection import Database
from keel.store.sqlite.migrate import SQLiteMigrations
from keel.store.sqlite.runs import Q
from keel.store.stats import figure_rows
from keel.store.step import dump_json
from keel.store.url import open_store
from keel.testing.stores import append, make_run, move, write_run_with_snapshot_row

BEFORE_SNAPSHOTS = 6  # the last schema version with the snapshot in the runs row


def columns(conn: sqlite3.Connection, table: str) -> list[str]:
    return [row[1] for row in conn.execute(f"PRAGMA table_info({table})")]


def runs_made_elsewhere(tmp_path: Path) -> tuple[list[tuple[RunState, list[Event]]], RunStats]:
    """A failed run with a changed file and a running one, made by a current store, and
    that store's figures."""
    store = open_store(f"sqlite:///{tmp_path / 'elsewhere.db'}")
    try:
        first = make_run(store, options=RunOptions(model="openai:m"))
        done = NewEvent(
            type=EventType.TOOL_FINISHED,
            data={"call_id": "c", "tool": "write_file", "changed_files": {"a.py": "ab" * 32}},
        )
        first, _ = append(store, first, [done])
        first, _ = append(store, first, [move(first, RunStatus.FAILED, "budget_exhausted: steps")])
        second = make_run(store, goal="still going")
        return [(s, store.read_events(s.run_id)) for s in (first, second)], store.run_stats()
    finally:
        store.close()


def old_file(tmp_path: Path, made: list[tuple[RunState, list[Event]]]) -> Path:
    path = tmp_path / "old.db"
    db = Database(path)
    migrate(
        SQLiteMigrations(db),
        [m for m in discover("keel.store.sqlite") if m.version <= BEFORE_SNAPSHOTS],
    )
    db.close()
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        assert "snapshot" in columns(conn, "runs")
        for state, events in made:
            write_run_with_snapshot_row(conn, state, events)
            conn.executemany(Q["insert_figures"], figure_rows(events, state.options))
    finally:
        conn.close()
    return path


def test_runs_stored_before_0007_read_check_count_and_go_on_as_before(tmp_path: Path) -> None:
    made, expected = runs_made_elsewhere(tmp_path)
    assert expected.reasons  # the failed run's reason, which `keel stats` reads from its snapshot
    path = old_file(tmp_path, made)
    store = open_store(f"sqlite:///{path}")  # applies 0007
    try:
        for state, events in made:
            assert store.load_run(state.run_id) == state
            assert store.read_events(state.run_id) == events
            assert store.verify_log(state.run_id).intact
        assert store.run_stats() == expected
        running = made[1][0]
        later, _ = append(store, running, [move(running, RunStatus.PAUSED, "paused by a person")])
        assert store.load_run(running.run_id) == later
    finally:
        store.close()
    with sqlite3.connect(path) as conn:
        assert "snapshot" not in columns(conn, "runs")
        stored = dict(conn.execute("SELECT run_id, snapshot FROM run_snapshots").fetchall())
    assert set(stored) == {s.run_id for s, _ in made}
    assert stored[running.run_id] == dump_json(later.to_dict())  # the status change rewrote it


def test_a_run_whose_snapshot_row_is_missing_is_reported_not_guessed(tmp_path: Path) -> None:
    path = tmp_path / "keel.db"
    store = open_store(f"sqlite:///{path}")
    try:
        run = make_run(store)
    finally:
        store.close()
    with sqlite3.connect(path) as conn:
        conn.execute("DELETE FROM run_snapshots WHERE run_id = ?", (run.run_id,))
    store = open_store(f"sqlite:///{path}")
    try:
        with pytest.raises(StoreError, match=f"snapshot of run {run.run_id} cannot be read"):
            store.load_run(run.run_id)
        check = store.verify_log(run.run_id)  # what the message sends a person to
        assert check.damage is not None and "snapshot is unreadable" in str(check.damage)
    finally:
        store.close()
