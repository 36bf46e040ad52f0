"""What ``keel serve`` asks of the SQLite store: pages of runs, per-status counts, the
queue depth, and API tokens (statements in ``service.sql``).

A page is one read transaction: the page's rows and their states come from one
committed snapshot. Tokens are kept by name with the SHA-256 of the token only.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from keel.core.chain import chain_time
from keel.core.errors import NotFound, UsageError
from keel.core.state import RunState
from keel.core.status import RunStatus
from keel.store.base import ApiToken
from keel.store.service import (
    all_statuses,
    check_token_hash,
    check_token_name,
    clamp_limit,
    decode_cursor,
    encode_cursor,
    page_filters,
)
from keel.store.sql import load_queries
from keel.store.sqlite.runs import SQLiteRuns, utc_text

S = load_queries("keel.store.sqlite", "service.sql")


class SQLiteService(SQLiteRuns):
    """The service additions of ``SQLiteStore`` (over the runs mixin's ``_db``)."""

    # --- runs: pages, counts, queue ----------------------------------------------------

    def page_runs(
        self,
        *,
        status: RunStatus | None = None,
        parent_id: str | None = None,
        creator: str | None = None,
        before: str | None = None,
        limit: int = 50,
        top_level: bool = False,
    ) -> tuple[list[RunState], str | None]:
        """Newest first by (created_at, id); ``before`` is the last page's cursor."""
        size = clamp_limit(limit)
        params: dict[str, Any] = {
            "status": None if status is None else RunStatus(status).value,
            "parent_id": parent_id,
            "creator": creator,
            "limit": size + 1,  # one more: is there a next page?
        }
        if before is not None:
            before_at, params["before_id"] = decode_cursor(before)
            params["before_at"] = chain_time(before_at)
        names = page_filters(
            status=status,
            parent_id=parent_id,
            creator=creator,
            before=before,
            top_level=top_level,
        )
        sql = S["page_runs"].replace("/* filters */", " ".join(S[n] for n in names))
        with self._db.read() as conn:
            rows = conn.execute(sql, params).fetchall()
            runs = [self._state_at(conn, run_id, last_seq) for run_id, last_seq, _ in rows[:size]]
        if len(rows) <= size:
            return runs, None
        last_id, _, last_at = rows[size - 1]
        return runs, encode_cursor(datetime.fromisoformat(last_at), last_id)

    def count_runs_by_status(self) -> dict[RunStatus, int]:
        with self._db.read() as conn:
            rows = conn.execute(S["count_runs_by_status"]).fetchall()
        return all_statuses({str(status): int(n) for status, n in rows})

    def queue_depth(self) -> int:
        with self._db.read() as conn:
            row = conn.execute(S["queue_depth"]).fetchone()
        return int(row[0])

    # --- API tokens --------------------------------------------------------------------

    def create_token(self, name: str, token_hash: str) -> ApiToken:
        """Keep ``name`` -> ``token_hash`` (never the token); see ``Store.create_token``."""
        check_token_name(name)
        check_token_hash(token_hash)
        params = {"name": name, "hash": token_hash, "at": utc_text(datetime.now(UTC))}
        try:
            with self._db.write() as conn:
                row = conn.execute(S["create_token"], params).fetchone()
        except sqlite3.IntegrityError:  # the same hash under another name
            raise UsageError(
                f"cannot create token {name}: that token is already registered; make a new one"
            ) from None
        if row is None:
            raise UsageError(f"a token named {name} already exists; revoke it first")
        return _token(row)

    def list_tokens(self) -> list[ApiToken]:
        with self._db.read() as conn:
            return [_token(row) for row in conn.execute(S["list_tokens"]).fetchall()]

    def revoke_token(self, name: str) -> ApiToken:
        at = utc_text(datetime.now(UTC))
        with self._db.write() as conn:
            row = conn.execute(S["revoke_token"], {"name": name, "at": at}).fetchone()
        if row is None:
            raise NotFound(f"no live token named {name}")
        return _token(row)

    def token_by_hash(self, token_hash: str) -> ApiToken | None:
        with self._db.read() as conn:
            row = conn.execute(S["token_by_hash"], {"hash": token_hash}).fetchone()
        return None if row is None else _token(row)


def _token(row: Sequence[Any]) -> ApiToken:
    name, created_at, revoked_at, last_used_at = row
    return ApiToken(
        name=name,
        created_at=datetime.fromisoformat(created_at),
        revoked_at=None if revoked_at is None else datetime.fromisoformat(revoked_at),
        last_used_at=None if last_used_at is None else datetime.fromisoformat(last_used_at),
    )
