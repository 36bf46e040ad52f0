"""Migration 0003 chains the logs it finds: a database written before the chain opens
with every old event hashed (the same hashes a current writer gives the same events),
its runs verifiable and appendable, and its append-only triggers back in place."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest

from keel.core.chain import chain_time
from keel.core.errors import LogDamaged
from keel.core.events import Event
from keel.core.state import RunState
from keel.store.base import Store
from keel.store.migrate import discover, migrate
from keel.store.postgres.connection import Database as PgDatabase
from keel.store.postgres.migrate import PostgresMigrations
from keel.store.sqlite.connection import Database
from keel.store.sqlite.migrate import SQLiteMigrations
from keel.store.step import dump_json
from keel.store.url import open_store
from keel.testing.stores import (
    OutOfBand,
    append,
    make_run,
    model_step,
    postgres_unavailable,
    scratch_database,
    tool_step,
)

BEFORE_CHAIN = 2  # the last schema version without event hashes


@contextmanager
def old_database(backend: str, tmp_path: Path) -> Iterator[tuple[str, Any]]:
    """The URL of a database migrated only up to BEFORE_CHAIN, and a raw connection."""
    if backend == "sqlite":
        path = tmp_path / "old.db"
        db = Database(path)
        migrate(
            SQLiteMigrations(db),
            [m for m in discover("keel.store.sqlite") if m.version <= BEFORE_CHAIN],
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
            [m for m in discover("keel.store.postgres") if m.version <= BEFORE_CHAIN],
        )
        pg.close()
        with psycopg.connect(url, autocommit=True) as conn:
            yield url, conn


def write_as_before(conn: Any, sqlite: bool, state: RunState, events: list[Event]) -> None:
    """Store a run the way Keel did before the chain: no hash anywhere."""
    mark = "?" if sqlite else "%s"
    snapshot = state.to_dict()
    del snapshot["last_hash"]
    at = chain_time(events[0].recorded_at)
    conn.execute(
        "INSERT INTO runs (id, status, goal, workspace, snapshot, last_seq, created_at, "
        f"updated_at) VALUES ({', '.join([mark] * 8)})",
        (
            state.run_id,
            state.status.value,
            state.goal,
            state.workspace,
            dump_json(snapshot),
            state.last_seq,
            at,
            at,
        ),
    )
    for e in events:
        conn.execute(
            "INSERT INTO events (run_id, seq, event_id, type, recorded_at, data) "
            f"VALUES ({', '.join([mark] * 6)})",
            (
                e.run_id,
                e.seq,
                e.event_id,
                e.type.value,
                chain_time(e.recorded_at),
                dump_json(e.data),
            ),
        )


def a_run_elsewhere(tmp_path: Path) -> tuple[RunState, list[Event]]:
    """A run written by the current Keel in another file: its events and their hashes."""
    store = open_store(f"sqlite:///{tmp_path / 'elsewhere.db'}")
    try:
        state = make_run(store)
        for i in range(3):
            state, _ = append(store, state, [*model_step(), *tool_step(f"c{i}")])
        return state, store.read_events(state.run_id)
    finally:
        store.close()


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_an_old_log_is_chained_when_the_database_is_migrated(backend: str, tmp_path: Path) -> None:
    state, events = a_run_elsewhere(tmp_path)
    with old_database(backend, tmp_path) as (url, conn):
        write_as_before(conn, backend == "sqlite", state, events)
        store: Store = open_store(url)  # applies 0003 and later
        try:
            check = store.verify_log(state.run_id)
            assert check.intact and check.events == state.last_seq
            migrated = store.read_events(state.run_id)
            assert [e.hash for e in migrated] == [e.hash for e in events]
            assert store.load_run(state.run_id) == state
            state2, _ = append(store, state, model_step())
            assert store.verify_log(state2.run_id).intact
            with OutOfBand(store) as db, pytest.raises(Exception, match="append-only"):
                db.change_event(state.run_id, 2, '{"text":"rewritten"}')
        finally:
            store.close()


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_an_old_log_already_damaged_is_chained_as_found_and_named(
    backend: str, tmp_path: Path
) -> None:
    state, events = a_run_elsewhere(tmp_path)
    with old_database(backend, tmp_path) as (url, conn):
        write_as_before(conn, backend == "sqlite", state, [e for e in events if e.seq != 6])
        store: Store = open_store(url)
        try:
            damage = store.verify_log(state.run_id).damage
            assert damage is not None and damage.seq == 6 and "missing" in damage.detail
            with pytest.raises(LogDamaged):
                store.read_events(state.run_id)
        finally:
            store.close()
