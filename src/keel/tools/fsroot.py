"""Paths resolved from a directory descriptor of the workspace, one component at a time.

Checking a path by name and then opening it by name leaves a gap: a command can
swap a directory for a symbolic link in between, and the open lands outside the
workspace. Here nothing is opened by a full name. ``WorkspaceRoot`` holds a
descriptor of the workspace's real directory; ``locate`` walks a path from it
with ``openat``-style calls (``O_NOFOLLOW`` on every component), reads each
symbolic link it meets with ``readlink`` relative to its directory's descriptor
and follows it only while the resolution stays inside the workspace. The result
(a ``Spot``) holds a descriptor of the real directory the path ends in, and the
final open, create or rename happens relative to that descriptor with
``O_NOFOLLOW``: a link swapped in later is refused or replaced, never followed.

The semantics are those of ``realpath`` confined to the workspace: links inside
work (relative or absolute, dangling ones included), ``..`` is applied to where a
link really led, and anything that would leave the workspace is refused. A
detour through the workspace's own parent directories (``up -> ..`` then
``up/ws/x``) is followed lexically along the workspace's real path; it never
opens anything outside.

Paths come as the model spells them (``keel.core.pathnames``: ``\\xHH`` for a byte
of a name that is not UTF-8, or for a control character) unless ``spelled=False``
says they are already the OS's names (the harness's own, or names a walk found);
a spelling no file can have (NUL, a lone surrogate, a component over 255 bytes) is
a ToolError before anything is opened. ``Spot.rel`` and ``Opened.rel`` are OS
names; show them with ``shown_path``. Reads are bounded by the caller
(``read_at_most``).
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from types import TracebackType

from keel.core.errors import ToolError
from keel.core.pathnames import shown_path, spelled_path

MAX_LINKS = 40  # what Linux allows in one path resolution (ELOOP beyond)
ATTEMPTS = 3  # resolutions of one path that a concurrent change may spoil before we give up
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
# O_PATH needs no read permission on intermediate directories (Linux); elsewhere O_RDONLY.
_SEARCH = getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY | os.O_NOFOLLOW | _CLOEXEC
LIST_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | _CLOEXEC  # for scandir
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | _NONBLOCK | _CLOEXEC  # a FIFO cannot block
CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _CLOEXEC
_NOT_A_DIRECTORY = (errno.ENOTDIR, errno.ELOOP, errno.EMLINK)


class WorkspaceRoot:
    """An open descriptor of the workspace's real directory; paths are resolved from it.

    Use as a context manager; what ``locate`` and ``open`` hand out (``Spot``,
    ``Opened``) holds descriptors too and is closed by its own ``with``.
    """

    def __init__(self, workspace: Path) -> None:
        self.workspace = workspace
        self.real = os.path.realpath(workspace)
        self._prefixes = {self.real}
        if os.path.isabs(workspace):
            self._prefixes.add(os.path.normpath(workspace))
        self.parts = tuple(p for p in self.real.split("/") if p)
        self.fd = os.open(self.real, os.O_RDONLY | os.O_DIRECTORY | _CLOEXEC)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> WorkspaceRoot:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # --- resolution ----------------------------------------------------------------

    def relative_parts(self, path: str, *, spelled: bool = True) -> list[str]:
        """``path`` (relative, or absolute inside the workspace) as components from the root.

        Refuses an empty path, a NUL, a spelling no file can have (``spelled``) and
        anything lexically outside the workspace.
        """
        if not path or not path.strip():
            raise ToolError("path is empty; give a path relative to the workspace")
        if "\x00" in path:
            raise ToolError(f"path {path!r} contains a NUL character")
        if spelled:
            path = spelled_path(path)
        if os.path.isabs(path):
            lexical = os.path.normpath(path)
            prefix = next((p for p in self._prefixes if _is_within(lexical, p)), None)
            if prefix is None:
                raise ToolError(f"path {path!r} is outside the workspace {self.real}")
            # the raw spelling keeps "link/.." to be judged where the link leads
            raw = path if _is_within(path.rstrip("/") or "/", prefix) else lexical
            return [p for p in raw[len(prefix) :].split("/") if p]
        if not _is_within(os.path.normpath(os.path.join(self.real, path)), self.real):
            raise ToolError(f"path {path!r} is outside the workspace {self.real}")
        return [p for p in path.split("/") if p]

    def locate(self, path: str, *, spelled: bool = True) -> Spot:
        """Where ``path`` really is, every symbolic link on it (the last one too) followed.

        Raises ToolError for paths leading outside the workspace and for link loops;
        a missing path is not an error here (``Spot.found`` says so). An entry that
        changes kind while it is being looked at is looked at again.
        """
        for _ in range(ATTEMPTS - 1):
            with suppress(_Changed):
                return self._locate_once(path, spelled)
        return self._locate_once(path, spelled)

    def open(self, path: str, *, spelled: bool = True) -> Opened | None:
        """Locate ``path`` and open what it ends in; None when it does not exist.

        The final open uses ``O_NOFOLLOW`` and ``O_NONBLOCK`` (a FIFO cannot block);
        when a link or nothing takes the entry's place in between, the path is
        resolved again, so the answer is always where the path leads at some instant.
        """
        for _ in range(ATTEMPTS):
            with self.locate(path, spelled=spelled) as spot:
                if not spot.found:
                    return None
                name = spot.tail[-1] if spot.tail else "."
                try:
                    fd = os.open(name, READ_FLAGS, dir_fd=spot.dir_fd)
                except OSError as exc:
                    if exc.errno in (errno.ENOENT, *_NOT_A_DIRECTORY):
                        continue  # replaced since it was located
                    raise ToolError(f"cannot open {path!r}: {exc.strerror}") from None
                return Opened(rel=spot.rel, fd=fd, st=os.fstat(fd))
        raise _Changed(f"{path!r} kept changing while it was being opened; try again")

    def _locate_once(self, path: str, spelled: bool) -> Spot:
        todo = self.relative_parts(path, spelled=spelled)
        todo.reverse()  # a stack: the next component is todo[-1]
        stack: list[tuple[int, str]] = []  # (descriptor, name) of each directory below the root
        missing: list[tuple[str, bool]] = []  # (name, a non-directory stands there)
        last_exists = False
        outside: int | None = None  # depth along the root's real path while on a detour
        links = 0
        try:
            while todo:
                name = todo.pop()
                if name in ("", "."):
                    continue
                if outside is not None:
                    outside = self._detour(path, outside, name)
                elif missing:
                    if name == "..":
                        missing.pop()
                    else:
                        missing.append((name, False))
                elif name == "..":
                    if stack:
                        os.close(stack.pop()[0])
                    elif self.parts:
                        outside = len(self.parts) - 1
                else:
                    parent = stack[-1][0] if stack else self.fd
                    step = self._step(parent, name, last=not todo)
                    if isinstance(step, int):
                        stack.append((step, name))
                    elif isinstance(step, _Kind):
                        last_exists = step is _Kind.ENTRY
                        missing.append((name, step is _Kind.FILE))
                    else:
                        links += 1
                        if links > MAX_LINKS:
                            raise ToolError(
                                f"path {path!r} has too many levels of symbolic links "
                                "(a link loop?)"
                            )
                        target = self._within_prefix(step)
                        if os.path.isabs(step):
                            while stack:
                                os.close(stack.pop()[0])
                            outside = 0 if os.path.isabs(target) else None
                        todo.extend(reversed(target.split("/")))
            if outside is not None:
                raise self._escape(path)
        except BaseException:
            for fd, _ in stack:
                os.close(fd)
            raise
        for fd, _ in stack[:-1]:
            os.close(fd)
        return Spot(
            root=self,
            dir_fd=stack[-1][0] if stack else self.fd,
            parts=tuple(name for _, name in stack),
            tail=tuple(name for name, _ in missing),
            found=not missing or (len(missing) == 1 and last_exists),
            blocked=any(blocker for _, blocker in missing),
        )

    def _step(self, parent: int, name: str, *, last: bool) -> int | str | _Kind:
        """One component: a directory's descriptor, a link's target, or what else is there.

        The last component is not opened here (the caller opens or creates it);
        an entry that changes kind while it is looked at is looked at again.
        """
        for _ in range(ATTEMPTS):
            if not last:
                try:
                    return os.open(name, _SEARCH, dir_fd=parent)
                except OSError as exc:
                    if exc.errno == errno.ENOENT:
                        return _Kind.MISSING
                    if exc.errno not in _NOT_A_DIRECTORY:
                        raise ToolError(f"cannot open {name!r}: {exc.strerror}") from None
            try:
                return os.readlink(name, dir_fd=parent)
            except OSError as exc:
                if exc.errno == errno.ENOENT:
                    return _Kind.MISSING
                if exc.errno != errno.EINVAL:
                    raise ToolError(f"cannot open {name!r}: {exc.strerror}") from None
            if last:
                return _Kind.ENTRY
            try:
                mode = os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode
            except FileNotFoundError:
                return _Kind.MISSING
            if not (stat.S_ISDIR(mode) or stat.S_ISLNK(mode)):
                return _Kind.FILE
            # a directory or a link again: it was swapped while we looked; look once more
        raise _Changed(f"{name!r} kept changing while it was being resolved; try again")

    def _detour(self, path: str, depth: int, name: str) -> int | None:
        """One component on a detour above the root: only the way back in is allowed."""
        if name == "..":
            return max(depth - 1, 0)
        if depth < len(self.parts) and name == self.parts[depth]:
            return None if depth + 1 == len(self.parts) else depth + 1
        raise self._escape(path)

    def _within_prefix(self, target: str) -> str:
        """An absolute link target below the workspace as a relative one; else unchanged."""
        for prefix in self._prefixes:
            if target == prefix or target.startswith(prefix.rstrip("/") + "/"):
                return target[len(prefix) :].lstrip("/") or "."
        return target

    def _escape(self, path: str) -> ToolError:
        try:  # for the message only
            shown = shown_path(os.path.realpath(os.path.join(self.real, path)))
        except (OSError, ValueError):  # a link changed under realpath's own lstat/readlink
            shown = "a place outside"
        return ToolError(
            f"path {path!r} leads outside the workspace {self.real} through a symbolic link "
            f"(it resolves to {shown})"
        )

    # --- opening -------------------------------------------------------------------

    @contextmanager
    def parent_for_write(self, spot: Spot) -> Iterator[int]:
        """The descriptor of ``spot``'s parent directory, creating missing ones by descriptor."""
        fd = spot.dir_fd
        owned: list[int] = []
        try:
            for name in spot.tail[:-1]:
                with suppress(FileExistsError):
                    os.mkdir(name, 0o777, dir_fd=fd)
                try:
                    fd = os.open(name, _SEARCH, dir_fd=fd)
                except OSError as exc:
                    raise ToolError(
                        f"cannot create {spot.rel}: {name!r} changed while it was being made "
                        f"({exc.strerror}); try again"
                    ) from None
                owned.append(fd)
            yield fd
        finally:
            for opened in owned:
                os.close(opened)


@dataclass(slots=True, kw_only=True)
class Spot:
    """A resolved path: an open descriptor of the real directory it was followed to.

    ``tail`` names what lies below ``dir_fd``: () when the path is that directory,
    (name,) for an entry in it (existing or not), more names when directories are
    missing. ``blocked``: a file stands where a directory is needed.
    """

    root: WorkspaceRoot
    dir_fd: int
    parts: tuple[str, ...]  # the real names from the workspace root down to dir_fd
    tail: tuple[str, ...]
    found: bool
    blocked: bool = False
    _closed: bool = field(default=False, repr=False)

    @property
    def rel(self) -> str:
        """The real workspace-relative posix path; "." for the workspace itself."""
        return "/".join(self.parts + self.tail) or "."

    @property
    def shown(self) -> str:
        """``rel`` as the model is shown it (and may spell it back)."""
        return shown_path(self.rel)

    def lstat(self) -> os.stat_result | None:
        """The entry's own status (a link is not followed), or None when it does not exist."""
        if not self.found:
            return None
        if not self.tail:
            return os.fstat(self.dir_fd)
        try:
            return os.stat(self.tail[-1], dir_fd=self.dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return None

    def is_dir(self) -> bool:
        st = self.lstat()
        return st is not None and stat.S_ISDIR(st.st_mode)

    def close(self) -> None:
        if not self._closed and self.dir_fd != self.root.fd:
            os.close(self.dir_fd)
        self._closed = True

    def __enter__(self) -> Spot:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


@dataclass(frozen=True, slots=True, kw_only=True)
class Opened:
    """An open descriptor of what a path led to, with its fstat; a context manager."""

    rel: str  # the real workspace-relative posix path
    fd: int
    st: os.stat_result

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.st.st_mode)

    @property
    def is_file(self) -> bool:
        return stat.S_ISREG(self.st.st_mode)

    @property
    def name(self) -> str:
        return self.rel.rsplit("/", 1)[-1]

    @property
    def shown(self) -> str:
        """``rel`` as the model is shown it (and may spell it back)."""
        return shown_path(self.rel)

    def read(self, limit: int) -> bytes:
        """At most ``limit`` bytes from the start (``limit + 1`` tells the caller it is more)."""
        return read_at_most(self.fd, limit)

    def __enter__(self) -> Opened:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        os.close(self.fd)


def open_regular(dir_fd: int, name: str) -> tuple[int, int] | None:
    """(descriptor, size) of the regular file ``name`` in ``dir_fd``, opened without
    following a link and without blocking; None when something else stands there now.
    """
    try:
        fd = os.open(name, READ_FLAGS, dir_fd=dir_fd)
    except OSError:
        return None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        return None
    return fd, st.st_size


def read_at_most(fd: int, limit: int) -> bytes:
    """The next bytes of the open file ``fd``, at most ``limit`` of them (fewer at its end).

    Memory stays within ``limit`` whatever the file's size, also when it grows while
    it is read.
    """
    chunks: list[bytes] = []
    left = limit
    while left > 0 and (chunk := os.read(fd, min(left, 1 << 20))):
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


class _Kind(Enum):
    """What a component is when it is neither a directory to enter nor a link to follow."""

    MISSING = "missing"  # nothing by that name
    ENTRY = "entry"  # the last component: exists, is not a link
    FILE = "file"  # not a directory, where a directory is needed


class _Changed(ToolError):
    """An entry changed kind while one resolution looked at it; resolving again may settle."""


def _is_within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


__all__ = [
    "ATTEMPTS",
    "CREATE_FLAGS",
    "LIST_FLAGS",
    "MAX_LINKS",
    "READ_FLAGS",
    "Opened",
    "Spot",
    "WorkspaceRoot",
    "open_regular",
    "read_at_most",
]
