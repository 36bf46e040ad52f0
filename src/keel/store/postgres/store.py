"""``PostgresStore``: one database shared by many ``keel worker`` processes on many hosts.

Same guarantees as the SQLite store (the conformance suite runs on both), under
real concurrency: claims are one ``FOR UPDATE SKIP LOCKED`` statement that also
reclaims expired leases, every holder write is fenced by its token in the same
statement, lease times are the database clock, and the event tables refuse
UPDATE and DELETE. ``wait_for_work`` and ``wait_for_events`` wake on
LISTEN/NOTIFY but never trust it: callers poll, so a dead listener only slows
wake-up to the poll interval.
"""

from __future__ import annotations

import threading

from keel.store.postgres.connection import Database, redacted
from keel.store.postgres.migrate import PostgresMigrations, discover, migrate
from keel.store.postgres.service import PostgresService
from keel.store.postgres.stats import PostgresStats
from keel.store.postgres.tasks import PostgresTasks


class PostgresStore(PostgresService, PostgresTasks, PostgresStats):
    """The ``Store`` protocol over a PostgreSQL database named by a ``postgresql://`` URL.

    Opening migrates the database to the newest schema (``SchemaTooNew`` if a newer
    Keel wrote it). The URL keeps its password for connecting; ``repr`` and errors
    show it redacted.
    """

    def __init__(self, url: str, *, pool_size: int = 8) -> None:
        self._db = Database(url, max_size=pool_size)
        try:
            migrate(PostgresMigrations(self._db), discover("keel.store.postgres"))
        except BaseException:
            self._db.close()
            raise
        self.url = url
        self.fsyncs_commits = True  # the server's synchronous_commit (on by default)
        self._init_runs()
        self._work_seen = threading.local()

    def wait_for_work(self, timeout: float) -> bool:
        """True when a notification said work may be claimable since this thread last
        asked (at once if one came meanwhile), else False at ``timeout``."""
        listener = self._listener()
        seen: int | None = getattr(self._work_seen, "generation", None)
        if seen is None:
            seen = listener.work_generation
        now = listener.wait_for_work(seen, timeout)
        self._work_seen.generation = now
        return now != seen

    def close(self) -> None:
        with self._listener_guard:
            listening, self._listening = self._listening, None
        if listening is not None:
            listening.close()
        self._db.close()

    def __enter__(self) -> PostgresStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"PostgresStore({redacted(self.url)!r})"
