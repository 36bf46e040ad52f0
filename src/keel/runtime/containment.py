"""Assembling one run's containment: its sandbox, its path guard and its gate.

Everything comes from the run's stored options (policy rules, protected and secret
paths, sandbox settings) plus the store's own files, so every process that drives
the run — the one that created it, a resume, a worker on another host — confines
it the same way, or refuses to drive it (``sandbox = "required"`` without one).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from keel.core.guard import DEFAULT_PROTECTED, DEFAULT_SECRET, PathGuard
from keel.core.state import RunState
from keel.policy.containment import ContainedPolicy
from keel.policy.rules import Policy
from keel.runtime.config import settings_from_dict
from keel.sandbox.base import Sandbox, SandboxSettings
from keel.sandbox.choose import open_sandbox
from keel.store.base import Store
from keel.tools.patches import ArtifactReader, PatchPaths

SQLITE_COMPANIONS = ("", "-wal", "-shm", "-journal")


@dataclass(frozen=True, slots=True, kw_only=True)
class Containment:
    sandbox: Sandbox
    guard: PathGuard
    gate: ContainedPolicy
    settings: SandboxSettings


def contain(
    state: RunState, *, store_files: Iterable[Path] = (), artifacts: ArtifactReader | None = None
) -> Containment:
    """The containment of ``state``'s run (see the module docstring); with ``artifacts``
    (the run's store) the gate judges apply_patch by the paths inside its patch, without
    it refuses apply_patch."""
    settings = settings_from_dict(state.options.sandbox)
    sandbox = open_sandbox(settings)
    policy = Policy.from_dict(state.options.policy)
    workspace = Path(state.workspace).resolve()
    guard = PathGuard(
        protected=DEFAULT_PROTECTED + policy.protected,
        secret=DEFAULT_SECRET + policy.secret,
        hidden=policy.read_denied_paths(),
        store_paths=tuple(_inside(store_files, workspace)),
    )
    gate = ContainedPolicy(
        policy=policy,
        guard=guard,
        sandboxed=sandbox.kind != "none",
        paths_of=None if artifacts is None else PatchPaths(artifacts, sandbox),
    )
    return Containment(sandbox=sandbox, guard=guard, gate=gate, settings=settings)


def store_files(store: Store) -> tuple[Path, ...]:
    """The files a SQLite store writes (database, WAL, shared memory, journal); none else."""
    path = getattr(store, "path", None)
    if not isinstance(path, Path):
        return ()
    return tuple(path.with_name(path.name + suffix) for suffix in SQLITE_COMPANIONS)


def _inside(paths: Iterable[Path], workspace: Path) -> Iterable[str]:
    for path in paths:
        real = Path(os.path.realpath(path))
        if real == workspace or workspace in real.parents:
            yield real.relative_to(workspace).as_posix()


__all__ = ["Containment", "contain", "store_files"]
