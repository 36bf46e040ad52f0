"""Named fault points that tests arm to kill the process at an exact moment (any layer:
the loop, the runtime and the stores call them; this module depends on nothing).

``KEEL_FAULT=after_tool_started`` (optionally ``name:N`` for the N-th time the
point is reached) makes the process SIGKILL itself there: no cleanup, no
flush, exactly like a crash. ``name:N:stop`` sends SIGSTOP instead, freezing
the process there (a stale lease holder) until someone sends SIGCONT.
Unarmed, a fault point costs one dict lookup.
"""

from __future__ import annotations

import os
import signal

POINTS = frozenset(
    {
        "after_tool_started",  # tool_started committed, effect not yet performed
        "after_effect",  # effect performed, tool_finished not yet committed
        "after_tool_finished",  # tool_finished committed
        "mid_model_step",  # model answered, its turn not yet committed
        "during_verification",  # a verifier ran, the verdict not yet committed
        "before_child_run",  # a spawn made the child's task, not yet its run
        "before_spawn_recorded",  # the child's run exists, subagent_spawned not yet committed
        "after_review",  # a reviewer's end is on its parent's log, the verdict not yet
        # Inside a SQLite append (keel.store.sqlite.runs), in the write transaction:
        "append_head_advanced",  # the run's head moved to the step's last seq, no event yet
        "append_mid_events",  # the step's first event written, the others not
        "append_rows_written",  # every event and the snapshot written, not committed
        "append_committed",  # the transaction committed
    }
)

_hits: dict[str, int] = {}


def _armed() -> tuple[str, int, signal.Signals] | None:
    spec = os.environ.get("KEEL_FAULT")
    if not spec:
        return None
    name, _, rest = spec.partition(":")
    count, _, action = rest.partition(":")
    how = signal.SIGSTOP if action == "stop" else signal.SIGKILL
    return name, int(count or "1"), how


_ARMED = _armed()  # read once: the variable is set before the process starts


def fault_point(name: str) -> None:
    armed = _ARMED
    if armed is None or armed[0] != name:
        return
    _hits[name] = _hits.get(name, 0) + 1
    if _hits[name] == armed[1]:
        os.kill(os.getpid(), armed[2])
