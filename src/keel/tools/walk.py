"""Directory walks by descriptor: what list_dir, glob and grep see of a tree.

A walk opens each directory relative to its parent's descriptor with
``O_NOFOLLOW | O_DIRECTORY``, so a directory swapped for a symbolic link while
the walk runs is skipped, never entered; symbolic links are reported, never
descended into; version-control internals are skipped; entries the caller's
``listable`` refuses are reported as hidden and never descended into or opened.
A walk calls ``check`` before each directory it reads and each entry it yields
(the caller's deadline: raising there stops the walk and closes what it opened),
and enters a directory only when ``descend`` (if given) says something below it
may be wanted.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from keel.core.errors import ToolError
from keel.tools.fsroot import LIST_FLAGS, WorkspaceRoot

SKIPPED_DIRS = frozenset({".git", ".hg", ".svn"})  # version-control internals: never walked


@dataclass(frozen=True, slots=True)
class WalkEntry:
    """One entry met while walking: ``kind`` is "file", "dir", "symlink" or "other".

    ``hidden`` entries (refused by ``listable``) carry nothing but their kind and
    must be counted, not shown. ``dir_fd`` and ``name`` open the entry without a
    path lookup; the descriptor is valid until the walk moves past its directory.
    """

    rel: str  # workspace-relative posix path
    kind: str
    depth: int  # 1 for a direct child of the start directory
    size: int = 0
    inside: bool = True  # for symlinks: does the target resolve inside the workspace?
    target: str = ""  # for symlinks leading inside: the real workspace-relative target
    hidden: bool = False
    name: str = field(default="", compare=False)
    dir_fd: int = field(default=-1, compare=False, repr=False)
    root: str = field(default="", compare=False, repr=False)  # the workspace's real path

    @property
    def path(self) -> Path:
        """The entry's name as a path (to show; open it with ``dir_fd`` and ``name``)."""
        return Path(self.root, self.rel)


def walk_tree(
    root: WorkspaceRoot,
    dir_fd: int,
    rel: str,
    *,
    max_depth: int | None = None,
    listable: Callable[[str], bool] | None = None,
    skip: frozenset[str] = SKIPPED_DIRS,
    check: Callable[[], None] | None = None,
    descend: Callable[[WalkEntry], bool] | None = None,
) -> Iterator[WalkEntry]:
    """Entries below the directory ``dir_fd`` (workspace path ``rel``), depth first.

    Each directory's entries come in name order before its subdirectories are
    entered. ``dir_fd`` stays the caller's; the walk closes what it opens, also
    when the caller stops early or ``check`` raises.
    """
    frames: list[tuple[int, str, int, list[str]]] = []
    rules = _Rules(max_depth, listable, skip, check or _unchecked, descend)
    try:
        subdirs = yield from _entries(root, dir_fd, rel, 1, rules)
        frames.append((-1, rel, 1, subdirs))
        while frames:
            fd, where, depth, pending = frames[-1]
            if not pending:
                frames.pop()
                if fd >= 0:
                    os.close(fd)
                continue
            name = pending.pop()
            try:
                child = os.open(name, LIST_FLAGS, dir_fd=dir_fd if fd < 0 else fd)
            except OSError:
                continue  # replaced by a link or removed since it was listed
            child_rel = _join(where, name)
            frames.append((child, child_rel, depth + 1, []))
            subdirs = yield from _entries(root, child, child_rel, depth + 1, rules)
            frames[-1] = (child, child_rel, depth + 1, subdirs)
    finally:
        for fd, *_ in frames:
            if fd >= 0:
                os.close(fd)


@dataclass(frozen=True, slots=True)
class _Rules:
    max_depth: int | None
    listable: Callable[[str], bool] | None
    skip: frozenset[str]
    check: Callable[[], None]
    descend: Callable[[WalkEntry], bool] | None


def _unchecked() -> None:
    return None


def _entries(
    root: WorkspaceRoot, fd: int, rel: str, depth: int, rules: _Rules
) -> Generator[WalkEntry, None, list[str]]:
    """Yield one directory's entries; return its subdirectories to enter, last first."""
    rules.check()
    listable, max_depth = rules.listable, rules.max_depth
    try:
        with os.scandir(fd) as it:
            found = sorted(it, key=lambda e: e.name)
    except OSError:
        return []
    base = root.real
    subdirs: list[str] = []
    for entry in found:
        rules.check()
        name = entry.name
        entry_rel = _join(rel, name)
        shown = listable is None or listable(entry_rel)
        if entry.is_symlink():
            target = link_target(root, entry_rel) if shown else None
            if target is not None and listable is not None and not listable(target):
                shown = False  # a link to a hidden path is as hidden as its target
            yield WalkEntry(
                entry_rel,
                "symlink",
                depth,
                inside=target is not None,
                target=target or "",
                hidden=not shown,
                name=name,
                dir_fd=fd,
                root=base,
            )
        elif entry.is_dir(follow_symlinks=False):
            if name in rules.skip:
                continue
            item = WalkEntry(
                entry_rel, "dir", depth, hidden=not shown, name=name, dir_fd=fd, root=base
            )
            yield item
            if (
                shown
                and (max_depth is None or depth < max_depth)
                and (rules.descend is None or rules.descend(item))
            ):
                subdirs.append(name)
        else:
            kind = "file" if entry.is_file(follow_symlinks=False) else "other"
            try:
                size = entry.stat(follow_symlinks=False).st_size if shown else 0
            except OSError:
                continue  # removed since it was listed
            yield WalkEntry(
                entry_rel, kind, depth, size, hidden=not shown, name=name, dir_fd=fd, root=base
            )
    subdirs.reverse()
    return subdirs


def link_target(root: WorkspaceRoot, rel: str) -> str | None:
    """The real workspace-relative path the link ``rel`` leads to; None when it leads out."""
    try:
        with root.locate(rel, spelled=False) as spot:
            return spot.rel
    except ToolError:
        return None


def _join(rel: str, name: str) -> str:
    return name if rel == "." else f"{rel}/{name}"


__all__ = ["SKIPPED_DIRS", "WalkEntry", "link_target", "walk_tree"]
