"""The runs half of the SQLite store: runs, the event log, run leases, artifacts.

An append is one ``BEGIN IMMEDIATE`` transaction: move the run's head only if the
caller's expected sequence, chain hash and lease still hold, insert the events (folded
by the caller onto the last state), rewrite the snapshot when due, commit. Its cost
depends on the step, never on the run's length: the head's row holds no snapshot
(``run_snapshots``, migration 0007), so moving it reads and writes a few bytes. The
last folded state of recently used runs is kept in memory keyed by ``(run_id,
last_seq)``: events are immutable, so a state with the same last sequence is the same
state, and a writer in another process simply makes the key miss. A step's events
come hashed by ``fold_step``; the head moves only if the run's recorded chain head is
still the hash they chained onto, and the database refuses an event that is not the
run's next (``keel.store.sqlite.log`` reads them back checked).
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, NamedTuple

from keel.core.chain import chain_time
from keel.core.errors import (
    LeaseHeld,
    LeaseLost,
    LogDamaged,
    NotFound,
    RunNotFound,
    StoreError,
)
from keel.core.events import Event, NewEvent
from keel.core.records import RunOptions
from keel.core.state import RunState
from keel.core.status import RunStatus
from keel.core.text import check_storable
from keel.faults import fault_point
from keel.store.base import Artifact, Lease, LeaseHolder, LogCheck
from keel.store.holders import holder_columns, holder_from_columns
from keel.store.logcheck import undamaged
from keel.store.sql import load_queries
from keel.store.sqlite import log
from keel.store.sqlite.connection import Database
from keel.store.stats import figure_rows
from keel.store.step import (
    FoldedStep,
    artifact_id,
    dump_json,
    first_event,
    fold_step,
    new_run_id,
    refuse_append,
)

Q = load_queries("keel.store.sqlite", "runs.sql")
STATE_CACHE_SIZE = 256
SNAPSHOT_EVERY = 48  # fewest events between snapshot rewrites (a status change always rewrites)
ARTIFACT_ID_HEX = 32


_OTHER_HEAD = "the run's recorded chain head is not the event this writer chained onto"
_NOT_OURS = "an event Keel did not append is already stored there"


def utc_text(moment: datetime) -> str:
    """Fixed-width ISO-8601 UTC text (sorts as time; parses with ``fromisoformat``)."""
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%f+00:00")


def epoch_to_datetime(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


class SnapshotMark(NamedTuple):
    """Where a run's stored snapshot stands: its event, its size, and how much event
    text was stored after it (JSON characters)."""

    seq: int
    size: int = 0  # 0: not known (a rewrite is then due by the event count alone)
    tail: int = 0

    def due(self, seq: int) -> bool:
        """Whether an append reaching ``seq`` rewrites the snapshot: at least
        ``SNAPSHOT_EVERY`` events after it *and* at least as much event text as the
        snapshot itself. Rewriting a snapshot then costs no more than the events
        written since (a run with many changed files does not re-serialise them every
        few steps: per-step cost stays flat), and a reader folds a tail no larger than
        the snapshot it parsed."""
        return seq - self.seq >= SNAPSHOT_EVERY and self.tail >= self.size


_UNKNOWN = SnapshotMark(-SNAPSHOT_EVERY)  # a state this process did not see stored: rewrite


class SQLiteRuns:
    """Runs, events, run leases and artifacts of ``SQLiteStore`` (mixin over ``_db``)."""

    _db: Database
    _states: OrderedDict[str, tuple[RunState, SnapshotMark]]  # run id -> (state, snapshot)
    _states_guard: threading.Lock

    def _init_runs(self) -> None:
        self._states = OrderedDict()
        self._states_guard = threading.Lock()

    # --- state cache -----------------------------------------------------------------

    def _cached(self, run_id: str, last_seq: int) -> tuple[RunState, SnapshotMark] | None:
        with self._states_guard:
            entry = self._states.get(run_id)
            if entry is None or entry[0].last_seq != last_seq:
                return None
            self._states.move_to_end(run_id)
            return entry

    def _remember(self, state: RunState, snapshot: SnapshotMark) -> None:
        with self._states_guard:
            self._states[state.run_id] = (state, snapshot)
            self._states.move_to_end(state.run_id)
            while len(self._states) > STATE_CACHE_SIZE:
                self._states.popitem(last=False)

    def _state_at(self, conn: sqlite3.Connection, run_id: str, last_seq: int) -> RunState:
        """The run's state at ``last_seq`` (from memory, else the snapshot plus later events)."""
        cached = self._cached(run_id, last_seq)
        return (cached if cached is not None else self._loaded(conn, run_id))[0]

    def _loaded(self, conn: sqlite3.Connection, run_id: str) -> tuple[RunState, SnapshotMark]:
        """The run's state read from the database (snapshot plus later events), kept."""
        state, snapshot_seq, size = log.load_checked(conn, run_id)
        snapshot = SnapshotMark(snapshot_seq, size)  # its tail's size not known: 0
        self._remember(state, snapshot)
        return state, snapshot

    # --- runs and events -------------------------------------------------------------

    def create_run(
        self,
        *,
        goal: str,
        workspace: str,
        options: RunOptions,
        parent_id: str | None = None,
        task_id: str | None = None,
        idempotency_key: str | None = None,
        queued: bool = False,
    ) -> RunState:
        """Create a run and its ``run_created`` event in one transaction (idempotent on key)."""
        check_storable("the goal", goal)
        check_storable("the workspace path", workspace)
        status = RunStatus.QUEUED if queued else RunStatus.RUNNING
        data = {
            "goal": goal,
            "workspace": workspace,
            "parent_id": parent_id,
            "task_id": task_id,
            "options": options.to_dict(),
            "status": status.value,
        }
        data_text = dump_json(data)
        data = json.loads(data_text)  # fold exactly what a reader of the log will see
        with self._db.write() as conn:
            if idempotency_key is not None:
                row = conn.execute(Q["find_run_by_key"], (idempotency_key,)).fetchone()
                if row is not None:
                    return self._state_at(conn, row[0], self._last_seq(conn, row[0]))
            if parent_id is not None and not conn.execute(Q["run_exists"], (parent_id,)).fetchone():
                raise RunNotFound(parent_id)
            now = datetime.now(UTC)
            now_text = chain_time(now)
            while True:
                run_id = new_run_id()
                event = first_event(run_id, data, data_text, now=now)
                state = RunState(run_id=run_id).apply(event)
                snapshot_text = dump_json(state.to_dict())
                try:
                    conn.execute(
                        Q["insert_run"],
                        (
                            run_id,
                            parent_id,
                            task_id,
                            state.status.value,
                            goal,
                            workspace,
                            idempotency_key,
                            1,
                            event.hash,
                            now_text,
                            now_text,
                            options.creator,
                        ),
                    )
                except sqlite3.IntegrityError:
                    continue  # a run id collision (48 random bits): draw another
                break
            conn.execute(Q["insert_snapshot"], (run_id, snapshot_text))
            conn.execute(
                Q["insert_event"],
                (run_id, 1, event.event_id, event.type.value, now_text, data_text, event.hash),
            )
            conn.executemany(Q["insert_figures"], figure_rows([event], options))
        self._remember(state, SnapshotMark(1, len(snapshot_text)))
        return state

    def append_events(
        self,
        run_id: str,
        events: Sequence[NewEvent],
        *,
        expected_seq: int,
        lease_token: str | None = None,
    ) -> tuple[RunState, list[Event]]:
        """Append one step's events atomically, only if ``expected_seq`` is still the last.

        Stale ``expected_seq`` -> ConcurrentUpdate; a ``lease_token`` that is not the
        run's current unexpired lease -> LeaseLost; an illegal ``status_changed`` ->
        InvalidTransition. In every refused case nothing is written.
        """
        if not events:
            with self._db.write() as conn:
                self._check_head(conn, run_id, expected_seq, lease_token)
                return self._state_at(conn, run_id, expected_seq), []
        # Fold first, outside the write lock: the base state comes from memory when this
        # process wrote the run last; the conditional UPDATE below proves it is current.
        cached = self._cached(run_id, expected_seq)
        if cached is None:
            with self._db.read() as conn:  # the head checked, then read in one snapshot
                self._check_head(conn, run_id, expected_seq, None)
                cached = self._loaded(conn, run_id)
        base, snapshot = cached
        step = fold_step(base, events, now=datetime.now(UTC))
        return self._write_step(run_id, step, lease_token, snapshot)

    def append_folded(
        self, run_id: str, step: FoldedStep, *, lease_token: str | None = None
    ) -> tuple[RunState, list[Event]]:
        """Store a step its writer folded with ``fold_step`` onto the state this store
        returned at ``step.base_seq``; refused exactly as ``append_events`` is."""
        if not step.events:
            return self.append_events(
                run_id, [], expected_seq=step.base_seq, lease_token=lease_token
            )
        cached = self._cached(run_id, step.base_seq)
        snapshot = cached[1] if cached is not None else _UNKNOWN
        return self._write_step(run_id, step, lease_token, snapshot)

    def _write_step(
        self, run_id: str, step: FoldedStep, lease_token: str | None, snapshot: SnapshotMark
    ) -> tuple[RunState, list[Event]]:
        state, stored, expected_seq = step.state, step.events, step.base_seq
        seq = state.last_seq
        now_text = utc_text(datetime.now(UTC))
        rows = []
        at: datetime | None = None
        at_text = ""
        for e, text in zip(stored, step.texts, strict=True):
            if e.recorded_at is not at:  # a step's events share one time: format it once
                at, at_text = e.recorded_at, chain_time(e.recorded_at)
            rows.append((run_id, e.seq, e.event_id, e.type.value, at_text, text, e.hash))
        figures = figure_rows(stored, state.options)  # what `keel stats` reads
        # The snapshot is rewritten on every status change and when due (SnapshotMark);
        # readers fold the events after it, so an append stays O(new events).
        rewrite = state.status is not step.base_status or snapshot.due(seq)
        snapshot_text = dump_json(state.to_dict()) if rewrite else ""
        with self._db.write() as conn:
            cursor = conn.execute(
                Q["advance_run"],
                (
                    state.status.value,
                    seq,
                    state.last_hash,
                    now_text,
                    run_id,
                    expected_seq,
                    step.base_hash,
                    lease_token,
                    lease_token,
                ),
            )
            if cursor.rowcount != 1:
                self._check_head(conn, run_id, expected_seq, lease_token)
                head = conn.execute(log.L["run_chain_head"], (run_id,)).fetchone()
                if head is not None and head[1] != step.base_hash:
                    raise LogDamaged(run_id, expected_seq, _OTHER_HEAD)
                raise StoreError(f"append to {run_id} refused and no reason found; retry")
            fault_point("append_head_advanced")
            if rewrite:
                conn.execute(Q["rewrite_snapshot"], (run_id, snapshot_text))
            try:
                # The first row alone, then the rest: one more call per step, so a test can
                # stop the process between a step's events (``append_mid_events``).
                if rows:
                    conn.execute(Q["insert_event"], rows[0])
                    fault_point("append_mid_events")
                if len(rows) > 1:
                    conn.executemany(Q["insert_event"], rows[1:])
            except sqlite3.IntegrityError:
                # The head said expected_seq, yet the database refuses the next seq: a
                # row Keel did not append is already there.
                raise LogDamaged(run_id, expected_seq + 1, _NOT_OURS) from None
            if figures:
                conn.executemany(Q["insert_figures"], figures)
            fault_point("append_rows_written")
        fault_point("append_committed")
        if rewrite:
            snapshot = SnapshotMark(seq, len(snapshot_text))
        else:
            snapshot = snapshot._replace(tail=snapshot.tail + sum(map(len, step.texts)))
        self._remember(state, snapshot)
        return state, stored

    def _check_head(
        self,
        conn: sqlite3.Connection,
        run_id: str,
        expected_seq: int,
        lease_token: str | None,
    ) -> None:
        """Raise what refuses an append: RunNotFound, ConcurrentUpdate or LeaseLost."""
        head = conn.execute(Q["run_head"], (run_id,)).fetchone()
        refuse_append(run_id, head, expected_seq=expected_seq, lease_token=lease_token)

    def load_run(self, run_id: str) -> RunState:
        with self._db.read() as conn:
            return self._state_at(conn, run_id, self._last_seq(conn, run_id))

    def list_runs(self, *, status: RunStatus | None = None, limit: int = 100) -> list[RunState]:
        """Newest first; LogDamaged for the first listed run whose log is damaged."""
        return undamaged(self.survey_runs(status=status, limit=limit))

    def survey_runs(
        self, *, status: RunStatus | None = None, limit: int = 100
    ) -> list[RunState | LogDamaged]:
        """As ``list_runs``; a run whose log is damaged is listed as its ``LogDamaged``."""
        listed: list[RunState | LogDamaged] = []
        with self._db.read() as conn:
            if status is None:
                rows = conn.execute(Q["list_runs"], (limit,)).fetchall()
            else:
                rows = conn.execute(Q["list_runs_by_status"], (status.value, limit)).fetchall()
            for run_id, last_seq in rows:
                try:
                    listed.append(self._state_at(conn, run_id, last_seq))
                except LogDamaged as damage:
                    listed.append(damage)
        return listed

    def child_runs(self, run_id: str) -> list[RunState]:
        """The run's direct children, oldest first, read in one transaction."""
        with self._db.read() as conn:
            if conn.execute(Q["run_exists"], (run_id,)).fetchone() is None:
                raise RunNotFound(run_id)
            rows = conn.execute(Q["child_runs"], (run_id,)).fetchall()
            return [self._state_at(conn, child_id, last_seq) for child_id, last_seq in rows]

    def read_events(self, run_id: str, *, after: int = 0, limit: int | None = None) -> list[Event]:
        with self._db.read() as conn:
            return log.read_checked(conn, run_id, after=after, limit=limit)

    def verify_log(self, run_id: str) -> LogCheck:
        """The whole log re-hashed from its genesis hash in one read transaction."""
        with self._db.read() as conn:
            return log.verify_checked(conn, run_id)

    def run_ids(self) -> list[str]:
        with self._db.read() as conn:
            return log.run_ids(conn)

    def wait_for_events(self, run_id: str, *, after: int, timeout: float) -> bool:
        """Poll the run's last sequence every 50 ms (one primary-key lookup)."""
        deadline = time.monotonic() + timeout
        while True:
            with self._db.read() as conn:
                if self._last_seq(conn, run_id) > after:
                    return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            time.sleep(min(0.05, remaining))

    @staticmethod
    def _last_seq(conn: sqlite3.Connection, run_id: str) -> int:
        row = conn.execute(Q["last_seq"], (run_id,)).fetchone()
        if row is None:
            raise RunNotFound(run_id)
        return int(row[0])

    # --- run leases ------------------------------------------------------------------

    def acquire_run_lease(
        self,
        run_id: str,
        *,
        owner: str,
        ttl: float,
        holder: LeaseHolder | None = None,
        replacing: str | None = None,
    ) -> Lease:
        with self._db.write() as conn:
            row = conn.execute(Q["run_lease"], (run_id,)).fetchone()
            if row is None:
                raise RunNotFound(run_id)
            held_by, token, expires_at, live = row[:4]
            if token is not None and live and (replacing is None or token != replacing):
                raise LeaseHeld(run_id, held_by, epoch_to_datetime(expires_at))
            return self._take_run_lease(conn, run_id, owner, ttl, holder)

    def _take_run_lease(
        self,
        conn: sqlite3.Connection,
        run_id: str,
        owner: str,
        ttl: float,
        holder: LeaseHolder | None,
    ) -> Lease:
        token = uuid.uuid4().hex
        params = (owner, token, ttl, *holder_columns(holder), run_id)
        (expires_at,) = conn.execute(Q["take_run_lease"], params).fetchone()
        return Lease(
            subject=run_id,
            owner=owner,
            token=token,
            expires_at=epoch_to_datetime(expires_at),
            holder=holder,
        )

    def renew_run_lease(self, lease: Lease, *, ttl: float) -> Lease:
        with self._db.write() as conn:
            row = conn.execute(Q["renew_run_lease"], (ttl, lease.subject, lease.token)).fetchone()
            if row is None:
                current = conn.execute(Q["run_lease"], (lease.subject,)).fetchone()
                if current is None:
                    raise RunNotFound(lease.subject)
                held_by, token = current[0], current[1]
                raise LeaseLost(
                    lease.subject,
                    f"now held by {held_by}"
                    if token not in (None, lease.token)
                    else "the lease expired"
                    if token == lease.token
                    else "the lease was released",
                )
        return Lease(
            subject=lease.subject,
            owner=lease.owner,
            token=lease.token,
            expires_at=epoch_to_datetime(row[0]),
            holder=lease.holder,
        )

    def release_run_lease(self, lease: Lease) -> None:
        with self._db.write() as conn:
            conn.execute(Q["release_run_lease"], (lease.subject, lease.token))

    def current_run_lease(self, run_id: str) -> Lease | None:
        row = self._db.first_row(Q["run_lease"], (run_id,))
        if row is None:
            raise RunNotFound(run_id)
        owner, token, expires_at, live = row[:4]
        if token is None or not live:
            return None
        return Lease(
            subject=run_id,
            owner=owner,
            token=token,
            expires_at=epoch_to_datetime(expires_at),
            holder=holder_from_columns(row[4:]),
        )

    def claim_next_run(
        self, *, owner: str, ttl: float, holder: LeaseHolder | None = None
    ) -> tuple[RunState, Lease] | None:
        """Atomically lease the oldest claimable run (queued, or running with a dead holder)."""
        with self._db.write() as conn:
            row = conn.execute(Q["next_claimable_run"]).fetchone()
            if row is None:
                return None
            run_id = row[0]
            lease = self._take_run_lease(conn, run_id, owner, ttl, holder)
        # Read after the lease is committed: a run whose log is damaged (LogDamaged) stays
        # leased by this claimer until the lease lapses, instead of being claimed again at once.
        with self._db.read() as conn:
            state = self._state_at(conn, run_id, self._last_seq(conn, run_id))
        return state, lease

    # --- artifacts -------------------------------------------------------------------

    def put_artifact(self, run_id: str, name: str, content: bytes) -> Artifact:
        """Store ``content`` once: equal bytes give the same id (and the first put's name)."""
        art_id = artifact_id(content)
        with self._db.write() as conn:
            if conn.execute(Q["run_exists"], (run_id,)).fetchone() is None:
                raise RunNotFound(run_id)
            conn.execute(
                Q["insert_artifact"],
                (art_id, run_id, name, len(content), content, utc_text(datetime.now(UTC))),
            )
            row = conn.execute(Q["artifact_meta"], (art_id,)).fetchone()
        return _artifact(row)

    def get_artifact(self, artifact_id: str) -> tuple[Artifact, bytes]:
        with self._db.read() as conn:
            row = conn.execute(Q["artifact_with_content"], (artifact_id,)).fetchone()
        if row is None:
            raise NotFound(f"no artifact with id {artifact_id!r}; `keel show RUN_ID` lists a run's")
        return _artifact(row[:5]), bytes(row[5])


def _artifact(row: Sequence[Any]) -> Artifact:
    art_id, run_id, name, size, created_at = row
    return Artifact(
        id=art_id,
        run_id=run_id,
        name=name,
        size=int(size),
        created_at=datetime.fromisoformat(created_at),
    )
