"""When a tool call must stop: its own time limit, never past the run's wall time.

The driver gives every call a deadline (``ToolContext.deadline``, a
``time.monotonic()`` instant): the earlier of the tool's own limit
(``Tool.time_limit_s``) and the run's remaining wall-time budget. Tools that work
in this process (walks, searches, reads) check it as they go with a ``Stopwatch``
and stop with ``ToolTimedOut`` saying how far they got; ``run_command`` caps its
timeout by it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from keel.core.errors import ToolTimedOut

DEFAULT_TIME_LIMIT_S = 60.0  # an in-process tool (read, list, glob, grep, edit) per call


def call_deadline(limit_s: float, wall_left_s: float | None, *, now: float) -> float:
    """The monotonic instant a call must stop by: ``now`` plus the smaller of its own
    limit and what is left of the run's wall time (None: no wall-time budget)."""
    allowed = limit_s if wall_left_s is None else min(limit_s, max(wall_left_s, 0.0))
    return now + allowed


@dataclass(slots=True)
class Stopwatch:
    """A call's deadline as a tool checks it while it works (``None``: no deadline)."""

    deadline: float | None
    started: float = field(default_factory=time.monotonic)

    def expired(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline

    def left(self) -> float | None:
        """Seconds until the deadline (0 when past it); None without one."""
        if self.deadline is None:
            return None
        return max(self.deadline - time.monotonic(), 0.0)

    def check(self, tool: str, covered: Callable[[], str]) -> None:
        """``ToolTimedOut`` once the deadline has passed; ``covered()`` says what was done."""
        if self.deadline is not None and time.monotonic() >= self.deadline:
            allowed = max(self.deadline - self.started, 0.0)
            raise ToolTimedOut(
                f"{tool} ran out of time: stopped after {allowed:.1f} s (the call's deadline: "
                f"its own limit or the run's remaining wall time), having {covered()}"
            )


__all__ = ["DEFAULT_TIME_LIMIT_S", "Stopwatch", "call_deadline"]
