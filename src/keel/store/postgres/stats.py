"""``Store.run_stats`` on PostgreSQL: the figures aggregated in the database (``stats.sql``).

Two statements in one repeatable-read transaction (one snapshot): runs by status and
reason, then the ``event_figures`` rows (``keel.store.stats``: a narrow row per model
turn, tool outcome and verification, written with its event) grouped by model, tool
and verifier, with percentiles by ``percentile_disc`` (nearest rank) in the same pass.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import psycopg

from keel.core.events import EventType
from keel.core.records import RunOptions
from keel.core.stats import RunStats
from keel.store.postgres.connection import Database
from keel.store.sql import load_queries
from keel.store.stats import (
    FIGURE_TYPES,
    FigureRow,
    assemble,
    options_of,
    rows_of_event,
    stats_filters,
)

T = load_queries("keel.store.postgres", "stats.sql")
BACKFILL_BATCH = 5000


class PostgresStats:
    """``run_stats`` of ``PostgresStore`` (mixin over ``_db``)."""

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

        params: dict[str, Any] = {"since": since, "model": model, "run_id": run_id}
        with self._db.transaction() as conn:
            conn.execute(T["stats_snapshot"])
            runs = conn.execute(statement("stats_runs", "runs"), params).fetchall()
            figures = conn.execute(statement("stats_figures", "figures"), params).fetchall()
        return assemble(runs, figures, run_id=run_id)


def backfill_event_figures(conn: psycopg.Connection[Any]) -> None:
    """Migration 0006: the figures of the events stored before it, made by the code that
    makes them for every append (``keel.store.stats.rows_of_event``)."""
    types = sorted(t.value for t in FIGURE_TYPES)
    run, options = None, RunOptions()
    with conn.cursor(name="keel_figure_events") as events, conn.cursor() as out:
        events.execute(T["figure_events"], {"types": types})
        while batch := events.fetchmany(BACKFILL_BATCH):
            rows: list[FigureRow] = []
            for run_id, seq, type_, text in batch:
                kind, data = EventType(type_), json.loads(text)
                if run_id != run:
                    run, options = run_id, RunOptions()
                if kind is EventType.RUN_CREATED:
                    options = options_of(data)
                rows += rows_of_event(run_id, int(seq), kind, data, options)
            if rows:
                out.executemany(T["insert_figures"], rows)
