"""``Store.run_stats`` on SQLite: the figures aggregated in the database (``stats.sql``).

It reads the runs and their ``event_figures`` rows (``keel.store.stats``: a narrow row
per model turn, tool outcome and verification, written with its event), in one read
transaction: counts and sums by one GROUP BY in SQL; percentiles in Python
(``keel.core.stats.percentiles``, nearest rank) over the latency column, fetched
unsorted. SQLite has no percentile function; its window functions sort and buffer every
timed call (about 1.5 s for 10,000 runs), and an index in latency order would make
every append write to a random page of it; fetching ~200,000 floats and sorting them
per model and tool in Python takes a fraction of that.
"""

from __future__ import annotations

import json
import sqlite3
from collections import defaultdict
from datetime import datetime
from typing import Any

from keel.core.chain import chain_time
from keel.core.events import EventType
from keel.core.records import RunOptions
from keel.core.stats import PERCENTILES, RunStats, percentiles
from keel.store.sql import load_queries
from keel.store.sqlite.connection import Database
from keel.store.stats import (
    FIGURE_TYPES,
    FigureRow,
    assemble,
    options_of,
    rows_of_event,
    stats_filters,
)

T = load_queries("keel.store.sqlite", "stats.sql")
Q = load_queries("keel.store.sqlite", "runs.sql")
BACKFILL_BATCH = 5000


class SQLiteStats:
    """``run_stats`` of ``SQLiteStore`` (mixin over ``_db``)."""

    _db: Database

    def run_stats(
        self,
        *,
        since: datetime | None = None,
        model: str | None = None,
        run_id: str | None = None,
    ) -> RunStats:
        """See ``Store.run_stats``."""
        asked = stats_filters(since=since, model=model, run_id=run_id)

        def statement(name: str, prefix: str) -> str:
            fragments = " ".join(T[f"{prefix}_if_{n}"] for n in asked)
            return T[name].replace("/* filters */", fragments)

        params: dict[str, Any] = {
            "run_id": run_id,
            "since": None if since is None else chain_time(since),
            "model": model,
        }
        timed: dict[tuple[str, str], list[float]] = defaultdict(list)
        with self._db.read() as conn:
            runs = conn.execute(statement("stats_runs", "runs"), params).fetchall()
            sums = conn.execute(statement("stats_figures", "figures"), params).fetchall()
            for kind, name, seconds in conn.execute(
                statement("stats_latencies", "figures"), params
            ):
                timed[(kind, name)].append(seconds)
        marks = {key: percentiles(values) for key, values in timed.items()}
        figures = [(*row, *marks.get((row[0], row[1]), _UNTIMED)) for row in sums]
        return assemble(runs, figures, run_id=run_id)


_UNTIMED = (None,) * len(PERCENTILES)


def backfill_event_figures(conn: sqlite3.Connection) -> None:
    """Migration 0006: the figures of the events stored before it, made by the code that
    makes them for every append (``keel.store.stats.rows_of_event``)."""
    types = json.dumps(sorted(t.value for t in FIGURE_TYPES))
    cursor = conn.execute(T["figure_events"], {"types": types})
    run, options = None, RunOptions()
    while batch := cursor.fetchmany(BACKFILL_BATCH):
        rows: list[FigureRow] = []
        for run_id, seq, type_, text in batch:
            kind, data = EventType(type_), json.loads(text)
            if run_id != run:
                run, options = run_id, RunOptions()
            if kind is EventType.RUN_CREATED:
                options = options_of(data)
            rows += rows_of_event(run_id, seq, kind, data, options)
        conn.executemany(Q["insert_figures"], rows)
