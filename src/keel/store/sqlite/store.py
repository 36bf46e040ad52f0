"""``SQLiteStore``: the embedded default store, one file safe for several processes."""

from __future__ import annotations

import time
from pathlib import Path

from keel.store.sqlite.connection import Database
from keel.store.sqlite.migrate import SQLiteMigrations, discover, migrate
from keel.store.sqlite.service import SQLiteService
from keel.store.sqlite.stats import SQLiteStats
from keel.store.sqlite.tasks import SQLiteTasks

WORK_POLL_S = 0.1


class SQLiteStore(SQLiteService, SQLiteTasks, SQLiteStats):
    """The ``Store`` protocol over one SQLite file (see ``connection`` for durability).

    Opening migrates the file to the newest schema; a file that is not a Keel
    database raises ``StoreCorrupt`` and one written by a newer Keel raises
    ``SchemaTooNew``, both naming the file, with nothing written to it.
    """

    def __init__(self, path: str | Path, *, synchronous: str = "normal") -> None:
        self._db = Database(path, synchronous=synchronous)
        try:
            migrate(SQLiteMigrations(self._db), discover("keel.store.sqlite"))
        except BaseException:
            self._db.close()
            raise
        self.path = self._db.path
        self.url = "sqlite:///" + str(self.path)
        self.fsyncs_commits = synchronous == "full"
        self._init_runs()

    def wait_for_work(self, timeout: float) -> bool:
        """True as soon as another connection commits (work may be claimable), else at timeout."""
        start = self._db.data_version()
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            time.sleep(min(WORK_POLL_S, remaining))
            if self._db.data_version() != start:
                return True

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> SQLiteStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SQLiteStore({str(self.path)!r})"
