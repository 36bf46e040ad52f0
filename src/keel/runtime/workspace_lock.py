"""A workspace lock: runs on one shared directory take turns.

A worker takes the lock of a run's workspace before it drives the run and lets go
when the drive returns, so two runs never write one directory at once. The lock is
an ``fcntl.flock`` on a file *outside* the workspace (``<cache>/keel/locks/<digest of
the workspace's real path>.lock``), so nothing run inside the workspace can take,
break or delete it, and the operating system lets go of it when its holder dies.

A tree of runs shares it: the holder writes its tree's root run id into the lock
file, and a run of the same tree (a parent's shared-workspace child, executed by
another slot or another worker process on this machine) goes ahead without waiting,
holding nothing. Such a sharer is not counted: if the holder lets go first, another
run may start beside it (a parent that ends cancels its live children, so this is
brief). Only processes of one machine see each other's locks.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from keel.runtime.worktrees import cache_dir

POLL_S = 0.05  # between tries while another run holds the lock


def lock_path(workspace: Path) -> Path:
    """The lock file of ``workspace`` (by its real path), in Keel's cache directory."""
    digest = hashlib.sha256(os.fsencode(os.path.realpath(workspace))).hexdigest()[:32]
    return cache_dir() / "locks" / f"{digest}.lock"


class WorkspaceLock:
    """The lock of one workspace for the run tree ``root_id`` (see the module docstring)."""

    def __init__(self, workspace: Path, *, root_id: str) -> None:
        self.workspace = Path(os.path.realpath(workspace))
        self.root_id = root_id
        self.path = lock_path(self.workspace)
        self.shared = False  # went ahead as a run of the holder's tree, holding nothing
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self, *, should_stop: Callable[[], bool] = lambda: False) -> bool:
        """Wait until this run may write the workspace: True then; False as soon as
        ``should_stop`` says so while waiting (nothing is held then)."""
        if self._fd is not None or self.shared:
            return True
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    if holder_root(self.path) == self.root_id:
                        self.shared = True
                        os.close(fd)
                        return True
                    if should_stop():
                        os.close(fd)
                        return False
                    time.sleep(POLL_S)
                    continue
                break
            record = json.dumps(
                {"root_id": self.root_id, "workspace": str(self.workspace), "pid": os.getpid()}
            ).encode()
            os.ftruncate(fd, 0)
            os.pwrite(fd, record, 0)
        except BaseException:
            with contextlib.suppress(OSError):
                os.close(fd)
            raise
        self._fd = fd
        return True

    def release(self) -> None:
        """Let go (a sharer has nothing to let go of); harmless when not held."""
        fd, self._fd = self._fd, None
        self.shared = False
        if fd is None:
            return
        try:
            os.ftruncate(fd, 0)  # no stale holder for a run that checks before the next
        finally:
            os.close(fd)  # closing the last descriptor releases the flock

    def __enter__(self) -> WorkspaceLock:
        self.acquire()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


def holder_root(path: Path) -> str | None:
    """The root run id the lock file's holder wrote, or None (none, or half written)."""
    try:
        data = json.loads(path.read_bytes() or b"null")
    except (OSError, ValueError):
        return None
    root = data.get("root_id") if isinstance(data, dict) else None
    return root if isinstance(root, str) else None


__all__ = ["WorkspaceLock", "holder_root", "lock_path"]
