"""A pids cgroup per call: a limit on processes alive at once, and a complete kill list.

``RLIMIT_NPROC`` does not bind root and counts every process of a user, so where
Keel may create cgroups (the cgroup v1 ``pids`` hierarchy, or a cgroup v2 subtree
delegated to it with the ``pids`` controller enabled) each call gets its own
``keel-PID-N`` child with ``pids.max`` set. The child joins it before ``exec``, so
everything it starts — also processes that leave its session — is in it, and
ending the call kills exactly the cgroup's members before removing it.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

_MOUNTINFO = Path("/proc/self/mountinfo")
_OWN_CGROUPS = Path("/proc/self/cgroup")
_PREFIX = "keel-"
_COUNTER = itertools.count(1)
KILL_ROUNDS = 200  # kill passes before giving up on a cgroup that keeps refilling
KILL_PAUSE_S = 0.001
REMOVE_WAIT_S = 1.0


@dataclass(frozen=True, slots=True)
class PidsHierarchy:
    """Where per-call cgroups are created: a writable directory of a pids-capable cgroup."""

    parent: Path
    version: int  # 1: the v1 pids hierarchy; 2: a delegated v2 subtree


@functools.cache
def find_pids_hierarchy() -> PidsHierarchy | None:
    """The writable pids cgroup of this process, probed once; None where there is none.

    Also removes the empty cgroups that earlier Keel processes, since dead, left behind.
    """
    for candidate in _candidates():
        if _usable(candidate):
            _sweep(candidate.parent)
            return candidate
    return None


class CallCgroup:
    """One call's cgroup: created with a limit, joined by the child, killed and removed."""

    def __init__(self, path: Path, version: int) -> None:
        self.path = path
        self.version = version
        self.procs_file = str(path / "cgroup.procs")
        # How the child joins. v1: its one thread through ``tasks``, which spares the
        # kernel's global threadgroup lock and the RCU grace period (~10 ms) it costs.
        self.join_file = str(path / ("tasks" if version == 1 else "cgroup.procs"))

    @classmethod
    def create(cls, hierarchy: PidsHierarchy, max_pids: int) -> CallCgroup:
        """A fresh cgroup under ``hierarchy`` allowing ``max_pids`` processes (OSError if not)."""
        path = hierarchy.parent / f"{_PREFIX}{os.getpid()}-{next(_COUNTER)}"
        path.mkdir()
        try:
            (path / "pids.max").write_text(str(max_pids))
        except OSError:
            with contextlib.suppress(OSError):
                path.rmdir()
            raise
        return cls(path, hierarchy.version)

    def members(self) -> list[int]:
        try:
            return [int(line) for line in Path(self.procs_file).read_text().split()]
        except (OSError, ValueError):
            return []

    def kill(self) -> list[int]:
        """SIGKILL every member until none is left; returns the members found at first."""
        first = self.members()
        if self.version == 2 and (self.path / "cgroup.kill").exists():
            with contextlib.suppress(OSError):
                (self.path / "cgroup.kill").write_text("1")
        members = first
        for _ in range(KILL_ROUNDS):
            if not members:
                break
            for pid in members:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(KILL_PAUSE_S)
            members = self.members()
        return first

    def remove(self) -> None:
        """Remove the cgroup once its members are gone (dying ones may take a moment)."""
        deadline = time.monotonic() + REMOVE_WAIT_S
        while True:
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                if time.monotonic() >= deadline:
                    return  # swept by a later Keel process once empty
                time.sleep(KILL_PAUSE_S)


def join(join_file: str) -> None:
    """Move the calling process into the cgroup (runs in the child between fork and exec,
    when it has a single thread, so moving that thread moves the process)."""
    fd = os.open(join_file, os.O_WRONLY)
    try:
        os.write(fd, b"0")  # 0: the writer itself
    finally:
        os.close(fd)


# --- finding the hierarchy ---------------------------------------------------------


def _candidates() -> list[PidsHierarchy]:
    try:
        mounts = _MOUNTINFO.read_text().splitlines()
        own = _OWN_CGROUPS.read_text().splitlines()
    except OSError:
        return []
    v1_path = v2_path = None
    for line in own:
        hid, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hid == "0" and controllers == "":
            v2_path = path
        elif "pids" in controllers.split(","):
            v1_path = path
    found: list[PidsHierarchy] = []
    for line in mounts:
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        root, mount_point, fstype, options = fields[3], fields[4], tail[0], tail[2]
        if fstype == "cgroup" and "pids" in options.split(",") and v1_path is not None:
            found.insert(0, PidsHierarchy(_inside(mount_point, root, v1_path), 1))
        elif fstype == "cgroup2" and v2_path is not None:
            parent = _inside(mount_point, root, v2_path)
            if _delegates_pids(parent):
                found.append(PidsHierarchy(parent, 2))
    return found


def _inside(mount_point: str, root: str, path: str) -> Path:
    """The directory of cgroup ``path`` under a mount of the hierarchy's ``root``."""
    rel = path
    if root != "/" and (path == root or path.startswith(root + "/")):
        rel = path[len(root) :]
    return Path(_unescape(mount_point)) / rel.lstrip("/")


def _unescape(mount_point: str) -> str:
    return mount_point.replace("\\040", " ").replace("\\011", "\t").replace("\\134", "\\")


def _delegates_pids(parent: Path) -> bool:
    try:
        return "pids" in (parent / "cgroup.subtree_control").read_text().split()
    except OSError:
        return False


def _usable(candidate: PidsHierarchy) -> bool:
    try:
        probe = CallCgroup.create(candidate, 1)
    except OSError:
        return False
    probe.remove()
    return not probe.path.exists()


def _sweep(parent: Path) -> None:
    """Remove ``keel-PID-N`` cgroups whose Keel process is gone (only empty ones go)."""
    try:
        entries = list(parent.iterdir())
    except OSError:
        return
    for entry in entries:
        owner = entry.name.removeprefix(_PREFIX).split("-")[0]
        if not entry.name.startswith(_PREFIX) or not owner.isdigit() or _alive(int(owner)):
            continue
        with contextlib.suppress(OSError):
            entry.rmdir()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


__all__ = ["CallCgroup", "PidsHierarchy", "find_pids_hierarchy", "join"]
