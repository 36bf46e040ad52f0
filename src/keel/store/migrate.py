"""Ordered schema migrations, each applied once in its own transaction and recorded.

Migrations are the files ``NNNN_name.sql`` of a dialect's ``migrations`` folder,
applied in version order. ``schema_migrations(version, name, applied_at)`` says
which ones a database has. A database whose highest version is above the newest
file this Keel ships is refused with ``SchemaTooNew``: an older Keel must not
write into a schema it does not know.

The runner is dialect-neutral: each backend supplies a ``MigrationExecutor`` (how
to read the applied versions and how to apply one file atomically) and its own
``migrations`` folder.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Protocol

from keel.core.errors import SchemaTooNew, StoreError

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


_PYTHON_STEP = re.compile(r"^--\s*python:\s*([a-z0-9_]+)\s*$", re.MULTILINE)


def script_parts(sql: str) -> list[tuple[str, str | None]]:
    """A migration's SQL cut at its ``-- python: NAME`` lines, as ``(sql, NAME)`` pairs
    (the last NAME is None): the executor runs each part's SQL, then the dialect's
    Python step of that name, all in the migration's one transaction. For data no SQL
    can compute (e.g. the sha256 chain of existing events on SQLite)."""
    parts: list[tuple[str, str | None]] = []
    start = 0
    for match in _PYTHON_STEP.finditer(sql):
        parts.append((sql[start : match.start()], match.group(1)))
        start = match.end()
    parts.append((sql[start:], None))
    return parts


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
