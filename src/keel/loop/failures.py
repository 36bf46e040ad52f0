"""How the unexpected is recorded: a call's failure as a tool error, a loop's as a failed run.

The rule: an exception inside a tool, its argument handling or its intent
computation is the model's observation (``tool_failed`` with an ``error_kind``),
and the run goes on; an exception that still reaches the driver ends the run
``failed`` with ``internal_error: <Type>: <message>``, so no run is ever left
``running`` with no one driving it. Only the lease's loss (another process owns
the run now) and signals pass through. Pure: no I/O.
"""

from __future__ import annotations

import traceback
from dataclasses import replace

from keel.core.errors import LeaseLost, Signal, ToolArgumentError, ToolError, ToolTimedOut
from keel.core.events import NewEvent
from keel.core.state import RunState, transition
from keel.core.status import RunStatus
from keel.core.text import printable

PASS_THROUGH: tuple[type[BaseException], ...] = (LeaseLost, Signal)  # never recorded as failures
REASON_PREFIX = "internal_error"
_FRAMES_KEPT = 8


def error_kind(exc: BaseException) -> str:
    """The ``error_kind`` of a call that raised ``exc``."""
    if isinstance(exc, ToolArgumentError):
        return "invalid_arguments"
    if isinstance(exc, ToolTimedOut):
        return "timed_out"
    if isinstance(exc, ToolError):
        return "tool_error"
    return "tool_exception"


def error_message(exc: BaseException) -> str:
    """What the model reads: a ToolError's own words, else the exception's type and words."""
    if isinstance(exc, ToolError):
        return words_of(exc)
    return f"{type(exc).__name__}: {words_of(exc)}"


def words_of(exc: BaseException) -> str:
    """``str(exc)``, or a stand-in when the exception cannot even say what it is."""
    try:
        return str(exc)
    except Exception:
        return f"(a {type(exc).__name__} whose message cannot be shown)"


def internal_failure(state: RunState, exc: BaseException) -> list[NewEvent]:
    """The events that end ``state``'s run ``failed`` because ``exc`` reached the driver.

    The reason is ``internal_error: <Type>: <message>`` on one printable line; the
    result keeps the innermost frames, so a maintainer can find the fault from the
    log. A queued or paused run passes through ``running`` (the only way to fail).
    """
    words = words_of(exc)
    reason = printable(f"{REASON_PREFIX}: {type(exc).__name__}: {words}")
    frames = [
        f"{frame.filename}:{frame.lineno} in {frame.name}"
        for frame in traceback.extract_tb(exc.__traceback__)[-_FRAMES_KEPT:]
    ]
    events: list[NewEvent] = []
    if state.status in (RunStatus.QUEUED, RunStatus.PAUSED):
        events.append(transition(state, RunStatus.RUNNING, None))
        state = replace(state, status=RunStatus.RUNNING)
    events.append(
        transition(
            state,
            RunStatus.FAILED,
            reason,
            result={
                "unfinished": state.unfinished_todos(),
                "error": {
                    "type": type(exc).__name__,
                    "message": printable(words, limit=2000),
                    "frames": frames,
                },
            },
        )
    )
    return events


__all__ = [
    "PASS_THROUGH",
    "REASON_PREFIX",
    "error_kind",
    "error_message",
    "internal_failure",
    "words_of",
]
