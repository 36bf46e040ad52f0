"""The workspace boundary: every file tool reads, writes, hashes and walks through here.

Guarantees: a path the model names is followed only while its resolution stays
inside the workspace (every symbolic link along it, dangling ones included);
the check and the use are one step, made from a descriptor of the workspace
root (``keel.tools.fsroot``), so a directory swapped for a link during a call
cannot lead a read or a write outside; reads never block on a FIFO; writes
never touch a protected path (``PathGuard.write_refusal`` of the *real* path)
and replace files atomically, so a file always has either its old or its new
content (what VERIFY_THEN_CONTINUE relies on).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import uuid
from collections.abc import Iterator
from pathlib import Path

from keel.core.errors import ToolError
from keel.core.guard import PathGuard
from keel.tools.fsroot import CREATE_FLAGS, Spot, WorkspaceRoot
from keel.tools.walk import SKIPPED_DIRS, WalkEntry, walk_tree


def resolve_in_workspace(workspace: Path, path: str, *, for_write: bool) -> Path:
    """The real location of ``path`` (relative to the workspace or absolute) inside it.

    Refuses ``..`` escapes, absolute paths outside and symbolic links leading out
    with a ToolError naming the path and the workspace. For a write to a new file the
    deepest existing parent is resolved and the rest appended; writing onto a
    directory or onto the workspace itself is refused. The answer is a name, good for
    showing and for rules; to open, use the functions below (no gap before the use).
    """
    with WorkspaceRoot(workspace) as root, root.locate(path) as spot:
        if for_write:
            _check_file_target(path, spot)
        return Path(root.real) / spot.rel


def relative_posix(workspace: Path, real: Path) -> str:
    """``real`` (inside the workspace) as a workspace-relative posix path; "." for the root."""
    return real.relative_to(workspace.resolve()).as_posix() or "."


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file's bytes, read in chunks; "" when ``path`` is not a regular file.

    Opened without blocking, so a FIFO put in a file's place cannot hang the caller.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        return _sha256_fd(fd) if stat.S_ISREG(os.fstat(fd).st_mode) else ""
    finally:
        os.close(fd)


def current_hash(workspace: Path, path: str) -> str:
    """sha256 of the workspace file ``path`` now; "" when it does not exist."""
    with WorkspaceRoot(workspace) as root:
        opened = root.open(path)
        if opened is None:
            return ""
        with opened:
            if opened.rel == ".":
                raise ToolError(f"path {path!r} is the workspace itself, not a file")
            if opened.is_dir:
                raise ToolError(f"path {path!r} is a directory; give a file path")
            return _sha256_fd(opened.fd) if opened.is_file else ""


def read_in_workspace(
    workspace: Path, path: str, *, limit: int, tool: str = "this tool"
) -> tuple[str, bytes]:
    """(real workspace-relative path, bytes) of the regular file ``path``, else a ToolError.

    A file over ``limit`` bytes (also one that grows past it while it is read) is
    refused, naming its size and the limit, having read at most ``limit + 1`` bytes.
    """
    with WorkspaceRoot(workspace) as root:
        opened = root.open(path)
        if opened is None:
            raise ToolError(f"file {path!r} does not exist; list_dir or glob show what exists")
        with opened:
            if opened.is_dir:
                raise ToolError(f"{path!r} is a directory; use list_dir to see its entries")
            if not opened.is_file:
                raise ToolError(f"{path!r} is not a regular file")
            data = opened.read(limit + 1) if opened.st.st_size <= limit else b""
            if opened.st.st_size > limit or len(data) > limit:
                size = max(opened.st.st_size, len(data))
                raise ToolError(
                    f"{path!r} is {size} bytes; {tool} handles files of at most {limit} bytes "
                    f"({limit // (1024 * 1024)} MiB). Nothing was read or changed; for a "
                    "larger file use run_command (sed, a script), or read_file with offset "
                    "and limit to read it in pieces"
                )
            return opened.rel, data


def write_target(workspace: Path, path: str, guard: PathGuard) -> str:
    """The real workspace-relative path a write of ``path`` would replace; changes nothing.

    ToolError when the path leads outside, is a directory, has a file for a parent,
    or is protected (``guard.write_refusal``).
    """
    with WorkspaceRoot(workspace) as root, root.locate(path) as spot:
        _check_file_target(path, spot)
        refuse_protected(path, spot.rel, guard)
        return spot.rel


def replace_in_workspace(
    workspace: Path, path: str, data: bytes, guard: PathGuard, *, fsync: bool = True
) -> tuple[str, bool]:
    """Write ``data`` to ``path`` atomically; (real workspace-relative path, it existed before).

    The file is created next to its target with ``O_EXCL | O_NOFOLLOW`` and renamed
    over it within the parent's descriptor; an existing file keeps its mode; missing
    parent directories are made by descriptor. Refusals as in ``write_target``; an OS
    error becomes a ToolError naming the path.

    ``fsync`` (``ToolContext.fsync``: as the store commits) syncs the data before the
    rename and the directory after it, so the new content survives a power loss. Without
    it the rename is still atomic for every process: a reader sees the old file or the
    new one, and a power loss — which may also take the store's last commits — leaves the
    old content or the new, which a resumed run checks (``effect_happened``) before it
    goes on.
    """
    with WorkspaceRoot(workspace) as root, root.locate(path) as spot:
        _check_file_target(path, spot)
        refuse_protected(path, spot.rel, guard)
        try:
            with root.parent_for_write(spot) as parent:
                existed = _replace(parent, spot.tail[-1], data, fsync=fsync)
        except OSError as exc:
            raise ToolError(f"cannot write {path!r}: {exc.strerror or exc}") from None
        return spot.rel, existed


def write_in_workspace(workspace: Path, rel: str, data: bytes, guard: PathGuard) -> str:
    """Write ``data`` to the workspace file ``rel`` safely; its real workspace-relative path.

    For the harness's own writes into the workspace (the mirrored plan): the same
    confinement, protection and atomicity as write_file; ToolError when refused.
    """
    return replace_in_workspace(workspace, rel, data, guard)[0]


def refuse_protected(path: str, rel: str, guard: PathGuard) -> None:
    """ToolError naming ``path`` and why, when its real path ``rel`` may never be written.

    The path is also judged in case-folded form: on a case-insensitive file system
    ``.KEEL/x`` is ``.keel/x``.
    """
    reason = guard.write_refusal(rel) or guard.write_refusal(rel.casefold())
    if reason is not None:
        raise ToolError(f"refusing to write {path!r}: {reason}")


def write_atomically(path: Path, data: bytes) -> None:
    """Replace the file ``path`` (a trusted, harness-chosen name) with ``data`` in one rename.

    Makes missing parents and keeps an existing file's mode. Model-chosen paths go
    through ``replace_in_workspace`` instead, which confines them to the workspace.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        _replace(fd, path.name, data)
    finally:
        os.close(fd)


def walk_workspace(
    workspace: Path, start: Path, *, max_depth: int | None = None
) -> Iterator[WalkEntry]:
    """Entries under ``start``, directory by directory in name order, without following links.

    Symbolic links are yielded as "symlink" entries (``inside`` tells where they
    lead) and never descended into; version-control directories are skipped.
    """
    with WorkspaceRoot(workspace) as root:
        opened = root.open(relative_posix(workspace, start), spelled=False)
        if opened is None:
            return
        with opened:
            if opened.is_dir:
                yield from walk_tree(root, opened.fd, opened.rel, max_depth=max_depth)


# --- internals -----------------------------------------------------------------------


def _check_file_target(path: str, spot: Spot) -> None:
    if spot.rel == ".":
        raise ToolError(f"path {path!r} is the workspace itself, not a file")
    if spot.blocked:
        raise ToolError(f"cannot create {path!r}: a parent is a file, not a directory")
    if spot.is_dir():
        raise ToolError(f"path {path!r} is a directory; give a file path")


def _replace(dir_fd: int, name: str, data: bytes, *, fsync: bool = True) -> bool:
    """Atomically put ``data`` at ``name`` in ``dir_fd``; True when a file was there. With
    ``fsync``, durable on disk too (the data before the rename, the directory after)."""
    # The temporary name stays within NAME_MAX bytes whatever ``name`` is made of.
    tmp = f".{os.fsdecode(os.fsencode(name)[:200])}.keel-{uuid.uuid4().hex[:8]}.tmp"
    fd = os.open(tmp, CREATE_FLAGS, 0o666, dir_fd=dir_fd)
    old: os.stat_result | None = None
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            with contextlib.suppress(FileNotFoundError):
                old = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            if old is not None and stat.S_ISREG(old.st_mode):
                os.fchmod(fd, stat.S_IMODE(old.st_mode))
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise
    if not fsync:
        return old is not None
    with contextlib.suppress(OSError):  # make the rename itself durable
        dfd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=dir_fd)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    return old is not None


def _sha256_fd(fd: int) -> str:
    digest = hashlib.sha256()
    while chunk := os.read(fd, 1 << 20):
        digest.update(chunk)
    return digest.hexdigest()


__all__ = [
    "SKIPPED_DIRS",
    "WalkEntry",
    "current_hash",
    "read_in_workspace",
    "refuse_protected",
    "relative_posix",
    "replace_in_workspace",
    "resolve_in_workspace",
    "sha256_bytes",
    "sha256_file",
    "walk_workspace",
    "write_atomically",
    "write_in_workspace",
    "write_target",
]
