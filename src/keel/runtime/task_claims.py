"""The tasks a run claims: renewed by the run's heartbeat, given back when the run ends.

The task tools claim as the run itself (``run:<run_id>``) for ``run_claim_lease()``
seconds (``KEEL_TASK_LEASE``, default 600). While the run executes, its heartbeat
extends every claim it still holds once a third of the lease has passed since the
claim was last extended (a ``task_heartbeat`` in the task's history: a few an hour, not
one per beat), so a run longer than the lease keeps its tasks.

When the run ends — completed, failed, cancelled or blocked — every task it claimed
and did not complete or fail itself goes back to pending (``task_released``, the
reason naming the run and how it ended). The harness never completes or fails a task
for a run: only the run's own ``complete_task``/``fail_task`` says anything about the
task (a run that completed its goal may not have done the task; a run that failed,
was cancelled or was blocked says nothing against the task), and a released task is
one another agent can take at once.

When the run merely stops resumably (waiting for a person, paused, interrupted,
killed) its claims are kept but no longer renewed: they lapse when their lease does,
and a resumed run — the same owner — renews those still live.
"""

from __future__ import annotations

import time

from keel.core.errors import ConfigError, InvalidTaskTransition, LeaseLost, NotOwner
from keel.core.state import RunState
from keel.core.tasks import Task
from keel.store.base import Store
from keel.tools.tasks import TASK_LEASE_VARIABLE, run_claim_lease

MAX_REASON_CHARS = 300  # of the run's stop reason, quoted in the task's history

# A holder write that lost its footing: the lease lapsed or was taken, or the run
# settled the task itself meanwhile. Nothing was written; the task is left as it is.
_GONE = (LeaseLost, NotOwner, InvalidTaskTransition)


def run_owner(run_id: str) -> str:
    """The owner name a run's task tools claim under."""
    return f"run:{run_id}"


class RunTaskClaims:
    """Renews and settles the task claims of one run."""

    def __init__(self, *, store: Store, run_id: str, lease_seconds: float) -> None:
        self.store = store
        self.run_id = run_id
        self.lease_seconds = lease_seconds  # each renewal extends a claim this long from now
        # (task id, lease token) -> when this process last extended that claim (monotonic)
        self._renewed_at: dict[tuple[str, str], float] = {}

    @classmethod
    def for_run(cls, store: Store, run_id: str, *, heartbeat_ttl: float) -> RunTaskClaims:
        """Claims renewed for ``claim_lease_for(heartbeat_ttl)`` seconds (ConfigError
        for a bad ``KEEL_TASK_LEASE``)."""
        return cls(store=store, run_id=run_id, lease_seconds=claim_lease_for(heartbeat_ttl))

    @property
    def owner(self) -> str:
        return run_owner(self.run_id)

    def renew(self) -> list[Task]:
        """Extend the run's live claims that are due: seen for the first time here, or
        last extended a third of the lease ago (a beat comes at least every third of the
        run's lease, which is no longer than the claim's, so none lapses in between).
        Lapsed, taken or settled claims are skipped; returns the extended tasks."""
        now = time.monotonic()
        renewed: list[Task] = []
        for task in self.store.tasks_held_by(self.owner):
            if task.lease_token is None:
                continue
            key = (task.id, task.lease_token)
            last = self._renewed_at.get(key)
            if last is not None and now - last < self.lease_seconds / 3:
                continue
            try:
                renewed.append(
                    self.store.heartbeat_task(
                        task.id,
                        owner=self.owner,
                        token=task.lease_token,
                        lease_seconds=self.lease_seconds,
                    )
                )
            except _GONE:
                continue
            self._renewed_at[key] = now
        return renewed

    def settle(self, state: RunState) -> list[Task]:
        """If the run ended, give back what it still holds (see the module docstring)."""
        return release_claims_of_ended_run(self.store, state)


def claim_lease_for(heartbeat_ttl: float) -> float:
    """``KEEL_TASK_LEASE`` seconds for runs whose lease is ``heartbeat_ttl`` seconds.

    ConfigError for a value that is not a positive number, or one shorter than the run's
    own lease: a claim would lapse before the heartbeat first came round to it.
    """
    seconds = run_claim_lease()
    if seconds < heartbeat_ttl:
        raise ConfigError(
            f"{TASK_LEASE_VARIABLE}={seconds:g} is shorter than the run's lease "
            f"({heartbeat_ttl:g} s): a claim would lapse between two heartbeats; "
            f"give at least {heartbeat_ttl:g}"
        )
    return seconds


def release_claims_of_ended_run(store: Store, state: RunState) -> list[Task]:
    """Release every live claim of ``state``'s run back to pending if the run is in a
    terminal status (else nothing: a stopped run keeps its claims until they lapse).

    Returns the released tasks; a claim whose lease already lapsed is claimable by
    anyone and is left alone (its old holder may not write it any more).
    """
    if not state.status.terminal:
        return []
    owner = run_owner(state.run_id)
    why = f"run {state.run_id} ended {state.status.value}"
    if state.reason:
        reason = state.reason
        if len(reason) > MAX_REASON_CHARS:
            reason = reason[:MAX_REASON_CHARS] + "…"
        why += f" ({reason})"
    why += " without completing or failing it; back to pending for another claimer"
    released: list[Task] = []
    for task in store.tasks_held_by(owner):
        if task.lease_token is None:
            continue
        try:
            released.append(
                store.release_task(task.id, owner=owner, token=task.lease_token, reason=why)
            )
        except _GONE:
            continue
    return released
