"""The runs half of the PostgreSQL store: runs, the event log, run leases, artifacts.

An append is one statement: the caller's step is folded onto the run's state in
Python (``RunState.apply``), then a CTE updates the snapshot *only if* the run's
``last_seq`` is still ``expected_seq`` and the lease token (when given) is the
run's current, unexpired one (database clock), and inserts the events in the same
transaction. No row back means nothing was written; a second query then says why
(``ConcurrentUpdate``, ``LeaseLost``, ``RunNotFound``). Sequences stay gapless
because ``(run_id, seq)`` is the key and the conditional update serialises writers.
Folded states are cached per process keyed by ``(run_id, last_seq)``: events are
immutable, so equal keys are equal states.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from psycopg import errors as pg_errors

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
from keel.store.base import Artifact, Lease, LeaseHolder, LogCheck
from keel.store.holders import holder_columns, holder_from_columns
from keel.store.logcheck import checked_state, undamaged
from keel.store.postgres import log
from keel.store.postgres.connection import Database
from keel.store.postgres.listener import Listener
from keel.store.sql import load_queries
from keel.store.stats import figure_columns, figure_rows
from keel.store.step import (
    FoldedStep,
    artifact_id,
    dump_json,
    first_event,
    fold_step,
    new_run_id,
    refuse_append,
)

Q = load_queries("keel.store.postgres", "runs.sql")
_OTHER_HEAD = "the run's recorded chain head is not the event this writer chained onto"
_NOT_OURS = "an event Keel did not append is already stored there"
STATE_CACHE_SIZE = 256
EVENTS_POLL_S = 0.25
_RACE_RETRIES = 3


class PostgresRuns:
    """Runs, events, run leases and artifacts of ``PostgresStore`` (mixin over ``_db``)."""

    url: str
    _db: Database
    _states: OrderedDict[str, RunState]
    _states_guard: threading.Lock
    _listening: Listener | None
    _listener_guard: threading.Lock

    def _init_runs(self) -> None:
        self._states = OrderedDict()
        self._states_guard = threading.Lock()
        self._listening = None
        self._listener_guard = threading.Lock()

    def _listener(self) -> Listener:
        """The LISTEN session, started on first wait."""
        with self._listener_guard:
            if self._listening is None:
                self._listening = Listener(self.url)
            return self._listening

    # --- state cache -----------------------------------------------------------------

    def _cached(self, run_id: str) -> RunState | None:
        with self._states_guard:
            state = self._states.get(run_id)
            if state is not None:
                self._states.move_to_end(run_id)
            return state

    def _remember(self, state: RunState) -> None:
        with self._states_guard:
            known = self._states.get(state.run_id)
            if known is not None and known.last_seq > state.last_seq:
                return
            self._states[state.run_id] = state
            self._states.move_to_end(state.run_id)
            while len(self._states) > STATE_CACHE_SIZE:
                self._states.popitem(last=False)

    def _current(self, run_id: str) -> RunState:
        """The run's state now: one primary-key read, the snapshot (and the rows a reader
        checks, ``keel.store.logcheck``) only on a cache miss."""
        cached = self._cached(run_id)
        with self._db.connection() as conn:
            row = conn.execute(
                Q["run_state"],
                {"id": run_id, "cached_seq": cached.last_seq if cached else -1},
            ).fetchone()
        if row is None:
            raise RunNotFound(run_id)
        last_seq, last_hash, snapshot, tail = row
        if snapshot is None and cached is not None:
            return cached
        state = _checked(run_id, last_seq, last_hash, snapshot, tail)
        self._remember(state)
        return state

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
        """Create a run and its ``run_created`` event in one statement (idempotent on key)."""
        check_storable("the goal", goal)
        check_storable("the workspace path", workspace)
        status = RunStatus.QUEUED if queued else RunStatus.RUNNING
        data_text = dump_json(
            {
                "goal": goal,
                "workspace": workspace,
                "parent_id": parent_id,
                "task_id": task_id,
                "options": options.to_dict(),
                "status": status.value,
            }
        )
        data = json.loads(data_text)  # fold exactly what a reader of the log will see
        while True:
            if idempotency_key is not None:
                existing = self._run_by_key(idempotency_key)
                if existing is not None:
                    return existing
            now = datetime.now(UTC)
            run_id = new_run_id()
            event = first_event(run_id, data, data_text, now=now)
            state = RunState(run_id=run_id).apply(event)
            params = {
                "id": run_id,
                "parent_id": parent_id,
                "task_id": task_id,
                "status": state.status.value,
                "goal": goal,
                "workspace": workspace,
                "key": idempotency_key,
                "creator": options.creator,
                "snapshot": dump_json(state.to_dict()),
                "at": now,
                "event_id": event.event_id,
                "data": data_text,
                "hash": event.hash,
                "spec": figure_rows([event], options)[0][4],
            }
            try:
                with self._db.connection() as conn:
                    row = conn.execute(Q["insert_run"], params).fetchone()
            except StoreError as exc:
                if isinstance(exc.__cause__, pg_errors.ForeignKeyViolation) and parent_id:
                    raise RunNotFound(parent_id) from None
                raise
            if row is not None:
                with self._db.connection() as conn:
                    conn.execute(Q["notify_events"], {"id": run_id, "last_seq": 1})
                self._remember(state)
                return state
            # A used idempotency key (loop finds it) or a run id collision (draw again).

    def _run_by_key(self, key: str) -> RunState | None:
        with self._db.connection() as conn:
            row = conn.execute(Q["find_run_by_key"], {"key": key}).fetchone()
        return self._current(row[0]) if row is not None else None

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
        for _ in range(_RACE_RETRIES):
            state = self._cached(run_id)
            if state is None or state.last_seq != expected_seq:
                state = self._current(run_id)
            if state.last_seq != expected_seq or not events:
                self._refusal(run_id, expected_seq, lease_token)
                if events:
                    continue  # the run moved back to expected_seq's reader: read again
                return state, []
            step = fold_step(state, events, now=datetime.now(UTC))
            if self._write_step(run_id, step, lease_token):
                return step.state, step.events
            self._refusal(run_id, expected_seq, lease_token, base_hash=step.base_hash)
        raise StoreError(f"run {run_id}: append kept racing; retry the step")

    def append_folded(
        self, run_id: str, step: FoldedStep, *, lease_token: str | None = None
    ) -> tuple[RunState, list[Event]]:
        """Store a step its writer folded with ``fold_step`` onto the state this store
        returned at ``step.base_seq``; refused exactly as ``append_events`` is."""
        if not step.events:
            return self.append_events(
                run_id, [], expected_seq=step.base_seq, lease_token=lease_token
            )
        if self._write_step(run_id, step, lease_token):
            return step.state, step.events
        self._refusal(run_id, step.base_seq, lease_token, base_hash=step.base_hash)
        raise StoreError(f"append to {run_id} refused and no reason found; retry")

    def _write_step(self, run_id: str, step: FoldedStep, lease_token: str | None) -> bool:
        """One statement: head moved and events inserted, or nothing (False)."""
        state = step.state
        params: dict[str, Any] = {
            "id": run_id,
            "expected": step.base_seq,
            "token": lease_token,
            "snapshot": dump_json(state.to_dict()),
            "status": state.status.value,
            "last_seq": state.last_seq,
            "last_hash": state.last_hash,
            "base_hash": step.base_hash,
            "at": datetime.now(UTC),
            "seqs": [e.seq for e in step.events],
            "event_ids": [e.event_id for e in step.events],
            "types": [e.type.value for e in step.events],
            "ats": [e.recorded_at for e in step.events],
            "datas": step.texts,
            "hashes": [e.hash for e in step.events],
            **figure_columns(figure_rows(step.events, state.options)),
        }
        try:
            with self._db.connection() as conn, conn.pipeline():
                appended = conn.execute(Q["append_events"], params)
                conn.execute(Q["notify_events"], {"id": run_id, "last_seq": state.last_seq})
                written = appended.fetchall()
        except StoreError as exc:
            if isinstance(exc.__cause__, pg_errors.IntegrityError):
                # The head said base_seq, yet the database refuses the next seq: a row
                # Keel did not append is already there.
                raise LogDamaged(run_id, step.base_seq + 1, _NOT_OURS) from None
            raise
        if written:
            self._remember(state)
        return bool(written)

    def _refusal(
        self,
        run_id: str,
        expected_seq: int,
        lease_token: str | None,
        *,
        base_hash: str | None = None,
    ) -> None:
        """Raise why an append at ``expected_seq`` with ``lease_token`` (chained onto
        ``base_hash``, when given) cannot be written."""
        with self._db.connection() as conn:
            head = conn.execute(Q["run_head"], {"id": run_id}).fetchone()
            chain = conn.execute(log.L["run_head_hash"], {"id": run_id}).fetchone()
        refuse_append(run_id, head, expected_seq=expected_seq, lease_token=lease_token)
        if base_hash is not None and chain is not None and chain[0] != base_hash:
            raise LogDamaged(run_id, expected_seq, _OTHER_HEAD)

    def load_run(self, run_id: str) -> RunState:
        return self._current(run_id)

    def list_runs(self, *, status: RunStatus | None = None, limit: int = 100) -> list[RunState]:
        """Newest first; LogDamaged for the first listed run whose log is damaged."""
        return undamaged(self.survey_runs(status=status, limit=limit))

    def survey_runs(
        self, *, status: RunStatus | None = None, limit: int = 100
    ) -> list[RunState | LogDamaged]:
        """As ``list_runs``; a run whose log is damaged is listed as its ``LogDamaged``."""
        with self._db.connection() as conn:
            if status is None:
                rows = conn.execute(Q["list_runs"], {"limit": limit}).fetchall()
            else:
                rows = conn.execute(
                    Q["list_runs_by_status"], {"status": status.value, "limit": limit}
                ).fetchall()
        listed: list[RunState | LogDamaged] = []
        for run_id, last_seq, last_hash, snapshot, tail in rows:
            try:
                listed.append(_checked(run_id, last_seq, last_hash, snapshot, tail))
            except LogDamaged as damage:
                listed.append(damage)
        return listed

    def child_runs(self, run_id: str) -> list[RunState]:
        """The run's direct children, oldest first (runs are never deleted, so the
        parent checked first still exists when its children are read)."""
        with self._db.connection() as conn:
            if conn.execute(Q["run_exists"], {"id": run_id}).fetchone() is None:
                raise RunNotFound(run_id)
            rows = conn.execute(Q["child_runs"], {"id": run_id}).fetchall()
        children = [_checked(*row) for row in rows]
        for child in children:
            self._remember(child)
        return children

    def read_events(self, run_id: str, *, after: int = 0, limit: int | None = None) -> list[Event]:
        return log.read_checked(self._db, run_id, after=after, limit=limit)

    def verify_log(self, run_id: str) -> LogCheck:
        """The whole log re-hashed from its genesis hash, in one repeatable-read snapshot."""
        return log.verify_checked(self._db, run_id)

    def run_ids(self) -> list[str]:
        return log.run_ids(self._db)

    def _last_seq(self, run_id: str) -> int:
        with self._db.connection() as conn:
            row = conn.execute(Q["last_seq"], {"id": run_id}).fetchone()
        if row is None:
            raise RunNotFound(run_id)
        return int(row[0])

    def wait_for_events(self, run_id: str, *, after: int, timeout: float) -> bool:
        """Woken by NOTIFY on ``keel_events``; re-reads ``last_seq`` at least every 0.25 s,
        so a lost notification or a dead listener only delays the answer."""
        deadline = time.monotonic() + timeout
        listener = self._listener()
        listener.watch(run_id)
        try:
            while True:
                if self._last_seq(run_id) > after:
                    return True
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                listener.wait_for_seq(run_id, after, min(EVENTS_POLL_S, remaining))
        finally:
            listener.unwatch(run_id)

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
        token = uuid.uuid4().hex
        params = {
            "id": run_id,
            "owner": owner,
            "token": token,
            "ttl": ttl,
            "replacing": replacing,
            **_holder_params(holder),
        }
        with self._db.connection() as conn:
            row = conn.execute(Q["acquire_run_lease"], params).fetchone()
            if row is None:
                current = conn.execute(Q["run_lease"], {"id": run_id}).fetchone()
                if current is None:
                    raise RunNotFound(run_id)
                raise LeaseHeld(run_id, current[0], current[2])
        return Lease(subject=run_id, owner=owner, token=token, expires_at=row[0], holder=holder)

    def renew_run_lease(self, lease: Lease, *, ttl: float) -> Lease:
        with self._db.connection() as conn:
            row = conn.execute(
                Q["renew_run_lease"], {"id": lease.subject, "token": lease.token, "ttl": ttl}
            ).fetchone()
            if row is None:
                current = conn.execute(Q["run_lease"], {"id": lease.subject}).fetchone()
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
            expires_at=row[0],
            holder=lease.holder,
        )

    def release_run_lease(self, lease: Lease) -> None:
        with self._db.connection() as conn:
            conn.execute(Q["release_run_lease"], {"id": lease.subject, "token": lease.token})

    def current_run_lease(self, run_id: str) -> Lease | None:
        with self._db.connection() as conn:
            row = conn.execute(Q["run_lease"], {"id": run_id}).fetchone()
        if row is None:
            raise RunNotFound(run_id)
        owner, token, expires_at, live = row[:4]
        if token is None or not live:
            return None
        return Lease(
            subject=run_id,
            owner=owner,
            token=token,
            expires_at=expires_at,
            holder=holder_from_columns(row[4:]),
        )

    def claim_next_run(
        self, *, owner: str, ttl: float, holder: LeaseHolder | None = None
    ) -> tuple[RunState, Lease] | None:
        """Lease the oldest claimable run in one statement (``FOR UPDATE SKIP LOCKED``)."""
        token = uuid.uuid4().hex
        params = {"owner": owner, "token": token, "ttl": ttl, **_holder_params(holder)}
        with self._db.connection() as conn:
            row = conn.execute(Q["claim_next_run"], params).fetchone()
        if row is None:
            return None
        run_id, last_seq, snapshot, expires_at = row
        state = RunState.from_dict(snapshot)
        if state.last_seq != last_seq:
            raise StoreError(f"run {run_id}: snapshot at {state.last_seq}, log at {last_seq}")
        self._remember(state)
        return state, Lease(
            subject=run_id, owner=owner, token=token, expires_at=expires_at, holder=holder
        )

    # --- artifacts -------------------------------------------------------------------

    def put_artifact(self, run_id: str, name: str, content: bytes) -> Artifact:
        """Store ``content`` once: equal bytes give the same id (and the first put's name)."""
        art_id = artifact_id(content)
        params = {
            "id": art_id,
            "run_id": run_id,
            "name": name,
            "size": len(content),
            "content": content,
        }
        try:
            with self._db.connection() as conn:
                row = conn.execute(Q["put_artifact"], params).fetchone()
        except StoreError as exc:
            if isinstance(exc.__cause__, pg_errors.ForeignKeyViolation):
                raise RunNotFound(run_id) from None
            raise
        assert row is not None
        return _artifact(row)

    def get_artifact(self, artifact_id: str) -> tuple[Artifact, bytes]:
        with self._db.connection() as conn:
            row = conn.execute(Q["artifact_with_content"], {"id": artifact_id}).fetchone()
        if row is None:
            raise NotFound(f"no artifact with id {artifact_id!r}; `keel show RUN_ID` lists a run's")
        return _artifact(row[:5]), bytes(row[5])


def _checked(
    run_id: str, last_seq: int, last_hash: str | None, snapshot: Any, tail: Any
) -> RunState:
    """The run's state from its snapshot and the rows after it, their chain checked."""
    try:
        state = RunState.from_dict(snapshot)
    except (KeyError, ValueError, TypeError, AttributeError):
        raise LogDamaged(run_id, int(last_seq), "the run's snapshot is unreadable") from None
    return checked_state(run_id, state, tail or (), head_seq=int(last_seq), head_hash=last_hash)


def _holder_params(holder: LeaseHolder | None) -> dict[str, Any]:
    host, boot_id, pid, pid_start, pid_ns = holder_columns(holder)
    return {"host": host, "boot_id": boot_id, "pid": pid, "pid_start": pid_start, "pid_ns": pid_ns}


def _artifact(row: Sequence[Any]) -> Artifact:
    art_id, run_id, name, size, created_at = row
    return Artifact(id=art_id, run_id=run_id, name=name, size=int(size), created_at=created_at)
