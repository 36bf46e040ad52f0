"""A run's event log on PostgreSQL, read with its chain checked (``keel.store.logcheck``
says what each reader checks), and migration 0003's chaining of older logs.

Rows come back with ``recorded_at`` formatted by the server as ``chain_time`` text and
``data`` as the stored JSON text (``json`` keeps its input verbatim): the bytes the
writer hashed. A run's tail for a load comes aggregated as one JSON array column.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import psycopg

from keel.core.errors import RunNotFound
from keel.core.events import Event
from keel.store.base import LogCheck
from keel.store.logcheck import chain_found, checked_events, checked_log, with_chain_head
from keel.store.postgres.connection import Database
from keel.store.sql import load_queries
from keel.store.step import dump_json

L = load_queries("keel.store.postgres", "log.sql")
VERIFY_FETCH = 5000  # rows per round trip of keel verify's server-side cursor


def read_checked(db: Database, run_id: str, *, after: int, limit: int | None) -> list[Event]:
    """Events with ``seq > after`` (at most ``limit``), their chain checked."""
    params = {
        "id": run_id,
        "from": max(after, 1),
        "limit": None if limit is None else limit + (1 if after > 0 else 0),
    }
    with db.connection() as conn:
        rows = conn.execute(L["read_events"], params).fetchall()
    if not rows:
        raise RunNotFound(run_id)
    head_seq, head_hash = rows[0][0], rows[0][1]
    events = [row[2:] for row in rows if row[2] is not None]
    return checked_events(
        run_id, events, after=after, limit=limit, head_seq=int(head_seq), head_hash=head_hash
    )


def verify_checked(db: Database, run_id: str) -> LogCheck:
    """The whole log of ``run_id`` checked from its first event, in one repeatable-read
    transaction (the head and the rows are one snapshot), streamed from the server."""
    with db.transaction() as conn:
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        head = conn.execute(L["run_chain_head"], {"id": run_id}).fetchone()
        if head is None:
            raise RunNotFound(run_id)
        head_seq, head_hash, snapshot = head
        with conn.cursor(name="keel_verify") as cursor:
            cursor.itersize = VERIFY_FETCH
            cursor.execute(L["log_rows"], {"id": run_id})
            return checked_log(
                run_id,
                _rows(cursor),
                head_seq=int(head_seq),
                head_hash=head_hash,
                snapshot=snapshot,
            )


def _rows(cursor: psycopg.ServerCursor[Any]) -> Iterator[Sequence[Any]]:
    yield from cursor


def run_ids(db: Database) -> list[str]:
    with db.connection() as conn:
        return [row[0] for row in conn.execute(L["run_ids"])]


def chain_existing_events(conn: psycopg.Connection[Any]) -> None:
    """Migration 0003's Python step: hash every stored event as found, in order, and
    record each run's head and its snapshot's hash."""
    for run_id, last_seq, snapshot in conn.execute(L["runs_to_chain"]).fetchall():
        rows = conn.execute(L["events_to_chain"], {"id": run_id}).fetchall()
        hashes = dict(chain_found(run_id, rows))
        with conn.cursor() as cursor:
            cursor.executemany(
                L["set_event_hash"],
                [{"hash": digest, "id": run_id, "seq": seq} for seq, digest in hashes.items()],
            )
        conn.execute(
            L["set_run_chain"],
            {
                "hash": hashes.get(int(last_seq)),
                "snapshot": dump_json(with_chain_head(snapshot, hashes)),
                "id": run_id,
            },
        )
