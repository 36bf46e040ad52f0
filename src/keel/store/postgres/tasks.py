"""The task-graph half of the PostgreSQL store.

Every holder write (claim, heartbeat, complete, fail, release, link) and reopen is
one statement in ``tasks.sql`` that checks the rule in its ``WHERE`` (status,
owner, token, ``lease_expires_at > now()``), changes the row and appends the
task's next event at one database time. When it returns no row nothing changed,
and the task is read to say why with the same words as SQLite (``LeaseLost``,
``NotOwner``, ``InvalidTaskTransition``, ``TaskNotClaimable``). The row stays the
replay of the history because each statement sets exactly what
``apply_task_event`` does for its event (the conformance suite replays them).

Graph changes (create with blockers, add dependencies) run in one transaction
that share-locks the blockers it counts, so a concurrent completion cannot be
missed by ``open_blockers``; dependency additions also take an advisory lock so
two of them cannot close a cycle together.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final

import psycopg

from keel.core.errors import (
    InvalidTaskTransition,
    StoreCorrupt,
    StoreError,
    TaskNotClaimable,
    TaskNotFound,
    UsageError,
)
from keel.core.tasks import (
    Task,
    TaskEvent,
    TaskStatus,
    check_cancel,
    check_cancel_reason,
    check_holder,
    claim_refusal_for_blockers,
    new_task_id,
    validate_dependencies,
    with_blockers,
)
from keel.core.text import check_storable
from keel.store.postgres.connection import Database
from keel.store.sql import load_queries

Q = load_queries("keel.store.postgres", "tasks.sql")
# A claim is one statement: a picker (which row) followed by the shared rest of a claim.
CLAIM_NEXT = Q["claim_pick_next"] + "\n" + Q["claim_apply"]
CLAIM_BY_ID = Q["claim_pick_by_id"] + "\n" + Q["claim_apply"]
_ID_ATTEMPTS: Final = 16
_RACE_RETRIES: Final = 5
_WAITING_RUN: Final = "waiting"


def _task(row: Sequence[Any], statuses: Sequence[str] | None = None) -> Task:
    """A task from its row; ``statuses`` of its blockers (None: all completed, as they
    are for any task that was ever claimed)."""
    (id_, subject, description, status, owner, token, expires, attempt, result, run_id) = row[:10]
    options, key, created, updated, version, blocked_by = row[10:16]
    task = Task(
        id=id_,
        subject=subject,
        description=description,
        status=TaskStatus(status),
        owner=owner,
        blocked_by=tuple(blocked_by),
        lease_token=token,
        lease_expires_at=expires,
        attempt=attempt,
        result=result,
        run_id=run_id,
        options=options,
        idempotency_key=key,
        created_at=created,
        updated_at=updated,
        version=version,
    )
    if not blocked_by:
        return task
    if statuses is None:
        statuses = [TaskStatus.COMPLETED.value] * len(blocked_by)
    return with_blockers(task, dict(zip(blocked_by, map(TaskStatus, statuses), strict=True)))


class PostgresTasks:
    """Task-graph methods of ``PostgresStore`` (mixin over the shared ``_db``)."""

    _db: Database
    task_id_factory: Callable[[], str] = staticmethod(new_task_id)
    """Draws fresh task ids; a collision with an existing id draws again."""

    # --- reads -----------------------------------------------------------------------

    def _read(self, task_id: str) -> tuple[Task, dict[str, TaskStatus], str | None, bool]:
        """The task with its blockers' statuses, its run's status and whether its lease
        is live (database clock)."""
        with self._db.connection() as conn:
            row = conn.execute(Q["get_task"], {"id": task_id}).fetchone()
        if row is None:
            raise TaskNotFound(task_id)
        statuses = {b: TaskStatus(s) for b, s in zip(row[15], row[16], strict=True)}
        return _task(row, row[16]), statuses, row[17], bool(row[18])

    def get_task(self, task_id: str) -> Task:
        return self._read(task_id)[0]

    def list_tasks(self, *, status: TaskStatus | None = None, ready: bool = False) -> list[Task]:
        """Oldest first; ``ready`` keeps pending tasks whose blockers are all completed."""
        if ready and status is not None and status is not TaskStatus.PENDING:
            return []
        with self._db.connection() as conn:
            if ready:
                rows = conn.execute(Q["list_ready_tasks"]).fetchall()
            elif status is not None:
                rows = conn.execute(Q["list_tasks_by_status"], {"status": status.value}).fetchall()
            else:
                rows = conn.execute(Q["list_tasks"]).fetchall()
        return [_task(row, row[16]) for row in rows]

    def task_events(self, task_id: str) -> list[TaskEvent]:
        with self._db.connection() as conn:
            rows = conn.execute(Q["task_events"], {"id": task_id}).fetchall()
            if not rows and conn.execute(Q["task_exists"], {"id": task_id}).fetchone() is None:
                raise TaskNotFound(task_id)
        return [
            TaskEvent(task_id=t, seq=seq, type=kind, actor=actor, recorded_at=at, data=data)
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
            options_text = json.dumps(options or {}, separators=(",", ":"), ensure_ascii=False)
        except (TypeError, ValueError) as exc:
            raise UsageError(f"task options must be JSON: {exc}") from exc
        for _ in range(_ID_ATTEMPTS):
            if idempotency_key is not None:
                found = self._task_by_key(idempotency_key)
                if found is not None:
                    return found
            task_id = self.task_id_factory()
            created = self._insert_task(
                task_id,
                subject=subject,
                description=description,
                blocked_by=blocked_by,
                actor=actor,
                key=idempotency_key,
                options=options_text,
            )
            if created is not None:
                return created
            # No row: a used idempotency key (found above next time) or an id collision.
        raise StoreCorrupt(self._db.location, f"{_ID_ATTEMPTS} fresh task ids all collided")

    def _task_by_key(self, key: str) -> Task | None:
        with self._db.connection() as conn:
            row = conn.execute(Q["task_id_by_key"], {"key": key}).fetchone()
        return self.get_task(row[0]) if row is not None else None

    def _insert_task(
        self,
        task_id: str,
        *,
        subject: str,
        description: str,
        blocked_by: Sequence[str],
        actor: str,
        key: str | None,
        options: str,
    ) -> Task | None:
        params: dict[str, Any] = {
            "id": task_id,
            "subject": subject,
            "description": description,
            "options": options,
            "key": key,
            "actor": actor,
        }
        if not blocked_by:
            params.update(blocked_by=[], open_blockers=0, data=_created_data(params, ()))
            with self._db.connection() as conn, conn.pipeline():
                created = conn.execute(Q["create_task"], params)
                conn.execute(Q["notify_work"])
                row = created.fetchone()
            return _task(row) if row is not None else None
        with self._db.transaction() as conn:
            locked = dict(conn.execute(Q["lock_blockers"], {"ids": list(blocked_by)}).fetchall())
            new = validate_dependencies(
                task_id,
                blocked_by,
                existing=lambda ids: {i for i in ids if i in locked},
                blockers_of=lambda _node: (),  # a new task has no dependents: no cycle
            )
            statuses = [locked[b] for b in new]
            params.update(
                blocked_by=list(new),
                open_blockers=sum(s != TaskStatus.COMPLETED.value for s in statuses),
                data=_created_data(params, new),
            )
            row = conn.execute(Q["create_task"], params).fetchone()
        if row is None:
            return None
        if not any(s != TaskStatus.COMPLETED.value for s in statuses):
            with self._db.connection() as conn:
                conn.execute(Q["notify_work"])
        return _task(row, statuses)

    def add_dependencies(self, task_id: str, blocked_by: Sequence[str], *, actor: str) -> Task:
        """Only on a pending task; validation happens before anything is written.

        Blockers it already has are ignored; with nothing new, nothing is recorded.
        """
        with self._db.transaction() as conn:
            conn.execute(Q["graph_lock"])
            row = conn.execute(Q["lock_task"], {"id": task_id}).fetchone()
            if row is None:
                raise TaskNotFound(task_id)
            current = list(row[15])
            statuses = self._blocker_statuses(conn, current)
            task = _task(row, statuses)
            if task.status is not TaskStatus.PENDING:
                raise InvalidTaskTransition(
                    task_id, task.status.value, "only a pending, unclaimed task can gain blockers"
                )
            new = validate_dependencies(
                task_id,
                blocked_by,
                existing=lambda ids: self._existing(conn, ids),
                blockers_of=lambda node: self._blockers_of(conn, node),
                current=current,
            )
            if not new:
                return task
            locked = dict(conn.execute(Q["lock_blockers"], {"ids": list(new)}).fetchall())
            added = [locked[b] for b in new]
            row = conn.execute(
                Q["add_dependencies"],
                {
                    "id": task_id,
                    "version": task.version,
                    "blocked_by": list(new),
                    "open_added": sum(s != TaskStatus.COMPLETED.value for s in added),
                    "actor": actor,
                },
            ).fetchone()
            if row is None:
                raise StoreCorrupt(task_id, "task row moved under a locked write")
            return _task(row, [*statuses, *added])

    @staticmethod
    def _blocker_statuses(conn: psycopg.Connection[Any], ids: list[str]) -> list[str]:
        if not ids:
            return []
        found = dict(conn.execute(Q["lock_blockers"], {"ids": ids}).fetchall())
        return [found[i] for i in ids]

    @staticmethod
    def _existing(conn: psycopg.Connection[Any], ids: Sequence[str]) -> set[str]:
        rows = conn.execute(Q["existing_ids"], {"ids": list(ids)})
        return {r[0] for r in rows}

    @staticmethod
    def _blockers_of(conn: psycopg.Connection[Any], task_id: str) -> list[str]:
        row = conn.execute(Q["blockers_of"], {"id": task_id}).fetchone()
        return list(row[0]) if row is not None else []

    def reopen_task(self, task_id: str, *, actor: str) -> Task:
        """Failed -> pending, unowned; the next claim is a new attempt.

        Its dependents stay blocked until it completes; the history keeps the failure.
        """
        row = self._write("reopen_task", {"id": task_id, "actor": actor})
        if row is not None:
            return _task(row)
        task = self.get_task(task_id)
        raise InvalidTaskTransition(
            task_id, task.status.value, "only a failed task can be reopened"
        )

    # --- claims and leases -----------------------------------------------------------

    def claim_task(
        self, *, owner: str, lease_seconds: float, task_id: str | None = None
    ) -> Task | None:
        """Claim ``task_id`` or the oldest claimable task in one statement.

        Claimable: pending with every blocker completed (and not linked to a run that
        is waiting for a person), or in progress with an expired lease (recorded as
        ``task_reclaimed`` naming the previous owner, then claimed). A named task that
        cannot be claimed raises ``TaskNotClaimable`` saying why.
        """
        if lease_seconds <= 0:
            raise UsageError(f"a lease must last a positive number of seconds, not {lease_seconds}")
        params = {"owner": owner, "token": uuid.uuid4().hex, "lease": lease_seconds}
        if task_id is None:
            row = self._write_sql(CLAIM_NEXT, params)
            return _task(row) if row is not None else None
        for _ in range(_RACE_RETRIES):
            row = self._write_sql(CLAIM_BY_ID, {**params, "id": task_id})
            if row is not None:
                return _task(row)
            self._why_not_claimable(task_id)
        raise StoreError(f"task {task_id}: the claim kept racing with other writers; retry")

    def _why_not_claimable(self, task_id: str) -> None:
        task, blockers, run_status, lease_live = self._read(task_id)
        if task.status is TaskStatus.IN_PROGRESS:
            if lease_live:
                expires = task.lease_expires_at.isoformat() if task.lease_expires_at else "?"
                raise TaskNotClaimable(task.id, f"{task.owner} holds it until {expires}")
            return
        if task.status is TaskStatus.FAILED:
            raise TaskNotClaimable(task.id, "it failed; reopen it first (`keel tasks reopen`)")
        if task.status is not TaskStatus.PENDING:
            raise TaskNotClaimable(task.id, f"it is {task.status.value}")
        refusal = claim_refusal_for_blockers(task.id, blockers)
        if refusal is not None:
            raise TaskNotClaimable(task.id, refusal)
        if run_status == _WAITING_RUN:
            raise TaskNotClaimable(
                task.id,
                f"its run {task.run_id} is waiting for a person; answer it "
                f"(`keel show {task.run_id}` says how)",
            )

    def heartbeat_task(self, task_id: str, *, owner: str, token: str, lease_seconds: float) -> Task:
        """Extend the lease to ``lease_seconds`` from now; only with the current, live lease."""
        if lease_seconds <= 0:
            raise UsageError(f"a lease must last a positive number of seconds, not {lease_seconds}")
        params = {"id": task_id, "owner": owner, "token": token, "lease": lease_seconds}
        return self._holder_write("heartbeat_task", params, "heartbeaten")

    def complete_task(
        self, task_id: str, *, owner: str, token: str | None = None, result: str | None = None
    ) -> list[Task]:
        """Complete an owned task; return exactly the tasks that became ready by it."""
        params = {"id": task_id, "owner": owner, "token": token, "result": result}
        for _ in range(_RACE_RETRIES):
            rows = self._db.run(lambda conn: conn.execute(Q["complete_task"], params).fetchall())
            if rows:
                return [_task(row) for row in rows[1:]]
            self._refuse_holder(task_id, owner, token, "completed")
        raise StoreError(f"task {task_id}: the write kept racing with other writers; retry")

    def fail_task(self, task_id: str, *, owner: str, reason: str, token: str | None = None) -> Task:
        """Fail an owned task; its dependents stay blocked and name it until it is reopened."""
        if not reason.strip():
            raise UsageError("failing a task needs a reason")
        params = {"id": task_id, "owner": owner, "token": token, "reason": reason}
        return self._holder_write("fail_task", params, "failed")

    def release_task(
        self, task_id: str, *, owner: str, token: str, reason: str | None = None
    ) -> Task:
        """Give a claimed task back to pending (same attempt count) for someone else;
        ``reason`` goes into its history."""
        params = {"id": task_id, "owner": owner, "token": token, "reason": reason or None}
        return self._holder_write("release_task", params, "released")

    def cancel_task(self, task_id: str, *, actor: str, reason: str) -> Task:
        """Withdraw a task for good in one statement that checks ``check_cancel``'s rule;
        when it refuses, the task is read and ``check_cancel`` says why."""
        check_cancel_reason(reason)
        params = {"id": task_id, "actor": actor, "reason": reason}
        for _ in range(_RACE_RETRIES):
            row = self._write("cancel_task", params)
            if row is not None:
                return _task(row, row[16])
            task, _, _, lease_live = self._read(task_id)
            check_cancel(task, actor=actor, reason=reason, lease_live=lease_live)
        raise StoreError(f"task {task_id}: the cancellation kept racing with other writers; retry")

    def tasks_held_by(self, owner: str) -> list[Task]:
        """The in-progress tasks ``owner`` claimed, oldest first (lapsed leases too)."""
        with self._db.connection() as conn:
            rows = conn.execute(Q["tasks_held_by"], {"owner": owner}).fetchall()
        return [_task(row, row[16]) for row in rows]

    def link_task_run(self, task_id: str, run_id: str, *, owner: str, token: str) -> Task:
        """Record the run executing the task; fenced by the lease like every holder write."""
        params = {"id": task_id, "owner": owner, "token": token, "run_id": run_id}
        return self._holder_write("link_task_run", params, "linked to a run")

    # --- writing ---------------------------------------------------------------------

    def _write(self, query: str, params: Mapping[str, Any]) -> Any:
        """The row of a one-statement write, or None when its checks refused it."""
        return self._write_sql(Q[query], params)

    def _write_sql(self, sql: str, params: Mapping[str, Any]) -> Any:
        return self._db.run(lambda conn: conn.execute(sql, params).fetchone())

    def _holder_write(self, query: str, params: dict[str, Any], action: str) -> Task:
        for _ in range(_RACE_RETRIES):
            row = self._write(query, params)
            if row is not None:
                return _task(row)
            self._refuse_holder(params["id"], params["owner"], params.get("token"), action)
        raise StoreError(f"task {params['id']}: the write kept racing with other writers; retry")

    def _refuse_holder(self, task_id: str, owner: str, token: str | None, action: str) -> None:
        """Raise why ``owner`` (with ``token``) may not write the task now.

        A token that is not the task's current one is ``LeaseLost`` whatever else holds;
        without a token the owner name decides. An expired lease is ``LeaseLost`` even if
        no one has reclaimed the task yet. Returns only if the write would now pass.
        """
        task, _, _, lease_live = self._read(task_id)
        check_holder(task, owner=owner, token=token, action=action, lease_live=lease_live)


def _created_data(params: Mapping[str, Any], blocked_by: Iterable[str]) -> str:
    return json.dumps(
        {
            "subject": params["subject"],
            "description": params["description"],
            "blocked_by": list(blocked_by),
            "options": json.loads(params["options"]),
            "idempotency_key": params["key"],
        },
        separators=(",", ":"),
        ensure_ascii=False,
    )
