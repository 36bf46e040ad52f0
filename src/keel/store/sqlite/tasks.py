"""The task-graph half of the SQLite store.

Every change is one ``BEGIN IMMEDIATE`` transaction that reads the task, checks
the rule in pure code (``keel.core.tasks``), computes the event, folds it onto
the row with ``apply_task_event`` and writes row and event together: the row is
always the replay of the task's history. The database clock is read once per
transaction, so an event's ``recorded_at`` equals the row's ``updated_at``
(``keel.store.sqlite.task_transaction``).

Readiness is kept as ``open_blockers`` (blockers not completed) in the same
transactions, so finding the oldest ready task is one index lookup; a claim
re-reads the chosen task's blockers inside its transaction before taking it.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from keel.core.errors import (
    InvalidTaskTransition,
    StoreError,
    TaskNotClaimable,
    TaskNotFound,
    UsageError,
)
from keel.core.tasks import (
    Task,
    TaskEvent,
    TaskEventType,
    TaskStatus,
    cancel_data,
    check_cancel,
    claim_refusal_for_blockers,
    new_task_id,
    validate_dependencies,
    with_blockers,
)
from keel.core.text import check_storable
from keel.store.sqlite.connection import Database
from keel.store.sqlite.task_transaction import Q, TaskTransaction, task_from_row

_ID_ATTEMPTS = 16


class SQLiteTasks:
    """Task-graph methods of ``SQLiteStore`` (mixin over the shared ``_db``)."""

    _db: Database
    task_id_factory: Callable[[], str] = staticmethod(new_task_id)
    """Draws fresh task ids; a collision with an existing id is retried in the transaction."""

    # --- reads -----------------------------------------------------------------------

    def _with_blockers(self, conn: sqlite3.Connection, rows: list[Any]) -> list[Task]:
        if not rows:
            return []
        ids = [r[0] for r in rows]
        found: dict[str, dict[str, TaskStatus]] = {i: {} for i in ids}
        for task_id, blocker, status in conn.execute(
            Q["blockers_of_many"], {"ids": json.dumps(ids)}
        ):
            found[task_id][blocker] = TaskStatus(status)
        return [with_blockers(task_from_row(r, tuple(found[r[0]])), found[r[0]]) for r in rows]

    def get_task(self, task_id: str) -> Task:
        with self._db.read() as conn:
            row = conn.execute(Q["get_task"], {"id": task_id}).fetchone()
            if row is None:
                raise TaskNotFound(task_id)
            return self._with_blockers(conn, [row])[0]

    def list_tasks(self, *, status: TaskStatus | None = None, ready: bool = False) -> list[Task]:
        """Oldest first; ``ready`` keeps pending tasks whose blockers are all completed."""
        with self._db.read() as conn:
            if ready:
                rows = conn.execute(Q["list_ready_tasks"]).fetchall()
                if status is not None and status is not TaskStatus.PENDING:
                    rows = []
            elif status is not None:
                rows = conn.execute(Q["list_tasks_by_status"], {"status": status.value}).fetchall()
            else:
                rows = conn.execute(Q["list_tasks"]).fetchall()
            return self._with_blockers(conn, rows)

    def task_events(self, task_id: str) -> list[TaskEvent]:
        with self._db.read() as conn:
            rows = conn.execute(Q["task_events"], {"id": task_id}).fetchall()
            if not rows and conn.execute(Q["task_exists"], {"id": task_id}).fetchone() is None:
                raise TaskNotFound(task_id)
        return [
            TaskEvent(
                task_id=t,
                seq=seq,
                type=kind,
                actor=actor,
                recorded_at=datetime.fromtimestamp(at, UTC),
                data=json.loads(data),
            )
            for t, seq, kind, actor, at, data in rows
        ]

    # --- graph changes ---------------------------------------------------------------

    def create_task(
        self,
        subject: str,
        *,
        description: str = "",
        blocked_by: Sequence[str] = (),
        actor: str,
        idempotency_key: str | None = None,
        options: dict[str, object] | None = None,
    ) -> Task:
        """Create a pending task with its ``task_created`` event.

        With an ``idempotency_key`` used before (even by a task completed since), the
        existing task is returned unchanged and nothing is written.
        """
        if not subject.strip():
            raise UsageError("a task needs a non-empty subject")
        check_storable("the task's subject", subject)
        check_storable("the task's description", description)
        try:
            json.dumps(options or {})
        except (TypeError, ValueError) as exc:
            raise UsageError(f"task options must be JSON: {exc}") from exc
        with self._db.write() as conn:
            tx = TaskTransaction(conn)
            if idempotency_key is not None:
                row = conn.execute(Q["task_id_by_key"], {"key": idempotency_key}).fetchone()
                if row is not None:
                    task, blockers = tx.load(row[0])
                    return with_blockers(task, blockers)
            task_id = self._fresh_id(tx)
            new = validate_dependencies(
                task_id, blocked_by, existing=tx.existing, blockers_of=tx.blocker_ids
            )
            statuses = self._statuses(conn, new)
            task = tx.append(
                None,
                TaskEventType.CREATED,
                actor=actor,
                task_id=task_id,
                open_blockers=sum(s is not TaskStatus.COMPLETED for s in statuses.values()),
                data={
                    "subject": subject,
                    "description": description,
                    "blocked_by": list(new),
                    "options": dict(options or {}),
                    "idempotency_key": idempotency_key,
                },
            )
            self._insert_dependencies(conn, task_id, new)
            return with_blockers(task, statuses)

    def add_dependencies(self, task_id: str, blocked_by: Sequence[str], *, actor: str) -> Task:
        """Only on a pending task; validation happens before anything is written.

        Blockers it already has are ignored; with nothing new, nothing is recorded.
        """
        with self._db.write() as conn:
            tx = TaskTransaction(conn)
            task, blockers = tx.load(task_id)
            if task.status is not TaskStatus.PENDING:
                raise InvalidTaskTransition(
                    task_id,
                    task.status.value,
                    "only a pending, unclaimed task can gain blockers",
                )
            new = validate_dependencies(
                task_id,
                blocked_by,
                existing=tx.existing,
                blockers_of=tx.blocker_ids,
                current=blockers,
            )
            if not new:
                return with_blockers(task, blockers)
            added = self._statuses(conn, new)
            task = tx.append(
                task,
                TaskEventType.DEPENDENCIES_ADDED,
                actor=actor,
                data={"blocked_by": list(new)},
                open_blockers=sum(s is not TaskStatus.COMPLETED for s in added.values()),
            )
            self._insert_dependencies(conn, task_id, new)
            return with_blockers(task, {**blockers, **added})

    def reopen_task(self, task_id: str, *, actor: str) -> Task:
        """Failed -> pending, unowned; the next claim is a new attempt.

        Its dependents stay blocked until it completes; the history keeps the failure.
        """
        with self._db.write() as conn:
            tx = TaskTransaction(conn)
            task, blockers = tx.load(task_id)
            if task.status is not TaskStatus.FAILED:
                raise InvalidTaskTransition(
                    task_id, task.status.value, "only a failed task can be reopened"
                )
            task = tx.append(task, TaskEventType.REOPENED, actor=actor, data={})
            return with_blockers(task, blockers)

    # --- claims and leases -----------------------------------------------------------

    def claim_task(
        self, *, owner: str, lease_seconds: float, task_id: str | None = None
    ) -> Task | None:
        """Claim ``task_id`` or the oldest claimable task, atomically.

        Claimable: pending with every blocker completed, or in progress with an expired
        lease (recorded as ``task_reclaimed`` naming the previous owner, then claimed).
        A named task that cannot be claimed raises ``TaskNotClaimable`` saying why
        (naming open blockers); with no task named, None means nothing is claimable.
        """
        if lease_seconds <= 0:
            raise UsageError(f"a lease must last a positive number of seconds, not {lease_seconds}")
        with self._db.write() as conn:
            tx = TaskTransaction(conn)
            if task_id is None:
                found = tx.oldest_claimable()
                if found is None:
                    return None
                task, blockers = found
            else:
                task, blockers = tx.load(task_id)
            self._check_claimable(task, blockers, tx.now)
            return tx.claim(task, owner=owner, lease_seconds=lease_seconds)

    def heartbeat_task(self, task_id: str, *, owner: str, token: str, lease_seconds: float) -> Task:
        """Extend the lease to ``lease_seconds`` from now; only with the current, live lease."""
        if lease_seconds <= 0:
            raise UsageError(f"a lease must last a positive number of seconds, not {lease_seconds}")
        with self._db.write() as conn:
            tx = TaskTransaction(conn)
            task, blockers = tx.load(task_id)
            tx.check_holder(task, owner=owner, token=token, action="heartbeaten")
            expires = datetime.fromtimestamp(tx.now + lease_seconds, UTC)
            task = tx.append(
                task,
                TaskEventType.HEARTBEAT,
                actor=owner,
                data={"lease_expires_at": expires.isoformat()},
            )
            return with_blockers(task, blockers)

    def complete_task(
        self, task_id: str, *, owner: str, token: str | None = None, result: str | None = None
    ) -> list[Task]:
        """Complete an owned task; return exactly the tasks that became ready by it."""
        with self._db.write() as conn:
            tx = TaskTransaction(conn)
            task, _ = tx.load(task_id)
            tx.check_holder(task, owner=owner, token=token, action="completed")
            tx.append(task, TaskEventType.COMPLETED, actor=owner, data={"result": result})
            unblocked = conn.execute(Q["unblock_dependents"], {"id": task_id}).fetchall()
            ready = [
                i for i, status, still_open in unblocked if status == "pending" and not still_open
            ]
            if not ready:
                return []
            rows = conn.execute(Q["tasks_by_ids"], {"ids": json.dumps(ready)}).fetchall()
            return self._with_blockers(conn, rows)

    def fail_task(self, task_id: str, *, owner: str, reason: str, token: str | None = None) -> Task:
        """Fail an owned task; its dependents stay blocked and name it until it is reopened."""
        if not reason.strip():
            raise UsageError("failing a task needs a reason")
        with self._db.write() as conn:
            tx = TaskTransaction(conn)
            task, blockers = tx.load(task_id)
            tx.check_holder(task, owner=owner, token=token, action="failed")
            task = tx.append(task, TaskEventType.FAILED, actor=owner, data={"reason": reason})
            return with_blockers(task, blockers)

    def release_task(
        self, task_id: str, *, owner: str, token: str, reason: str | None = None
    ) -> Task:
        """Give a claimed task back to pending (same attempt count) for someone else;
        ``reason`` goes into its history."""
        data = {"reason": reason} if reason else {}
        with self._db.write() as conn:
            tx = TaskTransaction(conn)
            task, blockers = tx.load(task_id)
            tx.check_holder(task, owner=owner, token=token, action="released")
            task = tx.append(task, TaskEventType.RELEASED, actor=owner, data=data)
            return with_blockers(task, blockers)

    def cancel_task(self, task_id: str, *, actor: str, reason: str) -> Task:
        """Withdraw a task for good (``check_cancel`` says who may); nothing changes
        for its dependents' counts: a cancelled blocker stays open forever."""
        with self._db.write() as conn:
            tx = TaskTransaction(conn)
            task, blockers = tx.load(task_id)
            expires = task.lease_expires_at
            live = expires is not None and expires.timestamp() > tx.now
            check_cancel(task, actor=actor, reason=reason, lease_live=live)
            data = cancel_data(task, reason)
            task = tx.append(task, TaskEventType.CANCELLED, actor=actor, data=data)
            return with_blockers(task, blockers)

    def tasks_held_by(self, owner: str) -> list[Task]:
        """The in-progress tasks ``owner`` claimed, oldest first (lapsed leases too)."""
        with self._db.read() as conn:
            rows = conn.execute(Q["tasks_held_by"], {"owner": owner}).fetchall()
            return self._with_blockers(conn, rows)

    def link_task_run(self, task_id: str, run_id: str, *, owner: str, token: str) -> Task:
        """Record the run executing the task; fenced by the lease like every holder write."""
        with self._db.write() as conn:
            tx = TaskTransaction(conn)
            task, blockers = tx.load(task_id)
            tx.check_holder(task, owner=owner, token=token, action="linked to a run")
            task = tx.append(task, TaskEventType.RUN_LINKED, actor=owner, data={"run_id": run_id})
            return with_blockers(task, blockers)

    # --- inside a transaction --------------------------------------------------------

    def _fresh_id(self, tx: TaskTransaction) -> str:
        for _ in range(_ID_ATTEMPTS):
            candidate = self.task_id_factory()
            if not tx.id_taken(candidate):
                return candidate
        raise StoreError(
            f"{self._db.path}: {_ID_ATTEMPTS} fresh task ids in a row were already taken; "
            "the id source is broken, nothing was written"
        )

    @staticmethod
    def _statuses(conn: sqlite3.Connection, ids: Iterable[str]) -> dict[str, TaskStatus]:
        wanted = list(ids)
        if not wanted:
            return {}
        rows = conn.execute(Q["statuses_of"], {"ids": json.dumps(wanted)}).fetchall()
        found = dict(rows)
        return {i: TaskStatus(found[i]) for i in wanted}

    @staticmethod
    def _insert_dependencies(
        conn: sqlite3.Connection, task_id: str, blockers: Iterable[str]
    ) -> None:
        for blocker in blockers:
            conn.execute(Q["insert_dependency"], {"task_id": task_id, "blocker_id": blocker})

    @staticmethod
    def _check_claimable(task: Task, blockers: dict[str, TaskStatus], now: float) -> None:
        if task.status is TaskStatus.IN_PROGRESS:
            expires = task.lease_expires_at
            if expires is not None and expires.timestamp() > now:
                raise TaskNotClaimable(
                    task.id, f"{task.owner} holds it until {expires.isoformat()}"
                )
            return
        if task.status is TaskStatus.FAILED:
            raise TaskNotClaimable(task.id, "it failed; reopen it first (`keel tasks reopen`)")
        if task.status is not TaskStatus.PENDING:
            raise TaskNotClaimable(task.id, f"it is {task.status.value}")
        refusal = claim_refusal_for_blockers(task.id, blockers)
        if refusal is not None:
            raise TaskNotClaimable(task.id, refusal)
