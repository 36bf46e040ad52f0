"""Starting and ending one call's process tree, the same way for every kind of sandbox.

A call's program starts in a new session (its process group id is its pid, which
the caller records) with the resource limits applied and, where possible, inside
its own pids cgroup. Ending the call kills the process group and every member of
the cgroup (which also holds processes that started their own session), reaps the
program, removes the cgroup and whatever else the sandbox set up for the call.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from keel.sandbox.cgroups import CallCgroup, PidsHierarchy
from keel.sandbox.limits import ResourceLimits, child_setup

REAP_TIMEOUT_S = 5.0
SETTLE_S = 0.05  # how long processes exiting anyway get before they count as left running
SETTLE_POLL_S = 0.0005


@dataclass(slots=True, kw_only=True)
class CallResources:
    """What a sandbox set up for one call and removes when it ends."""

    cgroup: CallCgroup | None = None
    created_dirs: list[Path] = field(default_factory=list)  # removed when still empty
    scratch: Path | None = None  # removed with its content


class CallTracker:
    """The calls one sandbox has started and not yet finished."""

    def __init__(
        self, limits: ResourceLimits, pids: PidsHierarchy | None, *, helpers: int = 0
    ) -> None:
        self.limits = limits
        self.pids = pids
        self.max_pids = limits.processes + helpers  # the sandbox's own helper processes
        self._open: dict[int, CallResources] = {}
        self._lock = threading.Lock()

    def start(
        self,
        argv: Sequence[str],
        *,
        cwd: Path,
        env: Mapping[str, str],
        stdout: int,
        stderr: int,
        resources: CallResources,
    ) -> subprocess.Popen[bytes]:
        """Start ``argv`` confined by the limits; ``resources`` are freed if it cannot start."""
        try:
            if self.pids is not None:
                resources.cgroup = CallCgroup.create(self.pids, self.max_pids)
            joining = resources.cgroup.join_file if resources.cgroup is not None else None
            proc = subprocess.Popen(
                list(argv),
                cwd=cwd,
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
                start_new_session=True,
                preexec_fn=child_setup(self.limits, joining),  # noqa: PLW1509 - os/resource only
                close_fds=True,
            )
        except subprocess.SubprocessError as exc:  # the limits or the cgroup failed
            _release(resources)
            raise OSError(f"cannot confine the program: {exc}") from None
        except BaseException:
            _release(resources)
            raise
        with self._lock:
            self._open[proc.pid] = resources
        return proc

    def finish(self, proc: subprocess.Popen[bytes]) -> int:
        """Kill what is left of ``proc``'s tree, reap it, free its resources (idempotent)."""
        with self._lock:
            resources = self._open.pop(proc.pid, None)
        cgroup = resources.cgroup if resources is not None else None
        exited = proc.poll() is not None
        # After an exit, what it started may be exiting anyway (bwrap's namespace ends).
        left = _settled(proc.pid, cgroup) if exited else _live_members(proc.pid, cgroup)
        if left or not exited:  # else the group is gone and its id may name another one
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        if cgroup is not None:
            cgroup.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=REAP_TIMEOUT_S)
        if resources is not None:
            _release(resources)
        return len(left)


def _release(resources: CallResources) -> None:
    if resources.cgroup is not None:
        resources.cgroup.kill()
        resources.cgroup.remove()
    for path in reversed(resources.created_dirs):
        with contextlib.suppress(OSError):
            path.rmdir()  # only when still empty: never anything the program wrote
    if resources.scratch is not None:
        shutil.rmtree(resources.scratch, ignore_errors=True)


def _settled(pgid: int, cgroup: CallCgroup | None) -> set[int]:
    """The call's processes still alive after a moment to exit by themselves."""
    deadline = time.monotonic() + SETTLE_S
    while (left := _live_members(pgid, cgroup)) and time.monotonic() < deadline:
        time.sleep(SETTLE_POLL_S)
    return left


def _live_members(pgid: int, cgroup: CallCgroup | None) -> set[int]:
    """Live processes of the call: its cgroup's members (complete, never zombies), else
    the live members of its process group."""
    if cgroup is not None:
        return set(cgroup.members())
    return set(_group_members(pgid)) if _group_alive(pgid) else set()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of group ``pgid``, read from /proc."""
    found = []
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            seen = _state_and_group(entry.path) if entry.name.isdigit() else None
            if seen is not None and seen[0] != "Z" and seen[1] == pgid:
                found.append(int(entry.name))
    return found


def _state_and_group(proc_dir: str) -> tuple[str, int] | None:
    try:
        with open(f"{proc_dir}/stat") as f:
            raw = f.read()
    except OSError:
        return None
    fields = raw[raw.rfind(")") + 2 :].split()
    return (fields[0], int(fields[2])) if len(fields) > 2 else None


__all__ = ["CallResources", "CallTracker"]
