"""Finding a command that outlived the process that started it.

``run_command`` starts every program in a new session, so its process group id
is also its session id, and every process it starts (unless it starts its own
session) carries that session id. When the call starts, the driver records
``identify(pgid)``: the host, the boot, and the leader's start time in clock
ticks since boot. A later process on the same host and boot can then tell
whether any process of that session still runs, without mistaking a reused
process id for it (a reused id has a later start time than the recorded one
only if the leader died, and the session id of an unrelated process equals the
pgid only if it was started after the recorded start; both are checked).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from pathlib import Path
from typing import Any

_PROC = Path("/proc")
POLL_S = 0.1
DEFAULT_WAIT_S = 600.0  # when the recorded call names no time limit


def boot_id() -> str:
    """This boot's id (Linux); "" where the system does not tell."""
    try:
        return (_PROC / "sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def identify(pgid: int) -> dict[str, Any]:
    """What ``process_started`` records about a just-started process group."""
    return {
        "pgid": pgid,
        "host": socket.gethostname(),
        "boot_id": boot_id(),
        "start_ticks": _start_ticks(pgid),
    }


def on_this_machine(process: dict[str, Any]) -> bool:
    """True when ``process`` was recorded on this host during this boot."""
    if process.get("host") != socket.gethostname():
        return False
    recorded = str(process.get("boot_id") or "")
    return not recorded or recorded == boot_id()


def survivors(process: dict[str, Any]) -> list[int]:
    """Process ids still running in the recorded session (empty when none is left)."""
    pgid = int(process.get("pgid") or 0)
    if pgid <= 1:
        return []
    since = process.get("start_ticks")
    if not _PROC.is_dir():  # no /proc: ask the kernel about the group itself
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return []
        return [pgid]
    found = []
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        if fields is None:
            continue
        state, session, started = fields[0], int(fields[3]), int(fields[19])
        if state == "Z" or session != pgid:
            continue
        if isinstance(since, int) and started < since:
            continue  # an older, unrelated session that happens to share the id
        found.append(int(entry.name))
    return found


def kill_all(process: dict[str, Any]) -> None:
    """SIGKILL every survivor of the recorded session, and its process group."""
    pgid = int(process.get("pgid") or 0)
    for pid in survivors(process):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    if pgid > 1:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)


def wait_until_gone(process: dict[str, Any], *, deadline: float) -> bool:
    """Poll until no survivor is left (True) or ``deadline`` (monotonic) passes (False)."""
    while survivors(process):
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_S)
    return True


def settle(process: dict[str, Any], policy: str) -> str:
    """Deal with a recorded command before anyone decides about it; what was done.

    "elsewhere": recorded on another host or boot, so it cannot be seen from here;
    "gone": nothing of it runs; "killed": it ran and ``policy`` is "kill", or it
    outlived its own time limit while waited for; "waited": it ran and ended.
    """
    if not on_this_machine(process):
        return "elsewhere"
    if not survivors(process):
        return "gone"
    if policy != "kill":
        limit = float(process.get("timeout_s") or DEFAULT_WAIT_S)
        if wait_until_gone(process, deadline=time.monotonic() + limit):
            return "waited"
    kill_all(process)
    return "killed"


def running_since(pid: int) -> int | None:
    """When the live process ``pid`` started (clock ticks since boot); None when no
    process has that id now (a zombie counts as gone) or there is no /proc."""
    fields = _stat_fields(pid)
    if fields is None or fields[0] == "Z":
        return None
    return int(fields[19])


def _start_ticks(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return int(fields[19]) if fields is not None else None


def _stat_fields(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name: [state, ppid, pgrp, session, ...]."""
    try:
        raw = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    close = raw.rfind(")")
    return raw[close + 2 :].split() if close > 0 else None


__all__ = [
    "boot_id",
    "identify",
    "kill_all",
    "on_this_machine",
    "running_since",
    "settle",
    "survivors",
    "wait_until_gone",
]
