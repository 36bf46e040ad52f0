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

Workspaces: a task whose options say ``"workspace": "isolated"`` gets its run its own
isolated workspace (``keel.runtime.worktrees``: a git worktree of the task's ``cwd``
at its current state, or a copy), named ``task-<task id>-<attempt>``. When the run
ends, its changes are stored as the run's artifact ``patch-<run id>.diff``, named in
the task's result (``patch: art_…``), and the workspace is removed; ``keel gc``
removes what a crash left. Every other run (a child with its own isolated workspace
aside) holds its workspace's lock (``keel.runtime.workspace_lock``) while it is
driven, so two runs never write one directory at once; a run of the holder's tree
shares it. A slot waiting for the lock keeps its lease alive and gives up when the
worker stops.
"""

from __future__ import annotations

import shutil
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
from keel.policy.rules import POLICY_FILE
from keel.runtime import worktrees
from keel.runtime.config import CONFIG_FILE
from keel.runtime.harness import Harness, RunOutcome
from keel.runtime.heartbeat import Heartbeat
from keel.runtime.takeover import this_holder
from keel.runtime.task_claims import release_claims_of_ended_run
from keel.runtime.workspace_lock import WorkspaceLock
from keel.store.base import Lease

FAILED_ENDINGS = frozenset({RunStatus.FAILED, RunStatus.BLOCKED, RunStatus.CANCELLED})
ISOLATED = "isolated"  # a task option "workspace" asking for an isolated workspace


def isolated_task(task: Task) -> bool:
    """True when the task asks that its run work in an isolated workspace of its own."""
    return (task.options or {}).get("workspace") == ISOLATED


def isolated_name(task: Task) -> str:
    """The name of the isolated workspace of the task's current attempt."""
    return f"task-{task.id}-{task.attempt}"


def patch_artifact_name(run_id: str) -> str:
    return f"patch-{run_id}.diff"


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
        lock = self._workspace_lock(state)
        if lock is not None:
            held = self._lock_keeping_lease(lock, lease, state.run_id)
            if held is None:
                return
            lease = held
        try:
            outcome = self.harness.execute(state.run_id, lease=lease, should_stop=self._should_stop)
        except LeaseLost as exc:
            self._note_error(f"run {state.run_id}: {exc}")
            return
        except ConfigError as exc:
            # Left alone, the run would be claimed again at once, forever.
            self._fail_unrunnable(state.run_id, f"config_error: {exc}", lease)
            return
        finally:
            if lock is not None:
                lock.release()
        with self._lock:
            self.stats.runs += 1
        self._log(f"run {state.run_id}: {outcome.status.value}")
        if outcome.state.task_id and outcome.status.terminal:
            self._settle_orphan_task(outcome.state)

    def _should_stop(self) -> bool:
        return self.stopping

    # --- workspaces ----------------------------------------------------------------------

    def _workspace_lock(self, state: RunState) -> WorkspaceLock | None:
        """The lock ``state``'s run must hold while driven; None for a run that works in an
        isolated workspace of its own (a task's, or a child's)."""
        options = state.options
        kind = getattr(options, "workspace_kind", None)
        if getattr(options, "isolated", None) or kind == ISOLATED:
            return None
        if state.task_id is not None and isolated_task(self.store.get_task(state.task_id)):
            return None
        root = getattr(options, "root_id", None) or state.run_id
        return WorkspaceLock(Path(state.workspace), root_id=str(root))

    def _lock_keeping_lease(self, lock: WorkspaceLock, lease: Lease, run_id: str) -> Lease | None:
        """Wait for ``lock`` while renewing the run's lease: the lease to drive with, or None
        (the worker stops, or the lease was lost: then nothing is held)."""
        if lock.acquire(should_stop=lambda: True):  # free (or ours to share): no wait
            return lease
        self._log(f"run {run_id}: waiting for its workspace, which another run is using")
        lost = threading.Event()
        heartbeat = Heartbeat(
            lease,
            ttl=self.harness.lease_ttl,
            renew=lambda current, ttl: self.store.renew_run_lease(current, ttl=ttl),
            on_lost=lambda _why: lost.set(),
        )
        with heartbeat:
            got = lock.acquire(should_stop=lambda: self.stopping or lost.is_set())
        if got and not lost.is_set():
            return heartbeat.lease
        lock.release()
        if lost.is_set():
            self._note_error(f"run {run_id}: lease lost while waiting for its workspace")
        else:
            self.store.release_run_lease(heartbeat.lease)
        return None

    def _isolate(self, task: Task, parent: Path) -> worktrees.IsolatedWorkspace:
        """A fresh isolated workspace of ``parent`` for the task's attempt (one left by an
        earlier try of the same attempt, never linked to a run that ran, is replaced)."""
        root = worktrees.default_root(parent)
        left = worktrees.reopen(root.resolve() / isolated_name(task)) if root.exists() else None
        if left is not None:
            left.remove()
        made = worktrees.create(parent, root=root, name=isolated_name(task))
        config = parent / CONFIG_FILE  # the sandbox and approval settings hold there too
        if config.is_file():
            (made.path / CONFIG_FILE).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(config, made.path / CONFIG_FILE)
        return made

    def _take_changes(self, task: Task, state: RunState) -> str:
        """For an isolated task's ended run: store its changes as the run's patch artifact
        and say so ("patch: art_…"; "" when nothing changed). The workspace itself is
        removed once the task is settled (``_remove_isolated``)."""
        workspace = worktrees.reopen(Path(state.workspace))
        if workspace is None:
            return ""
        try:
            patch = workspace.patch()
        except KeelError as exc:
            self._note_error(f"task {task.id}: could not take its run's changes: {exc}")
            return f"patch: none (the changes could not be read: {exc})"
        if not patch:
            return ""
        artifact = self.store.put_artifact(state.run_id, patch_artifact_name(state.run_id), patch)
        return f"patch: {artifact.id}"

    def _remove_isolated(self, state: RunState) -> None:
        workspace = worktrees.reopen(Path(state.workspace))
        if workspace is not None:
            workspace.remove()

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
            lock = self._workspace_lock(self.store.load_run(run_id))
            if lock is not None and not lock.acquire(
                should_stop=lambda: self.stopping or lost.is_set()
            ):
                if not lost.is_set():
                    self._release(task, token, "the worker stopped while waiting for its workspace")
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
            finally:
                if lock is not None:
                    lock.release()
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
        if options.get("child_of") or options.get("handoff_from"):
            # A child's (or a handoff's) run is made by its parent, which links it to the
            # task right after; until then the task is not this worker's to run.
            self._release(task, token, "its run is not linked yet: its parent makes it")
            return None
        goal = task.subject if not task.description else f"{task.subject}\n\n{task.description}"
        budget = options.get("budget")
        cwd = Path(options.get("cwd") or self.default_cwd).resolve()
        isolated = self._isolate(task, cwd) if isolated_task(task) else None
        policy = cwd / POLICY_FILE  # an isolated workspace holds no .keel of its own
        try:
            state = self.harness.create(
                goal,
                cwd=cwd if isolated is None else isolated.path,
                budget=Budget.from_dict(budget) if isinstance(budget, dict) else None,
                verify=tuple(options.get("verify") or ()),
                mode=str(options.get("mode") or "edit"),
                model=options.get("model"),
                policy_file=policy if isolated is not None and policy.is_file() else None,
                task_id=task.id,
                idempotency_key=f"task:{task.id}:{task.attempt}",
            )
            self.store.link_task_run(task.id, state.run_id, owner=self.owner, token=token)
        except BaseException:
            if isolated is not None:
                isolated.remove()
            raise
        return state.run_id

    def _settle(self, task: Task, token: str, state: RunState) -> None:
        """Complete or fail the task from its run's end; hand it back otherwise.

        An isolated task's changes are stored first (named in the result), and its
        workspace is removed once the task is settled."""
        isolated = isolated_task(task) and state.status.terminal
        changes = self._take_changes(task, state) if isolated else ""
        if state.status is RunStatus.COMPLETED:
            summary = (state.result or {}).get("summary") or f"run {state.run_id} completed"
            result = str(summary) if not changes else f"{summary}\n{changes}"
            self.store.complete_task(task.id, owner=self.owner, token=token, result=result)
            with self._lock:
                self.stats.tasks_completed += 1
            self._log(f"task {task.id}: completed by run {state.run_id}")
        elif state.status in FAILED_ENDINGS:
            reason = f"run {state.run_id} {state.status.value}: {state.reason}"
            reason = reason if not changes else f"{reason}\n{changes}"
            self.store.fail_task(task.id, owner=self.owner, token=token, reason=reason)
            with self._lock:
                self.stats.tasks_failed += 1
            self._log(f"task {task.id}: failed ({reason})")
        else:
            why = f"run {state.run_id} stopped {state.status.value}; it resumes later"
            self._release(task, token, why)
        if isolated:
            self._remove_isolated(state)

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
