"""Executing children in this process: inline for a foreground spawn, on slots for the
background.

A child is executed by whoever claims its task, so exactly one process drives it:
this process (the parent's), or any ``keel worker`` sharing the store. The claim is
kept alive by a heartbeat while the child runs and settled from the child's end
(completed or failed), or handed back when the child stops to wait for a person.
A child whose parent already ended is cancelled instead of run.

``ChildSlots`` are daemon threads (``[agents] child_slots``, default 4) taking
background children in the order they were spawned; ``stop()`` lets each finish its
current step and hand its child back, resumable by anyone.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from keel.core.errors import KeelError, LeaseHeld, LeaseLost, TaskNotClaimable
from keel.core.state import RunState
from keel.core.status import RunStatus
from keel.core.tasks import TaskStatus
from keel.runtime.heartbeat import Heartbeat
from keel.store.base import Lease

if TYPE_CHECKING:
    from keel.runtime.harness import Harness

FAILED_ENDINGS = frozenset({RunStatus.FAILED, RunStatus.BLOCKED, RunStatus.CANCELLED})
WATCH_SLICE_S = 0.5


def execute_child(
    harness: Harness,
    child_id: str,
    *,
    task_id: str | None,
    token: str | None,
    should_stop: Callable[[], bool] | None = None,
) -> RunState:
    """Drive child ``child_id`` here until it ends, waits, or is stopped — or, while
    another process holds it, watch it (taking it over if that process's claim lapses).
    Returns its state at that point."""
    store = harness.store
    while True:
        if task_id is not None and token is None:
            token = _claim(harness, task_id)
        if task_id is not None and token is not None:
            return _drive_claimed(harness, child_id, task_id, token, should_stop)
        child = store.load_run(child_id)
        if child.status.terminal or child.status is RunStatus.WAITING:
            return child
        if should_stop is not None and should_stop():
            return child
        store.wait_for_events(child_id, after=child.last_seq, timeout=WATCH_SLICE_S)


def _claim(harness: Harness, task_id: str) -> str | None:
    """Claim the child's task (a lapsed claim is taken over); None while someone holds it."""
    try:
        claimed = harness.store.claim_task(
            owner=harness.owner, lease_seconds=harness.lease_ttl, task_id=task_id
        )
    except TaskNotClaimable:
        return None
    return claimed.lease_token if claimed is not None else None


def _drive_claimed(
    harness: Harness,
    child_id: str,
    task_id: str,
    token: str,
    should_stop: Callable[[], bool] | None,
) -> RunState:
    store = harness.store
    lost = threading.Event()
    task = store.get_task(task_id)
    lease = Lease(
        subject=task_id,
        owner=harness.owner,
        token=token,
        expires_at=task.lease_expires_at or _far(),
    )

    def renew(current: Lease, ttl: float) -> Lease:
        renewed = store.heartbeat_task(
            current.subject, owner=harness.owner, token=current.token, lease_seconds=ttl
        )
        return Lease(
            subject=current.subject,
            owner=current.owner,
            token=current.token,
            expires_at=renewed.lease_expires_at or current.expires_at,
        )

    def stop() -> bool:
        return lost.is_set() or (should_stop is not None and should_stop())

    child = store.load_run(child_id)
    with Heartbeat(lease, ttl=harness.lease_ttl, renew=renew, on_lost=lambda _: lost.set()):
        if child.parent_id is not None and not child.status.terminal:
            parent = store.load_run(child.parent_id)
            if parent.status.terminal:  # the parent ended while the child waited to run
                from keel.runtime.cancel_tree import cancel_tree  # noqa: PLC0415

                cancel_tree(store, child_id, f"parent_ended:{parent.status.value}")
        try:
            child = harness.execute(child_id, should_stop=stop).state
        except LeaseHeld:
            _release(harness, task_id, token, "its run is executed elsewhere")
            return store.load_run(child_id)
        except LeaseLost:
            return store.load_run(child_id)
    if lost.is_set():
        return store.load_run(child_id)
    _settle_task(harness, task_id, token, child)
    return child


def _settle_task(harness: Harness, task_id: str, token: str, child: RunState) -> None:
    store = harness.store
    try:
        if child.status is RunStatus.COMPLETED:
            summary = (child.result or {}).get("summary") or f"run {child.run_id} completed"
            store.complete_task(task_id, owner=harness.owner, token=token, result=str(summary))
        elif child.status in FAILED_ENDINGS:
            task = store.get_task(task_id)
            if task.status is TaskStatus.IN_PROGRESS:
                reason = f"run {child.run_id} {child.status.value}: {child.reason}"
                store.fail_task(task_id, owner=harness.owner, token=token, reason=reason)
        else:
            _release(harness, task_id, token, f"run {child.run_id} stopped {child.status.value}")
    except KeelError:
        pass  # the task moved on (cancelled with its tree, or its lease lapsed)


def _release(harness: Harness, task_id: str, token: str, reason: str) -> None:
    with contextlib.suppress(KeelError):  # the claim lapsed: someone else has the task
        harness.store.release_task(task_id, owner=harness.owner, token=token, reason=reason)


def _far() -> datetime:
    return datetime.now(UTC) + timedelta(days=1)


class ChildSlots:
    """Threads that execute background children of the runs this process drives."""

    def __init__(self, harness: Harness) -> None:
        self.harness = harness
        self._queue: queue.Queue[str] = queue.Queue()
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()

    def submit(self, task_id: str) -> None:
        """Execute the child of ``task_id`` on a free slot (if nobody claims it first)."""
        if self._stop.is_set():
            return
        self._start_threads()
        self._queue.put(task_id)

    def stop(self, timeout: float = 30.0) -> None:
        """Each slot finishes its step and hands its child back; waits up to ``timeout``."""
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=timeout)

    def _start_threads(self) -> None:
        with self._lock:
            if self._threads:
                return
            count = self.harness.child_slot_count()
            for i in range(count):
                thread = threading.Thread(target=self._slot, name=f"child-slot-{i}", daemon=True)
                thread.start()
                self._threads.append(thread)

    def _slot(self) -> None:
        while not self._stop.is_set():
            try:
                task_id = self._queue.get(timeout=0.2)
            except queue.Empty:
                continue
            try:
                task = self.harness.store.get_task(task_id)
                if task.run_id is None or task.status is not TaskStatus.PENDING:
                    continue  # a worker took it, or it ended
                execute_child(
                    self.harness,
                    task.run_id,
                    task_id=task_id,
                    token=None,
                    should_stop=self._stop.is_set,
                )
            except KeelError:
                continue


__all__ = ["ChildSlots", "execute_child"]
