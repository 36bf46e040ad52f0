"""SQLite's side of the migrations: splitting scripts and recording versions.

The ordering, discovery and the refusal of a newer schema are in
``keel.store.migrate`` (shared with PostgreSQL).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator

from keel.core.errors import StoreCorrupt, StoreError
from keel.store.migrate import Migration, discover, migrate, script_parts
from keel.store.sqlite.connection import Database
from keel.store.sqlite.log import chain_existing_events
from keel.store.sqlite.stats import backfill_event_figures

__all__ = ["Migration", "SQLiteMigrations", "discover", "migrate", "split_statements"]


def split_statements(script: str) -> Iterator[str]:
    """Complete SQL statements of ``script`` (triggers' inner ``;`` included)."""
    pending = ""
    for line in script.splitlines(keepends=True):
        pending += line
        if sqlite3.complete_statement(pending):
            statement = pending.strip()
            pending = ""
            if statement.rstrip(";").strip():
                yield statement
    if pending.strip() and not _only_comments(pending):
        raise StoreError(f"incomplete SQL statement in a migration: {pending.strip()[:80]}")


def _only_comments(text: str) -> bool:
    return all(not ln.strip() or ln.strip().startswith("--") for ln in text.splitlines())


PYTHON_STEPS: dict[str, Callable[[sqlite3.Connection], None]] = {
    "chain_existing_events": chain_existing_events,
    "backfill_event_figures": backfill_event_figures,
}

CREATE_TABLE = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    applied_at TEXT NOT NULL
)
"""


class SQLiteMigrations:
    """``MigrationExecutor`` for one SQLite file."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.location = str(db.path)

    def applied_versions(self) -> dict[int, str]:
        with self.db.read() as conn:
            tables = {
                row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")
            }
            if "schema_migrations" not in tables:
                if tables:
                    raise StoreCorrupt(
                        self.location,
                        "a SQLite database, but not Keel's (tables "
                        + ", ".join(sorted(tables))
                        + " and no schema_migrations)",
                    )
                return {}
            rows = conn.execute("SELECT version, name FROM schema_migrations").fetchall()
        return {int(v): str(n) for v, n in rows}

    def apply(self, migration: Migration) -> bool:
        with self.db.write() as conn:
            conn.execute(CREATE_TABLE)
            seen = conn.execute(
                "SELECT 1 FROM schema_migrations WHERE version = ?", (migration.version,)
            ).fetchone()
            if seen:  # another process applied it while we waited for the lock
                return False
            for sql, step in script_parts(migration.sql):
                for statement in split_statements(sql):
                    conn.execute(statement)
                if step is not None:
                    if step not in PYTHON_STEPS:
                        raise StoreError(f"migration {migration.name}: no Python step {step!r}")
                    PYTHON_STEPS[step](conn)
            conn.execute(
                "INSERT INTO schema_migrations (version, name, applied_at) "
                "VALUES (?, ?, strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))",
                (migration.version, migration.name),
            )
        return True
