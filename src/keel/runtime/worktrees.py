"""Isolated workspaces for subagents: a git worktree, or a copy, of the parent's current state.

A git parent gets ``git worktree add --detach`` of a commit made from its *current*
state: the tracked files as they are (staged or not) and the untracked files git
does not ignore. That commit is written through a temporary index file
(``GIT_INDEX_FILE``), so the user's branches, index, stash and working tree are never
touched; the only writes to the parent's repository are unreferenced objects and
the worktree's own entry under ``.git/worktrees/``, which :meth:`remove` deletes.
A parent that is not a git repository is copied (links stay links, ``.keel/`` is left
out) and given a private git directory *outside* the copy, so both kinds answer
:meth:`IsolatedWorkspace.patch` the same way: a git binary patch (edits, new and
deleted files, binary content, mode changes) from the start to now.

Every git call is hardened (``keel.tools.patches.Git``): the workspace's
configuration, hooks, fsmonitor and filter drivers never run. The child's own
``.git`` file is never trusted: git is pointed at the recorded directories.
``.keel/`` is never part of a snapshot, so a patch never carries it.

Each workspace ``root/NAME`` has a record ``root/NAME.json`` beside it (outside the
workspace, so nothing run inside it can change it): :func:`reopen` rebuilds the
:class:`IsolatedWorkspace` from it in another process (a worker resuming a run, or
``keel gc``), and :meth:`IsolatedWorkspace.remove` deletes it with the rest.

Isolated workspaces are made for a subagent that asks for one (``agent_spawn``) and by
``keel worker`` for a task that asks for one (``keel tasks create --isolated``). Still
to add: a child's sandbox keeps the worktree's ``.git`` pointer target
(``<parent>/.git/worktrees/NAME``) read-only, and these git calls run confined like
the harness's other git.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from keel.core.errors import ToolError, UsageError
from keel.tools.patches import PATCH_DIFF_FLAGS, Git

GIT_WORKTREE = "git-worktree"
COPY = "copy"
LEFT_OUT = ".keel"  # the harness's own files: never copied, never in a patch
RECORD_SUFFIX = ".json"  # root/NAME.json describes the workspace root/NAME
BASE_MESSAGE = "keel: isolated workspace start\n"
# Writing thousands of files is bound by the file system's latency, not the CPU: parallel
# checkout with more workers than cores took a 10,000-file worktree from ~2.5 s to ~0.8 s.
PARALLEL_CHECKOUT = (("checkout.workers", "8"), ("checkout.thresholdForParallelism", "100"))
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


@dataclass(frozen=True, slots=True, kw_only=True)
class IsolatedWorkspace:
    """A child's workspace: ``path`` to work in, ``base`` the commit it started from."""

    path: Path
    kind: str  # GIT_WORKTREE or COPY
    base: str  # commit id of the parent's state at creation
    parent: Path
    git_dir: Path  # the worktree's own git directory, or the copy's private one
    common_dir: Path | None  # the parent's repository (git worktree only)

    def patch(self) -> bytes:
        """Everything changed since ``base`` as a git binary patch; b"" when nothing did."""
        git = Git(cwd=self.path, git_dir=self.git_dir, work_tree=self.path).hardened()
        seed = self.git_dir / "index"
        tree = _snapshot_tree(git, seed, private=self.kind == COPY)
        return git.must("diff", *PATCH_DIFF_FLAGS, self.base, tree, "--", doing="diffing")

    def remove(self) -> None:
        """Delete the workspace, its git records and its record; harmless when already gone."""
        if self.kind == GIT_WORKTREE and self.common_dir is not None:
            _remove_worktree(self.common_dir, self.path, self.git_dir)
        else:
            _remove_tree(self.path)
            _remove_tree(self.git_dir)
        _record_path(self.path).unlink(missing_ok=True)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: what ``RunOptions.isolated`` and the record beside it hold."""
        return {
            "kind": self.kind,
            "base": self.base,
            "parent": str(self.parent),
            "path": str(self.path),
            "git_dir": str(self.git_dir),
            "common_dir": None if self.common_dir is None else str(self.common_dir),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> IsolatedWorkspace:
        """Inverse of :meth:`to_dict`; UsageError when a field is missing or mistyped."""
        try:
            kind, common = str(d["kind"]), d.get("common_dir")
            if kind not in (GIT_WORKTREE, COPY):
                raise ValueError(f"unknown kind {kind!r}")
            return cls(
                path=Path(str(d["path"])),
                kind=kind,
                base=str(d["base"]),
                parent=Path(str(d["parent"])),
                git_dir=Path(str(d["git_dir"])),
                common_dir=None if common is None else Path(str(common)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise UsageError(f"not an isolated workspace record: {exc}") from None


def cache_dir() -> Path:
    """Keel's per-user cache directory (``$XDG_CACHE_HOME/keel``, else ``~/.cache/keel``)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "keel"


def default_root(parent: Path) -> Path:
    """Where ``parent``'s isolated workspaces live: a per-user cache directory, one per parent."""
    digest = hashlib.sha256(str(parent.resolve()).encode()).hexdigest()[:16]
    return cache_dir() / "workspaces" / digest


def create(parent: Path, *, root: Path, name: str) -> IsolatedWorkspace:
    """A new isolated workspace ``root/name`` holding ``parent``'s current state.

    UsageError for a bad name, a root inside the parent, or a name already used;
    ToolError when git fails (nothing is left behind then).
    """
    parent = parent.resolve()
    if not _NAME.fullmatch(name) or name.endswith((".git", RECORD_SUFFIX)):
        raise UsageError(
            f"isolated workspace name {name!r} must be letters, digits, '.', '_' or '-' "
            f"(at most 100, not starting with '.' or '-', not ending in .git or {RECORD_SUFFIX})"
        )
    if not parent.is_dir():
        raise UsageError(f"workspace {parent} is not a directory")
    root.mkdir(parents=True, exist_ok=True)
    root = root.resolve()
    if root == parent or root.is_relative_to(parent):
        raise UsageError(f"isolated workspaces must live outside the workspace; {root} is inside")
    path = root / name
    if path.exists() or path.is_symlink() or (root / f"{name}.git").exists():
        raise UsageError(f"isolated workspace {path} already exists; choose another name")
    try:
        if (parent / ".git").exists():
            made = _create_worktree(parent, path)
        else:
            made = _create_copy(parent, path, root / f"{name}.git")
        _write_record(made)
        return made
    except BaseException:
        _discard(parent, path, root / f"{name}.git")
        raise


def reopen(path: Path) -> IsolatedWorkspace | None:
    """The isolated workspace made at ``path`` (by any process), from its record;
    None when there is none (never made, already removed, or the record is unreadable)."""
    path = Path(os.path.abspath(path))
    try:
        data = json.loads(_record_path(path).read_text(encoding="utf-8"))
        found = IsolatedWorkspace.from_dict(data)
    except (OSError, ValueError, UsageError):
        return None
    return found if found.path == path else None


def remove_stale(parent: Path, root: Path, *, keep: set[str]) -> list[str]:
    """Remove every isolated workspace of ``parent`` under ``root`` not named in ``keep``
    (what a crash left behind); the names removed, sorted. For ``keel gc``."""
    parent = parent.resolve()
    if not root.is_dir():
        return []
    root = root.resolve()
    removed: set[str] = set()
    common = _common_dir(parent) if (parent / ".git").exists() else None
    if common is not None:
        for admin, path in _registered_worktrees(common):
            if path.parent == root and path.name not in keep:
                _remove_worktree(common, path, admin)
                removed.add(path.name)
    for entry in root.iterdir():
        name = entry.name.removesuffix(".git").removesuffix(RECORD_SUFFIX)
        if name in keep:
            continue
        _remove_tree(entry)
        removed.add(name)
    return sorted(removed)


# --- git worktree --------------------------------------------------------------------


def _create_worktree(parent: Path, path: Path) -> IsolatedWorkspace:
    git = Git(cwd=parent, git_dir=parent / ".git", work_tree=parent).hardened()
    index = Path(git.must("rev-parse", "--git-path", "index", doing="finding the index").decode())
    tree = _snapshot_tree(git, index if index.is_absolute() else parent / index, private=False)
    head = git.run("rev-parse", "-q", "--verify", "HEAD^{commit}").stdout.decode().strip()
    lineage = ["-p", head] if head else []
    base = _commit(git, tree, lineage)
    common = _common_dir(parent)
    admin_git = Git(cwd=path.parent, git_dir=common).hardened()
    admin_git = replace(admin_git, overrides=(*admin_git.overrides, *PARALLEL_CHECKOUT))
    admin_git.must(
        "worktree", "add", "--detach", "-q", str(path), base, doing="creating the worktree"
    )
    link = (path / ".git").read_text(encoding="utf-8").strip()
    if not link.startswith("gitdir: "):
        raise ToolError(f"git wrote an unexpected {path / '.git'}: {link[:200]!r}")
    return IsolatedWorkspace(
        path=path,
        kind=GIT_WORKTREE,
        base=base,
        parent=parent,
        git_dir=Path(link.removeprefix("gitdir: ")),
        common_dir=common,
    )


def _common_dir(parent: Path) -> Path:
    git = Git(cwd=parent, git_dir=parent / ".git", work_tree=parent)
    common = git.must("rev-parse", "--git-common-dir", doing="finding the repository").decode()
    found = Path(common.strip())
    return (found if found.is_absolute() else parent / found).resolve()


def _registered_worktrees(common: Path) -> list[tuple[Path, Path]]:
    """(git directory, work tree) of each linked worktree the repository records."""
    found: list[tuple[Path, Path]] = []
    admin_root = common / "worktrees"
    if not admin_root.is_dir():
        return found
    for admin in sorted(admin_root.iterdir()):
        try:
            dot_git = (admin / "gitdir").read_text(encoding="utf-8").strip()
        except OSError:
            continue
        found.append((admin, Path(dot_git).parent))
    return found


def _discard(parent: Path, path: Path, copy_git_dir: Path) -> None:
    """Undo a creation that failed part way: the directories and any worktree entry."""
    if (parent / ".git").exists():
        common = _common_dir(parent)
        for admin, registered in _registered_worktrees(common):
            if registered == path:
                _remove_worktree(common, path, admin)
    _remove_tree(path)
    _remove_tree(copy_git_dir)
    _record_path(path).unlink(missing_ok=True)


def _remove_worktree(common: Path, path: Path, admin: Path) -> None:
    if path.exists():
        git = Git(cwd=common.parent, git_dir=common)
        git.run("worktree", "remove", "--force", "--force", str(path))
    _remove_tree(path)
    try:
        recorded = (admin / "gitdir").read_text(encoding="utf-8").strip()
    except OSError:
        return
    if Path(recorded).parent == path:  # only the entry of this workspace, no other
        _remove_tree(admin)


# --- copy ----------------------------------------------------------------------------


def _create_copy(parent: Path, path: Path, git_dir: Path) -> IsolatedWorkspace:
    def left_out(folder: str, names: list[str]) -> list[str]:
        return [LEFT_OUT] if Path(folder) == parent and LEFT_OUT in names else []

    try:
        shutil.copytree(parent, path, symlinks=True, ignore=left_out)
    except (OSError, shutil.Error) as exc:
        raise ToolError(f"copying {parent} to {path} failed: {exc}") from None
    git = Git(cwd=path, git_dir=git_dir, work_tree=path)
    git.must("init", "-q", doing="creating the copy's private repository")
    git = git.hardened()
    tree = _snapshot_tree(git, git_dir / "index", private=True)
    return IsolatedWorkspace(
        path=path,
        kind=COPY,
        base=_commit(git, tree, []),
        parent=parent,
        git_dir=git_dir,
        common_dir=None,
    )


# --- shared --------------------------------------------------------------------------


def _snapshot_tree(git: Git, index: Path, *, private: bool) -> str:
    """The tree of the work tree as it is now: tracked and untracked, not ignored, not .keel.

    A private index is used in place; anyone else's is copied first (for its cached
    file stats) to a temporary file outside every work tree, and the copy deleted.
    """
    if private:
        return _write_tree(git, index)
    fd, scratch = tempfile.mkstemp(prefix="keel-index-")
    os.close(fd)
    temporary = Path(scratch)
    try:
        try:
            shutil.copyfile(index, temporary)
        except FileNotFoundError:
            temporary.unlink()  # no index yet: git starts an empty one
        return _write_tree(git, temporary)
    finally:
        temporary.unlink(missing_ok=True)
        Path(f"{temporary}.lock").unlink(missing_ok=True)


def _write_tree(git: Git, index: Path) -> str:
    indexed = Git(
        cwd=git.work_tree or git.cwd,
        git_dir=git.git_dir,
        work_tree=git.work_tree,
        index_file=index,
        overrides=git.overrides,
    )
    indexed.must("add", "-A", "--", ".", doing="snapshotting the workspace")
    indexed.must(
        "rm", "--cached", "-r", "-q", "--ignore-unmatch", "--", LEFT_OUT, doing="leaving out .keel"
    )
    return indexed.must("write-tree", doing="writing the snapshot").decode().strip()


def _commit(git: Git, tree: str, lineage: list[str]) -> str:
    out = git.must("commit-tree", tree, *lineage, stdin=BASE_MESSAGE.encode(), doing="committing")
    return out.decode().strip()


def _record_path(path: Path) -> Path:
    return path.with_name(path.name + RECORD_SUFFIX)


def _write_record(ws: IsolatedWorkspace) -> None:
    record = _record_path(ws.path)
    scratch = record.with_name(record.name + ".tmp")
    scratch.write_text(json.dumps(ws.to_dict(), sort_keys=True), encoding="utf-8")
    os.replace(scratch, record)


def _remove_tree(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink(missing_ok=True)
    elif path.is_dir():
        shutil.rmtree(path, ignore_errors=True)


__all__ = [
    "COPY",
    "GIT_WORKTREE",
    "IsolatedWorkspace",
    "cache_dir",
    "create",
    "default_root",
    "remove_stale",
    "reopen",
]
