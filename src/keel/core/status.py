"""Run statuses and the one table that says which moves are legal."""

from __future__ import annotations

from enum import StrEnum

from keel.core.errors import InvalidTransition


class RunStatus(StrEnum):
    QUEUED = "queued"  # enqueued, no process has started it
    RUNNING = "running"  # a process is (or should be) driving the loop
    WAITING = "waiting"  # resumable by an approval or an answer
    PAUSED = "paused"  # stopped on purpose, resumable
    VERIFYING = "verifying"  # the model asked to finish; verifiers decide
    COMPLETED = "completed"  # verifiers produced the evidence (terminal)
    FAILED = "failed"  # budget, model, no progress or an error ended it (terminal)
    BLOCKED = "blocked"  # policy or environment refused for good (terminal)
    CANCELLED = "cancelled"  # a person stopped it (terminal)

    @property
    def terminal(self) -> bool:
        return not TRANSITIONS[self]


TRANSITIONS: dict[RunStatus, frozenset[RunStatus]] = {
    RunStatus.QUEUED: frozenset({RunStatus.RUNNING, RunStatus.CANCELLED}),
    RunStatus.RUNNING: frozenset(
        {
            RunStatus.WAITING,
            RunStatus.PAUSED,
            RunStatus.VERIFYING,
            RunStatus.FAILED,
            RunStatus.BLOCKED,
            RunStatus.CANCELLED,
        }
    ),
    RunStatus.WAITING: frozenset({RunStatus.RUNNING, RunStatus.FAILED, RunStatus.CANCELLED}),
    RunStatus.PAUSED: frozenset({RunStatus.RUNNING, RunStatus.CANCELLED}),
    RunStatus.VERIFYING: frozenset(
        {RunStatus.COMPLETED, RunStatus.RUNNING, RunStatus.FAILED, RunStatus.CANCELLED}
    ),
    RunStatus.COMPLETED: frozenset(),
    RunStatus.FAILED: frozenset(),
    RunStatus.BLOCKED: frozenset(),
    RunStatus.CANCELLED: frozenset(),
}

TERMINAL: frozenset[RunStatus] = frozenset(s for s, to in TRANSITIONS.items() if not to)


def check_transition(current: RunStatus, target: RunStatus, reason: str | None) -> str | None:
    """Return the reason to store for the move, or raise InvalidTransition.

    Every move other than to ``running`` needs a non-blank reason; a move to
    ``running`` clears the stored reason (returns None).
    """
    if target not in TRANSITIONS[current]:
        detail = (
            f"{current} is terminal"
            if current in TERMINAL
            else "allowed: " + ", ".join(sorted(TRANSITIONS[current]))
        )
        raise InvalidTransition(current, target, detail)
    if target is RunStatus.RUNNING:
        return None
    if reason is None or not reason.strip():
        raise InvalidTransition(current, target, "a non-empty reason is required")
    return reason.strip()
