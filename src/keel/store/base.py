"""The ``Store`` seam: the one interface every backend implements.

Guarantees every backend gives (checked by ``keel.testing.conformance``):
- a run's events are numbered 1, 2, 3 … with no gap; ``append_events`` writes all
  of a step's events or none, and only if the caller's ``expected_seq`` is still
  the run's last sequence (else ``ConcurrentUpdate``, nothing written);
- the stored snapshot is always the fold of the run's events;
- nothing new starts on a run that has ended: an event that begins something
  (``keel.store.step.STARTS_ACTION``) is refused with ``InvalidTransition`` once the
  run is completed, failed, blocked or cancelled; outcomes of what began still land;
- a write carrying a lease token is refused with ``LeaseLost`` unless that token
  is the run's (or task's) current, unexpired lease;
- task claims are atomic: two claimers never both win a task;
- every task change appends to that task's own gapless history in the same
  transaction;
- every event carries a hash chained to the previous event's (``keel.core.chain``);
  the database refuses an event whose seq is not the run's last + 1. Readers check
  the part of the chain they read (``load_run``: the snapshot's event and every event
  after it; ``read_events``: what it returns) and raise ``LogDamaged`` naming the
  first bad event; ``verify_log`` checks a run's whole log;
- an append writes its events' figures (``keel.store.stats.figure_rows``) in the same
  transaction, so ``run_stats`` counts exactly the events stored.
Times come from the database clock where leases are concerned.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol, runtime_checkable

from keel.core.errors import LogDamaged
from keel.core.events import Event, NewEvent
from keel.core.records import RunOptions
from keel.core.state import RunState
from keel.core.stats import RunStats
from keel.core.status import RunStatus
from keel.core.tasks import Task, TaskEvent, TaskStatus
from keel.store.step import FoldedStep


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseHolder:
    """The process holding a run lease, as precisely as a later process on the same
    machine needs to tell whether it still runs (``keel.runtime.takeover``)."""

    host: str  # socket.gethostname()
    boot_id: str = ""  # /proc/sys/kernel/random/boot_id; "" where the system does not tell
    pid: int
    start_ticks: int | None = None  # the process's start, clock ticks since boot
    pid_ns: str = ""  # its pid namespace, e.g. "pid:[4026531836]": pids compare only within one

    def describe(self) -> str:
        """E.g. ``pid 4242 on build-7``."""
        return f"pid {self.pid} on {self.host}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Lease:
    """A time-bounded right to execute a run or a task; ``token`` fences writes."""

    subject: str  # run id or task id
    owner: str
    token: str
    expires_at: datetime
    holder: LeaseHolder | None = None  # run leases: where the holder runs (None: not recorded)


@dataclass(frozen=True, slots=True, kw_only=True)
class Artifact:
    id: str  # "art_" + sha256 prefix of the content: equal content, equal id
    run_id: str
    name: str
    size: int
    created_at: datetime


@dataclass(frozen=True, slots=True, kw_only=True)
class LogCheck:
    """What ``Store.verify_log`` found in one run's log."""

    run_id: str
    events: int  # events whose place and hash checked out (all of them when intact)
    head_hash: str | None  # the hash of the last of those; pin it elsewhere to pin the log
    damage: LogDamaged | None = None  # the first bad event; None: intact

    @property
    def intact(self) -> bool:
        return self.damage is None


@dataclass(frozen=True, slots=True, kw_only=True)
class ApiToken:
    """A named API bearer token as the store keeps it: never the token, only (elsewhere,
    in the store) its SHA-256. ``revoked_at`` set: the token no longer authenticates."""

    name: str
    created_at: datetime
    revoked_at: datetime | None = None
    last_used_at: datetime | None = None  # optional bookkeeping; may stay None

    @property
    def live(self) -> bool:
        return self.revoked_at is None


@runtime_checkable
class Store(Protocol):
    """Authoritative state of runs, events, artifacts and tasks."""

    url: str
    # Whether a commit is on disk when it returns (an fsync per commit), not only safe
    # from a crash of the process. Tools write files as durably as the store commits.
    fsyncs_commits: bool

    # --- runs and events -----------------------------------------------------------

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
        """Create a run with its ``run_created`` event (seq 1).

        With an ``idempotency_key`` already used, return that run unchanged.
        ``queued=True`` creates it in status ``queued`` for a worker to pick up.
        """
        ...

    def append_events(
        self,
        run_id: str,
        events: Sequence[NewEvent],
        *,
        expected_seq: int,
        lease_token: str | None = None,
    ) -> tuple[RunState, list[Event]]:
        """Append one step's events atomically; return the new state and stored events."""
        ...

    def append_folded(
        self, run_id: str, step: FoldedStep, *, lease_token: str | None = None
    ) -> tuple[RunState, list[Event]]:
        """Store a step the writer already folded with ``keel.store.step.fold_step`` onto
        the state this store returned at ``step.base_seq`` (so it is folded once, not
        twice); refused exactly as ``append_events`` is, nothing written."""
        ...

    def load_run(self, run_id: str) -> RunState:
        """The run's current state (snapshot plus any later events); RunNotFound if none."""
        ...

    def list_runs(self, *, status: RunStatus | None = None, limit: int = 100) -> list[RunState]:
        """Newest first; ``LogDamaged`` if a listed run's log is (see ``survey_runs``)."""
        ...

    def survey_runs(
        self, *, status: RunStatus | None = None, limit: int = 100
    ) -> list[RunState | LogDamaged]:
        """As ``list_runs``, but a run whose log is damaged is listed as its
        ``LogDamaged`` instead of hiding the other runs."""
        ...

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
        """One page of runs, newest first (``created_at`` DESC, then id DESC: stable).

        ``before`` is the opaque cursor the previous page returned (None: the first
        page); the result is ``(runs, next_cursor)``, ``next_cursor`` None when no run
        is left. Paging never skips or repeats a run, even while runs are created
        between fetches (new ones sort before the first page). Filters combine;
        ``top_level=True`` keeps runs without a parent. ``limit`` is clamped to 1..500.
        A malformed cursor raises ``UsageError`` ("invalid cursor: ..."), as does
        ``parent_id`` with ``top_level=True``; ``LogDamaged`` if a listed run's log is.
        """
        ...

    def count_runs_by_status(self) -> dict[RunStatus, int]:
        """How many runs are in each status; every status is a key (zeros included)."""
        ...

    def queue_depth(self) -> int:
        """Work waiting for a worker: queued runs without a task plus pending tasks
        whose blockers are all completed (claimable now)."""
        ...

    def child_runs(self, run_id: str) -> list[RunState]:
        """The runs created with ``parent_id=run_id`` (its direct children, not theirs),
        oldest first; RunNotFound for an unknown run, ``LogDamaged`` if a child's log is
        damaged. Walk it again per child for the whole tree."""
        ...

    def read_events(self, run_id: str, *, after: int = 0, limit: int | None = None) -> list[Event]:
        """Events with ``seq > after`` in order; RunNotFound for an unknown run;
        ``LogDamaged`` if one of them, or their place in the chain, is not as appended."""
        ...

    def verify_log(self, run_id: str) -> LogCheck:
        """Check the run's whole log: numbering 1..last, every hash from the genesis
        one, the run's recorded head and its snapshot's hash. RunNotFound if none."""
        ...

    def run_ids(self) -> list[str]:
        """Every run's id, oldest first (what ``keel verify --all`` walks)."""
        ...

    def wait_for_events(self, run_id: str, *, after: int, timeout: float) -> bool:
        """Block until the run has an event after ``after`` or ``timeout`` passes."""
        ...

    def run_stats(
        self,
        *,
        since: datetime | None = None,
        model: str | None = None,
        run_id: str | None = None,
    ) -> RunStats:
        """Usage figures of the runs created at or after ``since``, whose model spec is
        ``model``, or of the one run ``run_id`` (filters combine; none: every run),
        aggregated in the database from the runs' own events (``keel.core.stats`` says
        what each figure counts). RunNotFound for an unknown ``run_id``."""
        ...

    # --- run leases ----------------------------------------------------------------

    def acquire_run_lease(
        self,
        run_id: str,
        *,
        owner: str,
        ttl: float,
        holder: LeaseHolder | None = None,
        replacing: str | None = None,
    ) -> Lease:
        """Take the run's lease if free or expired (a takeover); else ``LeaseHeld``.

        ``holder`` is recorded with the lease. ``replacing`` is the token of a live
        lease whose holder the caller found dead: that lease is taken too, but only
        while it is still the run's current one (of two callers, one wins).
        """
        ...

    def renew_run_lease(self, lease: Lease, *, ttl: float) -> Lease:
        """Extend a held lease; ``LeaseLost`` if it was taken or expired."""
        ...

    def release_run_lease(self, lease: Lease) -> None:
        """Give the lease up; a no-op if it is no longer ours."""
        ...

    def current_run_lease(self, run_id: str) -> Lease | None:
        """The unexpired lease on a run (with its recorded holder), if any."""
        ...

    def claim_next_run(
        self, *, owner: str, ttl: float, holder: LeaseHolder | None = None
    ) -> tuple[RunState, Lease] | None:
        """Lease the oldest queued run, or a running one whose lease expired.

        A queued run with a ``task_id`` (a child run) is never picked: it is executed by
        whoever claims its task, so it has exactly one executor. A running run whose lease
        lapsed is picked whatever its task (its executor died)."""
        ...

    # --- artifacts -----------------------------------------------------------------

    def put_artifact(self, run_id: str, name: str, content: bytes) -> Artifact: ...

    def get_artifact(self, artifact_id: str) -> tuple[Artifact, bytes]: ...

    # --- tasks ---------------------------------------------------------------------

    def create_task(
        self,
        subject: str,
        *,
        description: str = "",
        blocked_by: Sequence[str] = (),
        actor: str,
        idempotency_key: str | None = None,
        options: dict[str, object] | None = None,
    ) -> Task: ...

    def add_dependencies(self, task_id: str, blocked_by: Sequence[str], *, actor: str) -> Task:
        """Only on a pending, unclaimed task; self-, missing and cyclic ones are refused."""
        ...

    def get_task(self, task_id: str) -> Task: ...

    def list_tasks(
        self, *, status: TaskStatus | None = None, ready: bool = False
    ) -> list[Task]: ...

    def claim_task(
        self, *, owner: str, lease_seconds: float, task_id: str | None = None
    ) -> Task | None:
        """Claim ``task_id`` (TaskNotClaimable naming why not) or the oldest ready task
        (None when there is none). Expired leases are reclaimed inside the claim."""
        ...

    def heartbeat_task(
        self, task_id: str, *, owner: str, token: str, lease_seconds: float
    ) -> Task: ...

    def complete_task(
        self, task_id: str, *, owner: str, token: str | None = None, result: str | None = None
    ) -> list[Task]:
        """Complete an owned task; return exactly the tasks that became ready by it."""
        ...

    def fail_task(
        self, task_id: str, *, owner: str, reason: str, token: str | None = None
    ) -> Task: ...

    def reopen_task(self, task_id: str, *, actor: str) -> Task:
        """Move a failed task back to pending (a new attempt); history keeps the failure."""
        ...

    def release_task(
        self, task_id: str, *, owner: str, token: str, reason: str | None = None
    ) -> Task:
        """Give a claimed task back to pending without failing it (graceful shutdown,
        or the run that claimed it ended); ``reason`` is recorded in its history."""
        ...

    def cancel_task(self, task_id: str, *, actor: str, reason: str) -> Task:
        """Withdraw a task for good (``keel.core.tasks.check_cancel`` says who may);
        its dependents can never be claimed and say so."""
        ...

    def tasks_held_by(self, owner: str) -> list[Task]:
        """The in-progress tasks ``owner`` claimed, oldest first (lapsed leases too)."""
        ...

    def link_task_run(self, task_id: str, run_id: str, *, owner: str, token: str) -> Task: ...

    def task_events(self, task_id: str) -> list[TaskEvent]: ...

    def wait_for_work(self, timeout: float) -> bool:
        """Block until new work may be claimable (NOTIFY on PostgreSQL) or timeout."""
        ...

    # --- API tokens ----------------------------------------------------------------

    def create_token(self, name: str, token_hash: str) -> ApiToken:
        """Record a token by ``name`` and its SHA-256 hex (the token itself is never
        stored). ``UsageError`` if the name breaks the rule (1..64 of ``[A-Za-z0-9_.@-]``)
        or a live token has it ("a token named NAME already exists; revoke it first");
        a revoked token's name may be reused (the old row is replaced)."""
        ...

    def list_tokens(self) -> list[ApiToken]:
        """Every token, oldest first, revoked ones included."""
        ...

    def revoke_token(self, name: str) -> ApiToken:
        """Revoke the live token ``name``; ``NotFound`` ("no live token named NAME")
        when there is none."""
        ...

    def token_by_hash(self, token_hash: str) -> ApiToken | None:
        """The live token whose stored hash is ``token_hash``; None otherwise."""
        ...

    def close(self) -> None: ...


def iter_all_events(store: Store, run_id: str, *, page: int = 1000) -> Iterator[Event]:
    after = 0
    while True:
        batch = store.read_events(run_id, after=after, limit=page)
        if not batch:
            return
        yield from batch
        after = batch[-1].seq
