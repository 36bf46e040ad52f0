"""One SQLite task-graph write transaction: the row codec, the clock, fold-and-write.

``TaskTransaction`` is what every ``SQLiteTasks`` write does inside its
``BEGIN IMMEDIATE``: read the task (and the database clock, once), check the rule
in pure code, fold the new event onto the row with ``apply_task_event`` and write
row and event together, so the row is always the replay of the task's history.
"""

from __future__ import annotations

import json
import sqlite3
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from keel.core.errors import StoreCorrupt, TaskNotFound
from keel.core.tasks import (
    Task,
    TaskEvent,
    TaskEventType,
    TaskStatus,
    apply_task_event,
    check_holder,
)
from keel.store.sql import load_queries

Q = load_queries("keel.store.sqlite", "tasks.sql")


def _moment(seconds: float | None) -> datetime | None:
    return datetime.fromtimestamp(seconds, UTC) if seconds is not None else None


def _epoch(moment: datetime | None) -> float | None:
    return moment.timestamp() if moment is not None else None


def task_from_row(row: Sequence[Any], blocked_by: tuple[str, ...]) -> Task:
    (id_, subject, description, status, owner, token, expires, attempt, result, run_id) = row[:10]
    options, key, created, updated, version = row[10:15]
    return Task(
        id=id_,
        subject=subject,
        description=description,
        status=TaskStatus(status),
        owner=owner,
        blocked_by=blocked_by,
        lease_token=token,
        lease_expires_at=_moment(expires),
        attempt=attempt,
        result=result,
        run_id=run_id,
        options=json.loads(options),
        idempotency_key=key,
        created_at=_moment(created),
        updated_at=_moment(updated),
        version=version,
    )


def _row_params(task: Task) -> dict[str, Any]:
    return {
        "id": task.id,
        "subject": task.subject,
        "description": task.description,
        "status": task.status.value,
        "owner": task.owner,
        "lease_token": task.lease_token,
        "lease_expires_at": _epoch(task.lease_expires_at),
        "attempt": task.attempt,
        "result": task.result,
        "run_id": task.run_id,
        "options": json.dumps(task.options, separators=(",", ":"), ensure_ascii=False),
        "idempotency_key": task.idempotency_key,
        "created_at": _epoch(task.created_at),
        "updated_at": _epoch(task.updated_at),
        "version": task.version,
    }


class TaskTransaction:
    """One write transaction's view: the database time and the fold-and-write step.

    The clock is read by the transaction's first statement (``load_task``,
    ``claim_candidate`` or ``id_taken``) and is then the time of every event it writes.
    """

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self._now: float | None = None

    @property
    def now(self) -> float:
        if self._now is None:
            self._now = float(self.conn.execute(Q["now"]).fetchone()[0])
        return self._now

    @property
    def moment(self) -> datetime:
        return datetime.fromtimestamp(self.now, UTC)

    def blockers(self, task_id: str) -> dict[str, TaskStatus]:
        rows = self.conn.execute(Q["blockers_of"], {"id": task_id}).fetchall()
        return {b: TaskStatus(s) for b, s in rows}

    def _loaded(self, row: Sequence[Any]) -> tuple[Task, dict[str, TaskStatus]]:
        if self._now is None:
            self._now = float(row[15])
        blockers = {b: TaskStatus(s) for b, s in json.loads(row[16])}
        return task_from_row(row, tuple(blockers)), blockers

    def load(self, task_id: str) -> tuple[Task, dict[str, TaskStatus]]:
        row = self.conn.execute(Q["load_task"], {"id": task_id}).fetchone()
        if row is None:
            raise TaskNotFound(task_id)
        return self._loaded(row)

    def oldest_claimable(self) -> tuple[Task, dict[str, TaskStatus]] | None:
        row = self.conn.execute(Q["claim_candidate"]).fetchone()
        return self._loaded(row) if row is not None else None

    def id_taken(self, task_id: str) -> bool:
        now, taken = self.conn.execute(Q["id_taken"], {"id": task_id}).fetchone()
        if self._now is None:
            self._now = float(now)
        return bool(taken)

    def existing(self, ids: Sequence[str]) -> set[str]:
        rows = self.conn.execute(Q["existing_ids"], {"ids": json.dumps(list(ids))}).fetchall()
        return {r[0] for r in rows}

    def blocker_ids(self, task_id: str) -> list[str]:
        return list(self.blockers(task_id))

    def append(
        self,
        task: Task | None,
        kind: TaskEventType,
        *,
        actor: str,
        data: dict[str, Any],
        task_id: str | None = None,
        open_blockers: int = 0,
    ) -> Task:
        """Fold one event onto ``task`` and write the new row and the event together."""
        subject_id = task.id if task is not None else task_id
        assert subject_id is not None
        seq = (task.version if task is not None else 0) + 1
        event = TaskEvent(
            task_id=subject_id,
            seq=seq,
            type=kind.value,
            actor=actor,
            recorded_at=self.moment,
            data=data,
        )
        new = apply_task_event(task, event)
        params = _row_params(new)
        if task is None:
            self.conn.execute(Q["insert_task"], {**params, "open_blockers": open_blockers})
        else:
            cursor = self.conn.execute(
                Q["update_task"], {**params, "blockers_added": open_blockers}
            )
            if cursor.rowcount != 1:
                raise StoreCorrupt(str(subject_id), f"task row moved under a write (seq {seq})")
        self.conn.execute(
            Q["insert_event"],
            {
                "task_id": subject_id,
                "seq": seq,
                "type": kind.value,
                "actor": actor,
                "recorded_at": self.now,
                "data": json.dumps(data, separators=(",", ":"), ensure_ascii=False),
            },
        )
        return new

    def check_holder(self, task: Task, *, owner: str, token: str | None, action: str) -> None:
        """Refuse a write by anyone but the current, unexpired lease holder.

        A token that is not the task's current one is ``LeaseLost`` whatever else holds;
        without a token the owner name decides (a person claiming in one command and
        completing in the next). An expired lease is ``LeaseLost`` even if no one has
        reclaimed the task yet.
        """
        expires = task.lease_expires_at
        lease_live = expires is None or expires.timestamp() > self.now
        check_holder(task, owner=owner, token=token, action=action, lease_live=lease_live)

    def claim(self, task: Task, *, owner: str, lease_seconds: float) -> Task:
        if task.status is TaskStatus.IN_PROGRESS:  # expired: the claim reclaims it
            task = self.append(
                task,
                TaskEventType.RECLAIMED,
                actor=owner,
                data={
                    "previous_owner": task.owner,
                    "previous_token": task.lease_token,
                    "lease_expired_at": task.lease_expires_at.isoformat()
                    if task.lease_expires_at
                    else None,
                },
            )
        expires = datetime.fromtimestamp(self.now + lease_seconds, UTC)
        return self.append(
            task,
            TaskEventType.CLAIMED,
            actor=owner,
            data={
                "owner": owner,
                "token": uuid.uuid4().hex,
                "attempt": task.attempt + 1,
                "lease_expires_at": expires.isoformat(),
            },
        )
