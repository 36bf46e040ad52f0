"""Ordered schema migrations, each applied once in its own transaction and recorded.

Migrations are the files ``NNNN_name.sql`` of a dialect's ``migrations`` folder,
applied in version order. ``schema_migrations(version, name, applied_at)`` says
which ones a database has. A database whose highest version is above the newest
file this Keel ships is refused with ``SchemaTooNew``: an older Keel must not
write into a schema it does not know.

The runner is dialect-neutral: a backend supplies a ``MigrationExecutor`` (how to
read the applied versions and how to apply one file atomically); PostgreSQL reuses
``discover`` and ``migrate`` with its own folder and executor.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Protocol

from keel.core.errors import SchemaTooNew, StoreCorrupt, StoreError
from keel.store.sqlite.connection import Database

_FILE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True, slots=True, kw_only=True)
class Migration:
    version: int
    name: str
    sql: str


class MigrationExecutor(Protocol):
    """How one backend reads and records its schema version."""

    location: str  # the file or server named in errors

    def applied_versions(self) -> dict[int, str]:
        """``{version: name}`` already applied; empty for a new database."""
        ...

    def apply(self, migration: Migration) -> bool:
        """Apply and record one migration in one transaction; False if already applied."""
        ...


def discover(package: str, folder: str = "migrations") -> list[Migration]:
    """The migrations shipped in ``package``/``folder``, in version order."""
    found: list[Migration] = []
    for entry in resources.files(package).joinpath(folder).iterdir():
        match = _FILE.match(entry.name)
        if match:
            found.append(
                Migration(
                    version=int(match.group(1)),
                    name=match.group(2),
                    sql=entry.read_text(encoding="utf-8"),
                )
            )
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise StoreError(f"two migrations share a version in {package}/{folder}: {versions}")
    return found


def migrate(executor: MigrationExecutor, migrations: Sequence[Migration]) -> list[Migration]:
    """Bring the database up to the newest migration; return the ones applied now."""
    newest = max((m.version for m in migrations), default=0)
    applied = executor.applied_versions()
    if applied and max(applied) > newest:
        raise SchemaTooNew(executor.location, max(applied), newest)
    done = []
    for migration in migrations:
        if migration.version not in applied and executor.apply(migration):
            done.append(migration)
    return done


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
            for statement in split_statements(migration.sql):
                conn.execute(statement)
            conn.execute(
                "INSERT INTO schema_migrations (version, name, applied_at) "
                "VALUES (?, ?, strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))",
                (migration.version, migration.name),
            )
        return True
