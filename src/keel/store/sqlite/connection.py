"""One SQLite file shared by threads and processes on one machine.

Each thread gets its own connection (a worker heartbeats from a second thread),
opened in autocommit mode so that transactions are explicit:

- ``write()`` runs its block inside ``BEGIN IMMEDIATE`` … ``COMMIT``: the write lock
  is taken up front, so two writers never deadlock on a lock upgrade. A busy
  database is retried with jittered backoff for up to ``lock_wait_s`` (30 s), then
  fails with a ``StoreError`` that says who to blame; SQLite's raw "database is
  locked" never reaches a user. Writers of one process first queue on a lock of
  their own: SQLite takes one writer at a time anyway, and 64 worker slots colliding
  in its busy handler and the backoff sleeps cost far more CPU than waiting in line.
- ``read()`` runs its block in one read transaction: every statement in it sees
  the same committed snapshot.

Durability. The journal is WAL. ``synchronous=NORMAL`` (the default) fsyncs the
WAL only at checkpoints: a process crash or SIGKILL loses nothing that was
committed (the WAL is in the OS page cache and is replayed on the next open); an
OS crash or power loss may lose the last few commits but never corrupts the
database, and never leaves half a transaction. ``synchronous=FULL`` (URL query
``?synchronous=full``) fsyncs the WAL at every commit, so committed data survives
power loss too, at the cost of one fsync per write.
"""

from __future__ import annotations

import random
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, Final

from keel.core.errors import StoreCorrupt, StoreError

NOW: Final = "((julianday('now') - 2440587.5) * 86400.0)"
"""SQL expression: the database clock in epoch seconds (leases use it, never a caller's clock)."""

SYNCHRONOUS_MODES: Final = ("normal", "full")
SQLITE_HEADER: Final = b"SQLite format 3\x00"
_CORRUPT_CODES: Final = frozenset({11, 26})  # SQLITE_CORRUPT, SQLITE_NOTADB
_BUSY_CODES: Final = frozenset({5, 6})  # SQLITE_BUSY, SQLITE_LOCKED (primary codes)
BUSY_TIMEOUT_MS: Final = 100
WAL_CHECKPOINT_PAGES: Final = 4000  # ~16 MB of WAL between checkpoints (SQLite's default: 1000)


class Database:
    """A SQLite file: per-thread connections, explicit read and write transactions."""

    def __init__(
        self, path: str | Path, *, synchronous: str = "normal", lock_wait_s: float = 30.0
    ) -> None:
        if synchronous not in SYNCHRONOUS_MODES:
            modes = ", ".join(SYNCHRONOUS_MODES)
            raise StoreError(f"unknown synchronous mode {synchronous!r}; use one of {modes}")
        self.path = Path(path).expanduser().absolute()
        self.synchronous = synchronous
        self.lock_wait_s = lock_wait_s
        self._local = threading.local()
        self._connections: list[sqlite3.Connection] = []
        self._guard = threading.Lock()
        self._writer = threading.Lock()  # this process's writers, one at a time
        self._closed = False
        self._check_header()
        with self.guard():
            # The first connection switches the file to WAL (a persistent setting). On a
            # new file that needs its exclusive lock, which another process opening the
            # same new file may hold: waited for like a writer's lock, not SQLite's 100 ms.
            conn = self.connection()
            mode = self._when_unlocked(conn, "PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise StoreError(f"{self.path}: cannot switch to WAL journal mode (got {mode})")

    # --- connections -----------------------------------------------------------------

    def _check_header(self) -> None:
        """Refuse a file that is not SQLite before SQLite touches it (nothing is created)."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create the folder for {self.path}: {exc}") from exc
        if self.path.is_dir():
            raise StoreError(f"{self.path} is a folder, not a database file")
        try:
            with self.path.open("rb") as f:
                header = f.read(len(SQLITE_HEADER))
        except FileNotFoundError:
            return
        except OSError as exc:
            raise StoreError(f"cannot read {self.path}: {exc}") from exc
        if header and header != SQLITE_HEADER:
            raise StoreCorrupt(str(self.path), "not a SQLite database (wrong file header)")

    def connection(self) -> sqlite3.Connection:
        """This thread's connection, opened on first use."""
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is not None:
            return conn
        if self._closed:
            raise StoreError(f"the store at {self.path} is closed")
        try:
            conn = sqlite3.connect(
                self.path,
                isolation_level=None,
                check_same_thread=False,
                timeout=BUSY_TIMEOUT_MS / 1000,
                cached_statements=256,
            )
        except sqlite3.Error as exc:
            raise self.translate(exc) from exc
        try:
            # A pragma reads the schema: on a new file still in rollback-journal mode that
            # waits for another opener's exclusive lock (see __init__).
            for pragma in (
                f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}",
                f"PRAGMA synchronous={self.synchronous.upper()}",
                "PRAGMA foreign_keys=ON",
                f"PRAGMA wal_autocheckpoint={WAL_CHECKPOINT_PAGES}",
            ):
                self._when_unlocked(conn, pragma)
        except BaseException as exc:
            conn.close()
            if isinstance(exc, sqlite3.Error):
                raise self.translate(exc) from exc
            raise
        self._local.conn = conn
        self._local.depth = 0
        with self._guard:
            self._connections.append(conn)
        return conn

    def translate(self, exc: sqlite3.Error) -> StoreError:
        """A Keel error naming the file for a SQLite error that is not the caller's fault."""
        code = getattr(exc, "sqlite_errorcode", None)
        if code is not None and code & 0xFF in _CORRUPT_CODES:
            return StoreCorrupt(str(self.path), str(exc))
        return StoreError(f"{self.path}: {exc}")

    # --- transactions ----------------------------------------------------------------

    @contextmanager
    def guard(self) -> Iterator[None]:
        """Translate SQLite errors raised by the block into Keel errors naming the file."""
        try:
            yield
        except sqlite3.Error as exc:
            raise self.translate(exc) from exc

    @contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """The block runs in one ``BEGIN IMMEDIATE`` transaction; an exception rolls it back.

        Nested calls on one thread join the outer transaction.
        """
        conn = self.connection()
        if self._local.depth:
            self._local.depth += 1
            try:
                yield conn
            finally:
                self._local.depth -= 1
            return
        if not self._writer.acquire(timeout=self.lock_wait_s):
            raise self._still_locked(None)
        try:
            with self.guard():
                self._when_unlocked(conn, "BEGIN IMMEDIATE")
            self._local.depth = 1
            try:
                yield conn
            except BaseException as exc:
                self._rollback(conn)
                if isinstance(exc, sqlite3.Error):
                    raise self.translate(exc) from exc
                raise
            else:
                try:
                    conn.execute("COMMIT")
                except sqlite3.Error as exc:
                    self._rollback(conn)
                    raise self.translate(exc) from exc
            finally:
                self._local.depth = 0
        finally:
            self._writer.release()

    @contextmanager
    def read(self) -> Iterator[sqlite3.Connection]:
        """The block's statements all see one committed snapshot."""
        conn = self.connection()
        if self._local.depth:
            self._local.depth += 1
            try:
                yield conn
            finally:
                self._local.depth -= 1
            return
        self._local.depth = 1
        try:
            with self.guard():
                conn.execute("BEGIN")
            try:
                yield conn
            except sqlite3.Error as exc:
                raise self.translate(exc) from exc
            finally:
                self._rollback(conn)
        finally:
            self._local.depth = 0

    def first_row(self, sql: str, params: Sequence[object] = ()) -> tuple[Any, ...] | None:
        """The first row of one read-only statement, or None.

        Outside a transaction the statement runs on its own (SQLite gives one statement
        one committed snapshot), without the ``BEGIN`` and ``ROLLBACK`` that ``read``
        spends on blocks of several: a check made before every effect (the run lease)
        costs one call. Inside a ``read`` or ``write`` block it reads that block's view.
        """
        conn = self.connection()
        with self.guard():  # every row fetched: the statement ends, and its snapshot with it
            rows: list[tuple[Any, ...]] = conn.execute(sql, params).fetchall()
        return rows[0] if rows else None

    def _when_unlocked(self, conn: sqlite3.Connection, sql: str) -> sqlite3.Cursor:
        """Run ``sql``, a statement that may wait for a lock on the file (``BEGIN
        IMMEDIATE``, the WAL switch, a pragma on a new file), retrying a busy file with
        jittered backoff for up to ``lock_wait_s``; then the StoreError saying so."""
        deadline = time.monotonic() + self.lock_wait_s
        pause = 0.002
        while True:
            try:
                return conn.execute(sql)
            except sqlite3.OperationalError as exc:
                code = getattr(exc, "sqlite_errorcode", 0) or 0
                if code & 0xFF not in _BUSY_CODES:
                    raise
                if time.monotonic() >= deadline:
                    raise self._still_locked(exc) from exc
            time.sleep(pause * random.uniform(0.5, 1.5))
            pause = min(pause * 2, 0.1)

    def _still_locked(self, cause: BaseException | None) -> StoreError:
        who = "another writer" if cause is not None else "another thread of this process"
        return StoreError(
            f"{self.path} stayed locked by {who} for {self.lock_wait_s:.0f} s; "
            "is a process stuck holding a transaction? Retry when it finishes."
        )

    @staticmethod
    def _rollback(conn: sqlite3.Connection) -> None:
        if conn.in_transaction:
            # SQLite may have rolled back already (e.g. SQLITE_FULL): nothing left to undo.
            with suppress(sqlite3.Error):
                conn.execute("ROLLBACK")

    def data_version(self) -> int:
        """Changes whenever another connection commits to the file (cheap to poll)."""
        with self.guard():
            return int(self.connection().execute("PRAGMA data_version").fetchone()[0])

    def close(self) -> None:
        """Close every thread's connection; later use raises StoreError."""
        self._closed = True
        with self._guard:
            connections, self._connections = self._connections, []
        for conn in connections:
            conn.close()
        self._local = threading.local()
