"""Migration 0006 on a database written before it: the figures of the runs already stored
are made from their events, equal to those a store writes as it appends, so
``keel stats`` counts old runs and new ones alike."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest

from keel.core.events import Event, EventType, NewEvent
from keel.core.records import RunOptions
from keel.core.state import RunState
from keel.core.stats import RunStats
from keel.core.status import RunStatus
from keel.store.migrate import discover, migrate
from keel.store.postgres.connection import Database as PgDatabase
from keel.store.postgres.migrate import PostgresMigrations
from keel.store.sqlite.connection import Database
from keel.store.sqlite.migrate import SQLiteMigrations
from keel.store.url import open_store
from keel.testing.stores import (
    append,
    make_run,
    move,
    postgres_unavailable,
    scratch_database,
    write_run_with_snapshot_row,
)

BEFORE_FIGURES = 5  # the last schema version without event_figures


@contextmanager
def old_database(backend: str, tmp_path: Path) -> Iterator[tuple[str, Any]]:
    """The URL of a database migrated only up to BEFORE_FIGURES, and a raw connection."""
    if backend == "sqlite":
        path = tmp_path / "old.db"
        db = Database(path)
        migrate(
            SQLiteMigrations(db),
            [m for m in discover("keel.store.sqlite") if m.version <= BEFORE_FIGURES],
        )
        db.close()
        conn = sqlite3.connect(path, isolation_level=None)
        try:
            yield f"sqlite:///{path}", conn
        finally:
            conn.close()
        return
    if reason := postgres_unavailable():
        pytest.skip(f"PostgreSQL store not tested: {reason}")
    with scratch_database() as url:
        pg = PgDatabase(url)
        migrate(
            PostgresMigrations(pg),
            [m for m in discover("keel.store.postgres") if m.version <= BEFORE_FIGURES],
        )
        pg.close()
        with psycopg.connect(url, autocommit=True) as pg_conn:
            yield url, pg_conn


def turn(model: str, elapsed: float) -> NewEvent:
    usage = {"input_tokens": 700, "output_tokens": 70, "cached_input_tokens": 7}
    return NewEvent(
        type=EventType.MODEL_RESPONDED,
        data={
            "model": model,
            "tool_calls": [],
            "usage": usage,
            "cost": 0.003,
            "elapsed_s": elapsed,
        },
    )


def finished(tool: str, elapsed: float) -> NewEvent:
    return NewEvent(
        type=EventType.TOOL_FINISHED, data={"call_id": "c", "tool": tool, "elapsed_s": elapsed}
    )


def runs_elsewhere(tmp_path: Path) -> tuple[list[tuple[RunState, list[Event]]], RunStats]:
    """Two runs made by a current store, their events, and that store's figures."""
    store = open_store(f"sqlite:///{tmp_path / 'elsewhere.db'}")
    try:
        made = []
        first = make_run(store, options=RunOptions(model="openai:m"))
        first, _ = append(store, first, [turn("m", 1.0), finished("grep", 0.2), turn("m", 2.0)])
        record = {
            "command": "pytest -q",
            "passed": True,
            "exit_code": 0,
            "duration_s": 1.0,
            "artifact": None,
            "mutation_revision": 0,
            "file_hashes": {},
        }
        first, _ = append(store, first, [move(first, RunStatus.VERIFYING, "done")])
        first, _ = append(
            store,
            first,
            [NewEvent(type=EventType.VERIFICATION_PASSED, data={"records": [record]})],
        )
        second = make_run(store, options=RunOptions(model=None))
        second, _ = append(store, second, [turn("local", 0.5), finished("read_file", 0.01)])
        for state in (first, second):
            made.append((state, store.read_events(state.run_id)))
        return made, store.run_stats()
    finally:
        store.close()


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_runs_stored_before_0006_get_the_figures_an_append_writes(
    backend: str, tmp_path: Path
) -> None:
    made, expected = runs_elsewhere(tmp_path)
    with old_database(backend, tmp_path) as (url, conn):
        for state, events in made:
            write_run_with_snapshot_row(
                conn, state, events, placeholder="?" if backend == "sqlite" else "%s"
            )
        store = open_store(url)  # applies 0006 and its backfill
        try:
            applied = conn.execute("SELECT version FROM schema_migrations ORDER BY version")
            assert [v for (v,) in applied.fetchall()][:6] == [1, 2, 3, 4, 5, 6]
            assert store.run_stats() == expected
            assert store.run_stats(model="openai:m").steps == 2
            assert [m.model for m in expected.models] == ["local", "openai:m"]
            assert expected.verifiers[0].passed == 1
            fresh = make_run(store, options=RunOptions(model="openai:m"))
            append(store, fresh, [turn("m", 3.0)])
            assert store.run_stats(model="openai:m").steps == 3
        finally:
            store.close()
