"""Migration 0005 on a database written before it: existing runs stay as they were, get
no creator (NULL), page like new ones, and the token table is there to use."""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest

from keel.core.events import Event
from keel.core.records import RunOptions
from keel.core.state import RunState
from keel.store.migrate import discover, migrate
from keel.store.postgres.connection import Database as PgDatabase
from keel.store.postgres.migrate import PostgresMigrations
from keel.store.sqlite.connection import Database
from keel.store.sqlite.migrate import SQLiteMigrations
from keel.store.url import open_store
from keel.testing.stores import (
    append,
    make_run,
    model_step,
    postgres_unavailable,
    scratch_database,
    write_run_with_snapshot_row,
)

BEFORE_SERVICE = 4  # the last schema version without runs.creator and api_tokens


@contextmanager
def old_database(backend: str, tmp_path: Path) -> Iterator[tuple[str, Any]]:
    """The URL of a database migrated only up to BEFORE_SERVICE, and a raw connection."""
    if backend == "sqlite":
        path = tmp_path / "old.db"
        db = Database(path)
        migrate(
            SQLiteMigrations(db),
            [m for m in discover("keel.store.sqlite") if m.version <= BEFORE_SERVICE],
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
            [m for m in discover("keel.store.postgres") if m.version <= BEFORE_SERVICE],
        )
        pg.close()
        with psycopg.connect(url, autocommit=True) as pg_conn:
            yield url, pg_conn


def a_run_elsewhere(tmp_path: Path) -> tuple[RunState, list[Event]]:
    store = open_store(f"sqlite:///{tmp_path / 'elsewhere.db'}")
    try:
        state = make_run(store)
        state, _ = append(store, state, model_step())
        return state, store.read_events(state.run_id)
    finally:
        store.close()


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_old_runs_survive_0005_with_no_creator_and_page_with_new_ones(
    backend: str, tmp_path: Path
) -> None:
    old, events = a_run_elsewhere(tmp_path)
    with old_database(backend, tmp_path) as (url, conn):
        write_run_with_snapshot_row(
            conn, old, events, placeholder="?" if backend == "sqlite" else "%s"
        )
        store = open_store(url)  # applies 0005
        try:
            applied = conn.execute("SELECT version FROM schema_migrations ORDER BY version")
            assert [v for (v,) in applied.fetchall()][:5] == [1, 2, 3, 4, 5]  # and later ones
            assert store.load_run(old.run_id) == old
            assert store.verify_log(old.run_id).intact
            creator = conn.execute("SELECT creator FROM runs").fetchall()
            assert creator == [(None,)]
            new = make_run(store, options=RunOptions(model="m", creator="token:ci"))
            page, cursor = store.page_runs(limit=1)
            assert [r.run_id for r in page] == [new.run_id]
            rest, end = store.page_runs(limit=1, before=cursor)
            assert [r.run_id for r in rest] == [old.run_id] and end is None
            assert [r.run_id for r in store.page_runs(creator="token:ci")[0]] == [new.run_id]
            digest = hashlib.sha256(b"keel_x").hexdigest()
            made = store.create_token("ci", digest)
            assert store.token_by_hash(digest) == made
        finally:
            store.close()
