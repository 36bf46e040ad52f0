"""``MigrationExecutor`` for PostgreSQL: the shared runner of ``keel.store.sqlite.migrate``.

Each migration file runs in one transaction with its record in
``schema_migrations``, under a transaction-level advisory lock, so workers
starting together on an empty database apply every step exactly once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import psycopg

from keel.core.errors import StoreError
from keel.store.migrate import Migration, discover, migrate, script_parts
from keel.store.postgres.connection import Database
from keel.store.postgres.log import chain_existing_events
from keel.store.postgres.stats import backfill_event_figures

__all__ = ["PostgresMigrations", "discover", "migrate"]

MIGRATION_LOCK: Final = 0x6B65656C  # "keel": serialises migrations across processes

PYTHON_STEPS: dict[str, Callable[[psycopg.Connection[Any]], None]] = {
    "chain_existing_events": chain_existing_events,
    "backfill_event_figures": backfill_event_figures,
}

CREATE_TABLE: Final = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version integer PRIMARY KEY,
    name text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)
"""


class PostgresMigrations:
    def __init__(self, db: Database) -> None:
        self.db = db
        self.location = db.location

    def applied_versions(self) -> dict[int, str]:
        with self.db.connection() as conn:
            row = conn.execute("SELECT to_regclass('schema_migrations') IS NOT NULL").fetchone()
            if row is None or not row[0]:
                return {}
            rows = conn.execute("SELECT version, name FROM schema_migrations").fetchall()
        return {int(v): str(n) for v, n in rows}

    def apply(self, migration: Migration) -> bool:
        with self.db.transaction() as conn:
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
            conn.execute(CREATE_TABLE)
            seen = conn.execute(
                "SELECT 1 FROM schema_migrations WHERE version = %s", (migration.version,)
            ).fetchone()
            if seen:  # another process applied it while we waited for the lock
                return False
            for sql, step in script_parts(migration.sql):
                if _has_statements(sql):
                    conn.execute(sql.encode())  # a script: several statements, no params
                if step is not None:
                    if step not in PYTHON_STEPS:
                        raise StoreError(f"migration {migration.name}: no Python step {step!r}")
                    PYTHON_STEPS[step](conn)
            conn.execute(
                "INSERT INTO schema_migrations (version, name) VALUES (%s, %s)",
                (migration.version, migration.name),
            )
        return True


def _has_statements(sql: str) -> bool:
    return any(ln.strip() and not ln.strip().startswith("--") for ln in sql.splitlines())
