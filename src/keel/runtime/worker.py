"""``keel worker``: execute queued runs and ready tasks from a shared store.

Each slot (a thread) loops: lease the oldest queued run (or a running one whose
lease lapsed: its owner died or let go) and drive it; else claim the oldest
ready task, start or resume its run, and settle the task from the run's end.
Leases are renewed from their own threads at a third of their length, so a slow
model call never lets a lease lapse; a slot whose lease was lost stops its run
at the next step. ``stop()`` (SIGTERM) lets every slot finish its current step,
releases its leases and returns.

Models are resolved once per spec and working directory by the harness, and their HTTP
clients are shared by every slot (``keel.models.connections``): a run costs no new
client, and a worker's connections stay warm across runs.

Task ↔ run: the run records its task (``task_id`` in ``run_created``), the task
records its run (``link_task_run``). A task whose run is waiting for a person is
handed back (``release_task``); once the person answered, the run is picked up
as a lapsed run and its task is settled by whoever finishes it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from keel.core.budget import Budget
from keel.core.errors import ConfigError, KeelError, LeaseHeld, LeaseLost
from keel.core.events import EventType, NewEvent
from keel.core.state import RunState, transition
from keel.core.status import RunStatus
from keel.core.tasks import Task, TaskStatus
from keel.runtime.harness import Harness, RunOutcome
from keel.runtime.heartbeat import Heartbeat
from keel.runtime.takeover import this_holder
from keel.runtime.task_claims import release_claims_of_ended_run
from keel.store.base import Lease

FAILED_ENDINGS = frozenset({RunStatus.FAILED, RunStatus.BLOCKED, RunStatus.CANCELLED})


@dataclass(slots=True, kw_only=True)
class WorkerStats:
    runs: int = 0
    tasks_completed: int = 0
    tasks_failed: int = 0
    errors: list[str] = field(default_factory=list)


class Worker:
    """Runs ``concurrency`` slots against ``harness.store`` until stopped."""

    def __init__(
        self,
        harness: Harness,
        *,
        concurrency: int = 1,
        poll_interval: float = 1.0,
        default_cwd: Path | None = None,
        log: Callable[[str], None] | None = None,
    ) -> None:
        self.harness = harness
        self.store = harness.store
        self.owner = harness.owner  # name/incarnation: never adopts a predecessor's leases
        self.concurrency = concurrency
        self.poll_interval = poll_interval
        self.default_cwd = (default_cwd or Path.cwd()).resolve()
        self.stats = WorkerStats()
        self._stop = threading.Event()
        self._log = log or (lambda _message: None)
        self._lock = threading.Lock()

    # --- control -------------------------------------------------------------------------

    def stop(self) -> None:
        """Finish current steps, release leases, return from ``run``."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def run(self, *, until_idle: bool = False) -> WorkerStats:
        """Run the slots; with ``until_idle`` return once no work is left."""
        slots = [
            threading.Thread(target=self._slot, args=(until_idle,), name=f"slot-{i}")
            for i in range(self.concurrency)
        ]
        for slot in slots:
            slot.start()
        for slot in slots:
            while slot.is_alive():
                slot.join(timeout=0.2)
        return self.stats

    def _slot(self, until_idle: bool) -> None:
        while not self.stopping:
            try:
                worked = self.work_once()
            except KeelError as exc:
                self._note_error(f"{type(exc).__name__}: {exc}")
                worked = True
            if worked:
                continue
            if until_idle:
                return
            self.store.wait_for_work(self.poll_interval)

    def _note_error(self, message: str) -> None:
        with self._lock:
            self.stats.errors.append(message)
        self._log(message)

    # --- one unit of work ----------------------------------------------------------------

    def work_once(self) -> bool:
        """Do one queued run or one ready task; False when there was none."""
        claimed = self.store.claim_next_run(
            owner=self.owner, ttl=self.harness.lease_ttl, holder=this_holder()
        )
        if claimed is not None:
            state, lease = claimed
            self._execute_run(state, lease)
            return True
        task = self.store.claim_task(owner=self.owner, lease_seconds=self.harness.lease_ttl)
        if task is not None:
            self._execute_task(task)
            return True
        return False

    def _execute_run(self, state: RunState, lease: Lease) -> None:
        self._log(f"run {state.run_id}: executing ({state.status.value})")
        try:
            outcome = self.harness.execute(state.run_id, lease=lease, should_stop=self._should_stop)
        except LeaseLost as exc:
            self._note_error(f"run {state.run_id}: {exc}")
            return
        except ConfigError as exc:
            # Left alone, the run would be claimed again at once, forever.
            self._fail_unrunnable(state.run_id, f"config_error: {exc}", lease)
            return
        with self._lock:
            self.stats.runs += 1
        self._log(f"run {state.run_id}: {outcome.status.value}")
        if outcome.state.task_id and outcome.status.terminal:
            self._settle_orphan_task(outcome.state)

    def _should_stop(self) -> bool:
        return self.stopping

    def _execute_task(self, task: Task) -> None:
        self._log(f"task {task.id}: claimed (attempt {task.attempt})")
        assert task.lease_token is not None and task.lease_expires_at is not None
        token = task.lease_token
        lost = threading.Event()
        task_lease = Lease(
            subject=task.id, owner=self.owner, token=token, expires_at=task.lease_expires_at
        )

        def renew(current: Lease, ttl: float) -> Lease:
            renewed = self.store.heartbeat_task(
                current.subject, owner=self.owner, token=current.token, lease_seconds=ttl
            )
            return Lease(
                subject=current.subject,
                owner=current.owner,
                token=current.token,
                expires_at=renewed.lease_expires_at or current.expires_at,
            )

        heartbeat = Heartbeat(
            task_lease, ttl=self.harness.lease_ttl, renew=renew, on_lost=lambda _: lost.set()
        )
        with heartbeat:
            try:
                run_id = self._run_for(task, token)
            except ConfigError as exc:
                # No run can be made for it here (no model, a cost budget without a
                # price): left claimed, the task would be claimed again, forever.
                self._fail_uncreatable(task, token, f"config_error: {exc}")
                return
            if run_id is None:
                return
            try:
                outcome = self.harness.execute(
                    run_id, should_stop=lambda: self.stopping or lost.is_set()
                )
            except ConfigError as exc:
                outcome = RunOutcome(
                    state=self._fail_unrunnable(run_id, f"config_error: {exc}", None)
                )
            except LeaseHeld as exc:
                self._log(f"task {task.id}: its run is executed elsewhere ({exc})")
                self._release(task, token, f"its run {run_id} is executed elsewhere")
                return
            except LeaseLost as exc:
                self._note_error(f"task {task.id}: {exc}")
                return
        if lost.is_set():
            self._note_error(f"task {task.id}: lease lost; left to its new owner")
            return
        self._settle(task, token, outcome.state)

    def _fail_unrunnable(self, run_id: str, reason: str, lease: Lease | None) -> RunState:
        """End a run this worker cannot drive (no model, missing key): failed, with why."""
        self._note_error(f"run {run_id}: {reason}")
        state = self.store.load_run(run_id)
        if not state.status.terminal:
            events = []
            if state.status is RunStatus.QUEUED:
                events.append(transition(state, RunStatus.RUNNING, None))
            events.append(
                NewEvent(
                    type=EventType.STATUS_CHANGED,
                    data={
                        "to": RunStatus.FAILED.value,
                        "reason": reason,
                        "result": {"unfinished": state.unfinished_todos()},
                    },
                )
            )
            state, _ = self.store.append_events(
                run_id,
                events,
                expected_seq=state.last_seq,
                lease_token=lease.token if lease else None,
            )
            release_claims_of_ended_run(self.store, state)
        if lease is not None:
            self.store.release_run_lease(lease)
        return state

    def _fail_uncreatable(self, task: Task, token: str, reason: str) -> None:
        self._note_error(f"task {task.id}: {reason}")
        self.store.fail_task(task.id, owner=self.owner, token=token, reason=reason)
        with self._lock:
            self.stats.tasks_failed += 1

    def _run_for(self, task: Task, token: str) -> str | None:
        """The task's run: the linked one (resumed), or a new one inheriting its options."""
        if task.run_id:
            state = self.store.load_run(task.run_id)
            if state.status.terminal:
                self._settle(task, token, state)
                return None
            return task.run_id
        options: dict[str, Any] = dict(task.options or {})
        goal = task.subject if not task.description else f"{task.subject}\n\n{task.description}"
        budget = options.get("budget")
        state = self.harness.create(
            goal,
            cwd=options.get("cwd") or self.default_cwd,
            budget=Budget.from_dict(budget) if isinstance(budget, dict) else None,
            verify=tuple(options.get("verify") or ()),
            mode=str(options.get("mode") or "edit"),
            model=options.get("model"),
            task_id=task.id,
            idempotency_key=f"task:{task.id}:{task.attempt}",
        )
        self.store.link_task_run(task.id, state.run_id, owner=self.owner, token=token)
        return state.run_id

    def _settle(self, task: Task, token: str, state: RunState) -> None:
        """Complete or fail the task from its run's end; hand it back otherwise."""
        if state.status is RunStatus.COMPLETED:
            summary = (state.result or {}).get("summary") or f"run {state.run_id} completed"
            self.store.complete_task(task.id, owner=self.owner, token=token, result=str(summary))
            with self._lock:
                self.stats.tasks_completed += 1
            self._log(f"task {task.id}: completed by run {state.run_id}")
        elif state.status in FAILED_ENDINGS:
            reason = f"run {state.run_id} {state.status.value}: {state.reason}"
            self.store.fail_task(task.id, owner=self.owner, token=token, reason=reason)
            with self._lock:
                self.stats.tasks_failed += 1
            self._log(f"task {task.id}: failed ({reason})")
        else:
            why = f"run {state.run_id} stopped {state.status.value}; it resumes later"
            self._release(task, token, why)

    def _release(self, task: Task, token: str, reason: str) -> None:
        try:
            self.store.release_task(task.id, owner=self.owner, token=token, reason=reason)
        except KeelError as exc:
            self._note_error(f"task {task.id}: could not release: {exc}")

    def _settle_orphan_task(self, state: RunState) -> None:
        """A lapsed run finished here: settle its task if nobody holds it."""
        assert state.task_id is not None
        task = self.store.get_task(state.task_id)
        if task.status is TaskStatus.PENDING:
            claimed = self.store.claim_task(
                owner=self.owner, lease_seconds=self.harness.lease_ttl, task_id=task.id
            )
            if claimed is None or claimed.lease_token is None:
                return
            self._settle(claimed, claimed.lease_token, state)
