"""The workspace boundary: every file tool resolves paths here and walks trees from here.

Guarantees: a path the model names is accepted only if its fully resolved location
(every symbolic link along it followed, dangling ones included) lies inside the
workspace; walks never descend through symbolic links and never yield anything
that resolves outside the workspace; writes replace files atomically, so a file
always has either its old or its new content (what VERIFY_THEN_CONTINUE relies on).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from keel.core.errors import ToolError

SKIPPED_DIRS = frozenset({".git", ".hg", ".svn"})  # version-control internals: never walked


def resolve_in_workspace(workspace: Path, path: str, *, for_write: bool) -> Path:
    """The real location of ``path`` (relative to the workspace or absolute) inside it.

    Refuses ``..`` escapes, absolute paths outside and symbolic links leading out
    with a ToolError naming the path and the workspace. For a write to a new file the
    deepest existing parent is resolved and the rest appended; writing onto a
    directory or onto the workspace itself is refused.
    """
    root = workspace.resolve()
    if not path or not path.strip():
        raise ToolError("path is empty; give a path relative to the workspace")
    if "\x00" in path:
        raise ToolError(f"path {path!r} contains a NUL character")
    candidate = Path(path) if os.path.isabs(path) else root / path
    lexical = Path(os.path.normpath(candidate))
    if not _is_within(lexical, root):
        raise ToolError(f"path {path!r} is outside the workspace {root}")
    real = Path(os.path.realpath(candidate))
    if not _is_within(real, root):
        raise ToolError(
            f"path {path!r} leads outside the workspace {root} through a symbolic link "
            f"(it resolves to {real})"
        )
    if for_write:
        if real == root:
            raise ToolError(f"path {path!r} is the workspace itself, not a file")
        if real.is_dir():
            raise ToolError(f"path {path!r} is a directory; give a file path")
    return real


def relative_posix(workspace: Path, real: Path) -> str:
    """``real`` (inside the workspace) as a workspace-relative posix path; "." for the root."""
    return real.relative_to(workspace.resolve()).as_posix() or "."


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file's bytes, read in chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def current_hash(workspace: Path, path: str) -> str:
    """sha256 of the workspace file ``path`` now; "" when it does not exist."""
    real = resolve_in_workspace(workspace, path, for_write=True)
    return sha256_file(real) if real.is_file() else ""


def write_atomically(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` in one rename, keeping an existing file's mode."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.keel-{uuid.uuid4().hex[:8]}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        with contextlib.suppress(FileNotFoundError):
            os.chmod(tmp, stat.S_IMODE(path.stat().st_mode))
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@dataclass(frozen=True, slots=True)
class WalkEntry:
    """One entry met while walking: ``kind`` is "file", "dir", "symlink" or "other"."""

    rel: str  # workspace-relative posix path
    path: Path
    kind: str
    depth: int  # 1 for a direct child of the start directory
    size: int = 0
    inside: bool = True  # for symlinks: does the target resolve inside the workspace?


def walk_workspace(
    workspace: Path, start: Path, *, max_depth: int | None = None
) -> Iterator[WalkEntry]:
    """Entries under ``start``, directory by directory in name order, without following links.

    Symbolic links are yielded as "symlink" entries (``inside`` tells where they
    lead) and never descended into; version-control directories are skipped.
    """
    root = workspace.resolve()
    stack: list[tuple[Path, int]] = [(start, 1)]
    while stack:
        directory, depth = stack.pop()
        try:
            with os.scandir(directory) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError:
            continue
        subdirs: list[tuple[Path, int]] = []
        for entry in entries:
            path = Path(entry.path)
            rel = path.relative_to(root).as_posix()
            if entry.is_symlink():
                inside = _is_within(Path(os.path.realpath(path)), root)
                yield WalkEntry(rel, path, "symlink", depth, inside=inside)
            elif entry.is_dir(follow_symlinks=False):
                if entry.name in SKIPPED_DIRS:
                    continue
                yield WalkEntry(rel, path, "dir", depth)
                if max_depth is None or depth < max_depth:
                    subdirs.append((path, depth + 1))
            elif entry.is_file(follow_symlinks=False):
                size = entry.stat(follow_symlinks=False).st_size
                yield WalkEntry(rel, path, "file", depth, size=size)
            else:
                yield WalkEntry(rel, path, "other", depth)
        stack.extend(reversed(subdirs))


def _is_within(path: Path, root: Path) -> bool:
    return path == root or root in path.parents
