"""Helpers the fair benchmarks share (bench/loop.py, bench/loop_langgraph.py, bench/workers.py).

- ``rotated``: the order of the systems in repetition ``i`` (ABC, BCA, CAB, ...), so
  drift on a shared machine and the cost of going first hit every system alike;
- ``summary``: median and best of a list of timings;
- ``SqlCommits``: counts the transactions SQLite commits on every connection opened
  while it watches (a trace callback on each: every ``COMMIT``/``END``, and every
  write statement run outside a transaction, which SQLite commits on its own). It
  sees what reaches SQLite whichever code path issues it, so Keel and LangGraph are
  counted the same way; it costs a Python call per statement, so it is only used in
  separate, untimed runs;
- ``PAIRS``: the two durability settings a ratio may be printed for, each applied to
  both sides.
"""

from __future__ import annotations

import sqlite3
import statistics
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

WINDOW = 50  # steps averaged at the start and at the end of a run (flatness)

PAIRS: dict[str, dict[str, str]] = {
    # SQLite WAL, fsync only at checkpoints: Keel's default store; LangGraph's
    # SqliteSaver connection put in the same mode.
    "wal_normal": {"keel_query": "", "synchronous": "NORMAL"},
    # SQLite WAL, fsync of the WAL at every commit: Keel ``?synchronous=full``;
    # LangGraph's SqliteSaver as it ships (its setup() switches the file to WAL and
    # leaves SQLite's default synchronous=FULL), set explicitly here all the same.
    "wal_full": {"keel_query": "?synchronous=full", "synchronous": "FULL"},
}
SYNCHRONOUS_NAMES = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}
_AUTOCOMMIT_WRITES = frozenset({"INSERT", "UPDATE", "DELETE", "REPLACE", "CREATE", "DROP", "ALTER"})


def rotated(items: Sequence[T], i: int) -> list[T]:
    """``items`` starting at position ``i`` (mod its length)."""
    k = i % len(items) if items else 0
    return [*items[k:], *items[:k]]


def summary(
    values: Sequence[float], digits: int = 4, best: Callable[[Sequence[float]], float] = min
) -> dict[str, float]:
    """Median and best (the lowest, unless ``best=max``: for rates)."""
    return {"median": round(statistics.median(values), digits), "best": round(best(values), digits)}


def ratio(a: float, b: float) -> float:
    return round(a / b, 2) if b else float("inf")


def window_ms(marks: Sequence[float]) -> float:
    """Mean ms between consecutive marks (one mark per step)."""
    return round((marks[-1] - marks[0]) / (len(marks) - 1) * 1000, 4)


def flatness(marks: Sequence[float]) -> dict[str, float]:
    """Mean ms per step over the first and the last ``WINDOW`` steps of one run."""
    return {
        "first_steps_ms": window_ms(marks[: WINDOW + 1]),
        "last_steps_ms": window_ms(marks[-(WINDOW + 1) :]),
    }


def db_bytes(path: Path) -> int:
    """The database file's size once its WAL is folded in."""
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    return path.stat().st_size


def durability_of(conn: sqlite3.Connection) -> dict[str, str]:
    """The journal mode and synchronous setting a connection actually has."""
    mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
    sync = conn.execute("PRAGMA synchronous").fetchone()[0]
    return {"journal_mode": str(mode).upper(), "synchronous": SYNCHRONOUS_NAMES.get(sync, sync)}


def first_verb(sql: str) -> str:
    """The statement's first keyword, comments skipped (Keel's SQL opens with ``-- name:``)."""
    text = sql.lstrip()
    while text.startswith(("--", "/*")):
        if text.startswith("--"):
            end = text.find("\n")
            text = "" if end < 0 else text[end + 1 :].lstrip()
        else:
            end = text.find("*/")
            text = "" if end < 0 else text[end + 2 :].lstrip()
    return text.split(None, 1)[0].upper() if text else ""


class SqlCommits:
    """Counts SQLite commits on the connections opened inside ``watching()``."""

    def __init__(self) -> None:
        self.commits = 0
        self.connections: list[sqlite3.Connection] = []

    @contextmanager
    def watching(self) -> Iterator[SqlCommits]:
        real = sqlite3.connect

        def connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
            conn = real(*args, **kwargs)
            conn.set_trace_callback(partial(self._saw, conn))
            self.connections.append(conn)
            return conn

        sqlite3.connect = connect  # type: ignore[assignment]
        try:
            yield self
        finally:
            sqlite3.connect = real

    def _saw(self, conn: sqlite3.Connection, sql: str) -> None:
        verb = first_verb(sql)
        # The trace runs as the statement starts: in_transaction is the state before it.
        if verb in ("COMMIT", "END") or (verb in _AUTOCOMMIT_WRITES and not conn.in_transaction):
            self.commits += 1
