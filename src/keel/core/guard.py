"""Which workspace paths the model may touch, as pure rules over workspace-relative paths.

One ``PathGuard`` is consulted by the policy (to decide), by the file tools (to
refuse, even when a decision was wrong), by the directory-wide tools (to leave
out), by the diff (to omit) and by the sandbox (to mount read-only or mask), so
the same path is treated the same everywhere.

Patterns are globs over workspace-relative posix paths (``fnmatchcase``, so ``*``
also matches ``/``). A pattern without ``/`` matches a name at any depth
(``.env*`` covers ``config/.env.local``); a pattern with ``/`` matches from the
workspace root. A path is covered when it or any of its parent directories
matches, so ``.keel`` covers ``.keel/keel.db``.
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase
from functools import lru_cache

# Never writable by the model, in any mode, by file tools or by commands.
DEFAULT_PROTECTED: tuple[str, ...] = (".keel", ".git/config", ".git/hooks")
# Writes below these need a person's approval in every mode (a commit, a branch).
GIT_INTERNALS: tuple[str, ...] = (".git",)
# Reading these needs approval; they are left out of listings, searches and diffs,
# masked inside the sandbox, and their values are redacted from the log.
DEFAULT_SECRET: tuple[str, ...] = (".env", ".env.*")
# Where plan_write keeps the plan in the workspace (a write like any other).
PLAN_FILE = "plans/PLAN.md"


@lru_cache(maxsize=4096)
def covered_by(rel: str, patterns: tuple[str, ...]) -> str | None:
    """The first pattern covering ``rel`` (itself or a parent directory), else None.

    Pure, so answers are cached (a run asks about the same few paths at every step:
    the guard is consulted several times per call)."""
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    for pattern in patterns:
        anchored = "/" in pattern.strip("/")
        want = pattern.strip("/")
        for depth in range(1, len(parts) + 1):
            if anchored:
                if fnmatchcase("/".join(parts[:depth]), want):
                    return pattern
            elif fnmatchcase(parts[depth - 1], want):
                return pattern
    return None


@dataclass(frozen=True, slots=True, kw_only=True)
class PathGuard:
    """The protected, secret and hidden paths of one run's workspace.

    ``store_paths`` are workspace-relative paths of the store's own files when the
    store lives inside the workspace (``sqlite:///ws/data/keel.db``): protected
    like ``.keel``.
    """

    protected: tuple[str, ...] = DEFAULT_PROTECTED
    secret: tuple[str, ...] = DEFAULT_SECRET
    hidden: tuple[str, ...] = ()  # policy deny rules on reads: never listed or searched
    store_paths: tuple[str, ...] = ()

    def write_refusal(self, rel: str) -> str | None:
        """Why the model may never write ``rel``, or None when it may (subject to policy)."""
        hit = covered_by(rel, self.protected)
        if hit is not None:
            return (
                f"{rel} is protected ({hit!r}): the harness's own configuration and "
                "records, and git's configuration and hooks, are never written by the model"
            )
        hit = covered_by(rel, self.store_paths)
        if hit is not None:
            return f"{rel} is part of Keel's store ({hit}); the model never writes it"
        return None

    def is_git_internal(self, rel: str) -> bool:
        """True for paths below ``.git/``: writing them needs approval in every mode."""
        return covered_by(rel, GIT_INTERNALS) is not None

    def is_secret(self, rel: str) -> bool:
        """True when reading ``rel`` needs approval (``.env*`` and the policy's secrets)."""
        return covered_by(rel, self.secret) is not None

    def listable(self, rel: str) -> bool:
        """False for what directory-wide tools must leave out: secrets and denied paths."""
        return covered_by(rel, self.secret) is None and covered_by(rel, self.hidden) is None


__all__ = [
    "DEFAULT_PROTECTED",
    "DEFAULT_SECRET",
    "GIT_INTERNALS",
    "PLAN_FILE",
    "PathGuard",
    "covered_by",
]
