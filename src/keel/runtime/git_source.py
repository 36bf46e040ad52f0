"""A run whose workspace is a git source (``--workspace-git URL[@REF]``), not a directory.

Such a run can be executed by a worker on any machine that shares the store: the process
that executes it fetches the source into a mirror of its own (``cache_dir()/git/``),
checks ``REF`` (default: the source's HEAD) out as a detached worktree at the run's
workspace path, and removes that worktree when the run completes (a run that failed
keeps it, for a person to look at; its path is the run's workspace). The path is the same
string on every machine (``KEEL_GIT_WORKSPACES``, default ``/var/tmp/keel-git-workspaces``,
then one random name per run), so the stored run needs no translation. The run's
changes come back in the store as the diff artifact its verification records; the
source itself is never written (nothing is pushed, no branch is made); the mirror stays
in the cache for the next run of the same source.

A resume on the machine that began the run finds its worktree as it was; a resume on
another machine checks ``REF`` out afresh, and the resume's own check records every
file the run had changed that differs now (``workspace_changed``), so the model is told.
Git runs hardened (no system or global configuration, no hooks, filter drivers emptied).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from keel.core.errors import ConfigError, ToolError
from keel.core.state import RunState
from keel.core.status import RunStatus
from keel.runtime.worktrees import cache_dir
from keel.tools.patches import Git

ROOT_VARIABLE = "KEEL_GIT_WORKSPACES"
DEFAULT_ROOT = Path("/var/tmp/keel-git-workspaces")


@dataclass(frozen=True, slots=True, kw_only=True)
class GitSource:
    url: str
    ref: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"url": self.url, "ref": self.ref}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GitSource:
        return cls(url=str(d["url"]), ref=d.get("ref"))

    def describe(self) -> str:
        return f"{self.url}@{self.ref}" if self.ref else self.url


def parse_source(text: str) -> GitSource:
    """``URL[@REF]``: the REF is what follows the last ``@`` when it holds no ``:`` (so
    ``git@host:org/repo.git`` is a URL, and ``git@host:org/repo.git@v2`` has REF v2).
    A local path is made absolute. ConfigError for an empty source or REF."""
    text = text.strip()
    if not text:
        raise ConfigError("--workspace-git needs a URL (or path) of a git repository")
    url, ref = text, None
    head, at, tail = text.rpartition("@")
    if at and head and ":" not in tail and not tail.startswith("/"):
        url, ref = head, tail
    if ref is not None and not ref.strip():
        raise ConfigError(f"--workspace-git {text!r}: the REF after @ is empty")
    if "://" not in url and not _scp_like(url):
        url = str(Path(url).expanduser().resolve())
    return GitSource(url=url, ref=ref)


def new_workspace_path() -> Path:
    """Where a new git-source run is checked out, on whichever machine executes it."""
    root = Path(os.environ.get(ROOT_VARIABLE) or DEFAULT_ROOT)
    return root / f"run-{uuid.uuid4().hex[:20]}"


def materialize(source: GitSource, path: Path) -> None:
    """Check ``source`` out at ``path`` unless it is there already. ConfigError (naming
    the source and what git said) when the source cannot be fetched or has no such REF."""
    if (path / ".git").exists():
        return  # this machine began (or resumed) the run here
    mirror = _mirror(source)
    try:
        with _holding(mirror):
            _check_out(source, mirror, path)
    except ToolError as exc:
        raise ConfigError(f"--workspace-git {source.describe()}: {exc}") from None


def _check_out(source: GitSource, mirror: Path, path: Path) -> None:
    """Clone or fetch the mirror and add the worktree (under the mirror's lock)."""
    if not (mirror / "HEAD").exists():
        mirror.parent.mkdir(parents=True, exist_ok=True)
        scratch = mirror.with_name(mirror.name + f".tmp-{uuid.uuid4().hex[:8]}")
        Git(cwd=mirror.parent).must(
            "clone", "--mirror", "--quiet", "--", source.url, str(scratch), doing="cloning"
        )
        try:
            scratch.rename(mirror)
        except OSError:
            shutil.rmtree(scratch, ignore_errors=True)  # another process cloned it first
    git = Git(cwd=mirror, git_dir=mirror).hardened()
    git.must("fetch", "--quiet", "--prune", "origin", doing="fetching")
    wanted = f"{source.ref or 'HEAD'}^{{commit}}"
    found = git.run("rev-parse", "--verify", "--quiet", "--end-of-options", wanted)
    if found.code != 0:
        raise ConfigError(
            f"--workspace-git {source.describe()}: no commit named "
            f"{source.ref or 'HEAD'!r} in that repository"
        )
    commit = found.stdout.decode().strip()
    path.parent.mkdir(parents=True, exist_ok=True)
    git.must("worktree", "add", "--detach", "-q", str(path), commit, doing="checking out")


def discard(source: GitSource, path: Path) -> None:
    """Remove the checkout at ``path`` and its record in the mirror (harmless if gone)."""
    mirror = _mirror(source)
    shutil.rmtree(path, ignore_errors=True)
    if (mirror / "HEAD").exists():
        with _holding(mirror):
            Git(cwd=mirror, git_dir=mirror).run("worktree", "prune")


def _mirror(source: GitSource) -> Path:
    return cache_dir() / "git" / hashlib.sha256(source.url.encode()).hexdigest()[:20]


@contextmanager
def _holding(mirror: Path) -> Iterator[None]:
    """The mirror to this process alone while it clones, fetches or adds a worktree: git
    refuses concurrent writers of one repository (``cannot lock ref``, ``File exists``
    on a ``.lock``), and two runs of one source often start together (``keel eval``
    attempts, workers on one machine). An advisory lock beside the mirror, released by
    the kernel if the process dies."""
    mirror.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(mirror.with_name(mirror.name + ".lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _scp_like(url: str) -> bool:
    """``user@host:path`` (git's scp-like syntax) rather than a local path."""
    before, colon, _ = url.partition(":")
    return bool(colon) and "/" not in before and len(before) > 1


def checkout_done(final: RunState) -> bool:
    """Whether a git-source run's checkout can go: it completed (its changes are in the
    store as its verification's diff) and did not hand its work to a run that goes on
    in the same checkout. A run that failed keeps it, for a person to look at."""
    result = final.result or {}
    return final.status is RunStatus.COMPLETED and result.get("outcome") != "handed_off"


__all__ = [
    "DEFAULT_ROOT",
    "ROOT_VARIABLE",
    "GitSource",
    "checkout_done",
    "discard",
    "materialize",
    "new_workspace_path",
    "parse_source",
]
