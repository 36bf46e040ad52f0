"""The loop's steps as types: what the pure decision asks the driver to do next.

``decide`` (in ``keel.loop.decide``) looks at a run's state and returns exactly one
of these; the driver performs it, records its events, and asks again. Only
``CallModel``, ``RunTool``, ``ReconcileCall`` and ``RunVerifiers`` need I/O;
``SettleProcess`` (a command left running by a dead process) needs I/O too;
``Commit`` is a decision already made (its events only need storing) and
``Halt`` hands control back to the caller.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from keel.core.events import NewEvent
from keel.core.status import RunStatus


@dataclass(frozen=True, slots=True, kw_only=True)
class Commit:
    """Record these events; the decision needs no I/O."""

    events: tuple[NewEvent, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class CallModel:
    """Prepare the model's view from the run state and ask the model for a turn."""

    step: int  # how many model turns the run already had
    notes: tuple[str, ...] = ()
    consult: bool = False  # ask the before_model middleware first (none decided yet)
    decisions: tuple[dict[str, Any], ...] = ()  # what they decided (recorded), to apply


@dataclass(frozen=True, slots=True, kw_only=True)
class RunTool:
    """Execute one validated tool call (recording it as started first if it has effects)."""

    call_id: str
    tool: str
    arguments: dict[str, Any]
    effect: str
    recovery: str
    grant: str | None = None  # approval digest this execution uses up
    record_start: bool = True  # False when tool_started is already in the log (a re-run)
    git_writable: bool = False  # an approved command that writes the repository
    consult: bool = False  # ask the before_tool middleware first (none decided yet)
    notes: tuple[str, ...] = ()  # middleware notes shown after the call's result


@dataclass(frozen=True, slots=True, kw_only=True)
class ReconcileCall:
    """A call was recorded as started but not finished: ask the tool what happened."""

    call_id: str
    tool: str
    arguments: dict[str, Any]
    intent: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class SettleProcess:
    """A started call's program may still run (its process died first): find it, then
    wait for it or kill it, before anyone is asked whether to run the call again."""

    call_id: str
    process: dict[str, Any]  # pgid, host, boot_id, start_ticks from process_started


@dataclass(frozen=True, slots=True, kw_only=True)
class RunVerifiers:
    """Run the harness's verifiers against the current mutation revision."""

    commands: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Halt:
    """Stop driving: the run is waiting for a person, or finished."""

    status: RunStatus


Action = Commit | CallModel | RunTool | ReconcileCall | SettleProcess | RunVerifiers | Halt
