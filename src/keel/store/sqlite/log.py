"""A run's event log on SQLite, read with its chain checked (``keel.store.logcheck``
says what each reader checks), and migration 0003's chaining of older logs."""

from __future__ import annotations

import json
import sqlite3

from keel.core.errors import RunNotFound, StoreError
from keel.core.events import Event
from keel.core.state import RunState
from keel.store.base import LogCheck
from keel.store.logcheck import (
    chain_found,
    checked_events,
    checked_log,
    checked_state,
    tail_start,
    with_chain_head,
)
from keel.store.sql import load_queries
from keel.store.step import dump_json

Q = load_queries("keel.store.sqlite", "runs.sql")
L = load_queries("keel.store.sqlite", "log.sql")
ALL = -1  # SQLite's LIMIT for "no limit"


def read_checked(
    conn: sqlite3.Connection, run_id: str, *, after: int, limit: int | None
) -> list[Event]:
    """Events with ``seq > after`` (at most ``limit``), their chain checked."""
    head = conn.execute(L["run_chain_head"], (run_id,)).fetchone()
    if head is None:
        raise RunNotFound(run_id)
    if after <= 0:
        rows = conn.execute(Q["read_events"], (run_id, 1, ALL if limit is None else limit))
    else:
        rows = conn.execute(Q["read_events"], (run_id, after, ALL if limit is None else limit + 1))
    return checked_events(
        run_id, rows, after=after, limit=limit, head_seq=int(head[0]), head_hash=head[1]
    )


def _snapshot_row(conn: sqlite3.Connection, run_id: str) -> tuple[str, int, str | None]:
    row = conn.execute(Q["run_snapshot"], (run_id,)).fetchone()
    if row is None:
        raise RunNotFound(run_id)
    snapshot, last_seq, last_hash = row
    return snapshot, int(last_seq), last_hash


def load_checked(conn: sqlite3.Connection, run_id: str) -> tuple[RunState, int, int]:
    """The run's state (snapshot plus the events after it), the snapshot's sequence and
    its size (JSON characters)."""
    snapshot_text, head_seq, head_hash = _snapshot_row(conn, run_id)
    try:
        snapshot = RunState.from_dict(json.loads(snapshot_text))
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise StoreError(
            f"the stored snapshot of run {run_id} cannot be read ({type(exc).__name__}: "
            f"{exc}): the database file was changed outside Keel; `keel verify "
            f"{run_id}` checks its events"
        ) from None
    rows = conn.execute(Q["read_events"], (run_id, tail_start(snapshot.last_seq), ALL))
    state = checked_state(run_id, snapshot, rows, head_seq=head_seq, head_hash=head_hash)
    return state, snapshot.last_seq, len(snapshot_text)


def verify_checked(conn: sqlite3.Connection, run_id: str) -> LogCheck:
    """The whole log of ``run_id`` checked from its first event (one read transaction)."""
    snapshot_text, head_seq, head_hash = _snapshot_row(conn, run_id)
    try:
        snapshot = json.loads(snapshot_text)
    except ValueError:
        snapshot = None
    rows = conn.execute(Q["read_events"], (run_id, 1, ALL))
    return checked_log(run_id, rows, head_seq=head_seq, head_hash=head_hash, snapshot=snapshot)


def run_ids(conn: sqlite3.Connection) -> list[str]:
    return [row[0] for row in conn.execute(L["run_ids"])]


def chain_existing_events(conn: sqlite3.Connection) -> None:
    """Migration 0003's Python step: hash every stored event as found, in order, and
    record each run's head and its snapshot's hash."""
    for run_id, last_seq, snapshot in conn.execute(L["runs_to_chain"]).fetchall():
        hashes = dict(chain_found(run_id, conn.execute(L["events_to_chain"], (run_id,))))
        conn.executemany(
            L["set_event_hash"], [(digest, run_id, seq) for seq, digest in hashes.items()]
        )
        snapshot_text = dump_json(with_chain_head(snapshot, hashes))
        conn.execute(L["set_run_chain"], (hashes.get(int(last_seq)), snapshot_text, run_id))
