"""Keel's one exception tree.

    KeelError
    ├── Signal                     steers the loop; not a failure
    │   ├── ApprovalRequired       an action needs a person's decision
    │   └── InputRequired          the model asked the user a question
    ├── UsageError                 the caller asked for something that cannot be done
    │   ├── ConfigError            broken configuration, missing key, bad store URL
    │   ├── InvalidTransition      a status move the transition table forbids
    │   ├── NotFound               unknown run, task or artifact id
    │   │   ├── RunNotFound
    │   │   └── TaskNotFound
    │   ├── DependencyError        self-, missing or cyclic task dependency
    │   ├── TaskNotClaimable       blocked, taken or finished task
    │   ├── NotOwner               a task change by someone who does not own it
    │   ├── InvalidTaskTransition  a task change its current status does not allow
    │   └── NothingPending         an answer or decision with nothing waiting for it
    │       └── PendingCallChanged an approval meant for a call that no longer waits
    └── RunFailure                 something stopped the work
        ├── BudgetExhausted        a budget dimension ran out
        ├── ModelError             the provider refused or kept failing
        ├── ContextUnfaithful      a compacted context would lose something the run needs
        ├── ToolError              a tool could not do what was asked (shown to the model)
        │   ├── ToolArgumentError  the model's arguments are not JSON or miss the schema
        │   └── ToolTimedOut       a call passed its deadline and was stopped
        └── StoreError             the store cannot serve the request
            ├── ConcurrentUpdate   a writer's expected sequence was stale; nothing written
            ├── LeaseLost          a lease holder's token is no longer valid; nothing written
            ├── LeaseHeld          another live process holds the lease
            ├── SchemaTooNew       the database was written by a newer Keel
            ├── StoreCorrupt       the file is not a Keel database
            └── LogDamaged         a run's event log is not the one Keel appended

Context lives in attributes (``run_id``, ``task_id``); messages say what to do next.
"""

from __future__ import annotations

from datetime import datetime


class KeelError(Exception):
    """Root of every error Keel raises on purpose."""


# --- signals -------------------------------------------------------------------------


class Signal(KeelError):
    """Not a failure: the loop must stop and wait for someone."""


class ApprovalRequired(Signal):
    def __init__(self, run_id: str, call_id: str, tool: str) -> None:
        super().__init__(
            f"run {run_id} waits for approval of {tool} (call {call_id}): "
            f"run `keel approve {run_id}` or `keel approve {run_id} --deny --reason TEXT`"
        )
        self.run_id = run_id
        self.call_id = call_id
        self.tool = tool


class InputRequired(Signal):
    def __init__(self, run_id: str, question: str) -> None:
        super().__init__(f"run {run_id} asks: {question} — answer with `keel answer {run_id} TEXT`")
        self.run_id = run_id
        self.question = question


class StopRequested(Signal):
    """The process was asked to stop while a call waited on something that stopped with it
    (a foreground child stopped between its steps): the call stays unanswered, and a
    resume of the run makes it again (a spawn re-attaches to its child)."""


# --- misuse --------------------------------------------------------------------------


class UsageError(KeelError):
    """The request cannot be done as asked; nothing was changed."""


class ConfigError(UsageError):
    """Configuration is missing or malformed."""


class InvalidTransition(UsageError):
    def __init__(self, current: str, target: str, detail: str = "") -> None:
        msg = f"cannot move a run from {current} to {target}"
        super().__init__(f"{msg}: {detail}" if detail else msg)
        self.current = current
        self.target = target


class NotFound(UsageError):
    """An id names nothing in the store."""


class RunNotFound(NotFound):
    def __init__(self, run_id: str) -> None:
        super().__init__(f"no run with id {run_id!r}; `keel runs` lists the runs in this store")
        self.run_id = run_id


class TaskNotFound(NotFound):
    def __init__(self, task_id: str) -> None:
        super().__init__(f"no task with id {task_id!r}; `keel tasks list` lists the tasks")
        self.task_id = task_id


class DependencyError(UsageError):
    """A dependency would be a self-loop, point at a missing task, or close a cycle."""


class TaskNotClaimable(UsageError):
    def __init__(self, task_id: str, reason: str) -> None:
        super().__init__(f"task {task_id} cannot be claimed: {reason}")
        self.task_id = task_id
        self.reason = reason


class NotOwner(UsageError):
    def __init__(self, task_id: str, owner: str | None, caller: str) -> None:
        held = f"owned by {owner}" if owner else "not claimed by anyone"
        super().__init__(f"task {task_id} is {held}; {caller} cannot change it")
        self.task_id = task_id
        self.owner = owner
        self.caller = caller


class InvalidTaskTransition(UsageError):
    def __init__(self, task_id: str, status: str, detail: str) -> None:
        super().__init__(f"task {task_id} is {status}: {detail}")
        self.task_id = task_id
        self.status = status


class NothingPending(UsageError):
    def __init__(self, run_id: str, what: str) -> None:
        super().__init__(f"run {run_id} is not waiting for {what}")
        self.run_id = run_id


class PendingCallChanged(NothingPending):
    """The approver named the digest of the call they looked at, and the run now waits
    for another call (or for none): nothing is decided."""

    def __init__(self, run_id: str, digest: str, now: str) -> None:
        UsageError.__init__(
            self,
            f"the pending call changed: run {run_id} now waits for {now}, not digest "
            f"{digest}; look at it again before approving",
        )
        self.run_id = run_id
        self.digest = digest


# --- run failures --------------------------------------------------------------------


class RunFailure(KeelError):
    """Something stopped the work."""


class BudgetExhausted(RunFailure):
    def __init__(self, dimension: str) -> None:
        super().__init__(f"budget exhausted: {dimension}")
        self.dimension = dimension


class ModelError(RunFailure):
    """The model could not answer. `reason` is the run's stop-reason word: ``model_error``
    in general, ``out_of_credit`` (add credit; never retried), ``context_overflow`` (the
    conversation is longer than the model's context), ``authentication``. `transient`
    says retries were tried and exhausted."""

    def __init__(
        self,
        message: str,
        *,
        status_code: int | None = None,
        transient: bool = False,
        reason: str = "model_error",
    ):
        super().__init__(message)
        self.status_code = status_code
        self.transient = transient
        self.reason = reason


class ContextUnfaithful(RunFailure):
    """A continuation (``keel.loop.context``) lacks a fidelity item, so it is never sent.

    `missing` names the kind (``goal``, ``open todo``, ``verification gap``,
    ``unresolved error``) and `item` its text; the run fails with a stop reason naming
    both rather than show the model a context that forgot them."""

    def __init__(self, missing: str, item: str) -> None:
        shown = item if len(item) <= 200 else item[:200] + "…"
        super().__init__(
            f"the compacted context lacks the {missing} {shown!r}; it was not sent "
            "(a continuation must keep the goal, every open todo, the latest verification "
            "gaps and the last unresolved error)"
        )
        self.missing = missing
        self.item = item


class ToolError(RunFailure):
    """A tool could not do what was asked; the message goes back to the model."""


class ToolArgumentError(ToolError):
    """The arguments for ``tool`` are not valid JSON or do not fit its schema.

    ``problems`` lists each violation in a compact form the model can act on.
    """

    def __init__(self, tool: str, message: str, problems: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.tool = tool
        self.problems = problems


class ToolTimedOut(ToolError):
    """A call passed its deadline (its own limit or the run's wall time) and was stopped;
    the message says how far it got."""


class StoreError(RunFailure):
    """The store cannot serve the request."""


class ConcurrentUpdate(StoreError):
    def __init__(self, run_id: str, expected: int, actual: int) -> None:
        super().__init__(
            f"run {run_id} moved on: expected last sequence {expected}, store has {actual}; "
            "nothing was written — reload the run and retry"
        )
        self.run_id = run_id
        self.expected = expected
        self.actual = actual


class LeaseLost(StoreError):
    def __init__(self, subject: str, detail: str = "") -> None:
        msg = f"lease on {subject} is no longer held by this process; nothing was written"
        super().__init__(f"{msg} ({detail})" if detail else msg)
        self.subject = subject


class LeaseHeld(StoreError):
    def __init__(self, subject: str, owner: str, expires_at: datetime) -> None:
        super().__init__(
            f"{subject} is being executed by {owner} (lease until {expires_at.isoformat()}); "
            "wait for it to finish or for the lease to expire"
        )
        self.subject = subject
        self.owner = owner
        self.expires_at = expires_at


class SchemaTooNew(StoreError):
    def __init__(self, location: str, found: int, supported: int) -> None:
        super().__init__(
            f"{location} has schema version {found}, newer than this Keel supports ({supported}); "
            "upgrade keel to open it"
        )
        self.location = location


class StoreCorrupt(StoreError):
    def __init__(self, location: str, detail: str) -> None:
        super().__init__(f"{location} is not a readable Keel database: {detail}")
        self.location = location


class LogDamaged(StoreError):
    """A run's events are not the chain its writers appended (see ``keel.core.chain``):
    one is missing, out of place, beyond the run's head or changed."""

    def __init__(self, run_id: str, seq: int, detail: str) -> None:
        super().__init__(f"event log of {run_id} damaged at seq {seq}: {detail}")
        self.run_id = run_id
        self.seq = seq
        self.detail = detail
