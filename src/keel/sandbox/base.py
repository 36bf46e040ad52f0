"""What a sandbox is: the settings a user chooses and the per-call confinement.

A ``Sandbox`` starts programs on the model's or the workspace's behalf (commands,
verifiers, the harness's own git). ``kind`` is ``"bubblewrap"`` when an OS sandbox
confines them, ``"none"`` when they run with the user's rights (the environment is
still scrubbed and the limits still apply).
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from keel.core.guard import PathGuard

SandboxMode = Literal["required", "auto", "off"]
SANDBOX_MODES: tuple[SandboxMode, ...] = ("required", "auto", "off")
OrphanPolicy = Literal["wait", "kill"]


@dataclass(frozen=True, slots=True, kw_only=True)
class SandboxSettings:
    """``[sandbox]`` in ``.keel/config.toml`` and ``--sandbox``; stored with the run."""

    mode: SandboxMode = "auto"
    network: bool = False  # may sandboxed programs open network connections?
    env: tuple[str, ...] = ()  # variable names passed through besides the allowlist
    read_only: tuple[str, ...] = ()  # extra host paths visible read-only (toolchains)
    cpu_seconds: int = 900  # RLIMIT_CPU of each program
    memory_mb: int = 8192  # data segment limit of each program
    processes: int = 1024  # processes alive at once in one call
    file_size_mb: int = 4096  # largest file a program may write
    orphans: OrphanPolicy = "wait"  # on resume, a command still running from a dead process

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "network": self.network,
            "env": list(self.env),
            "read_only": list(self.read_only),
            "cpu_seconds": self.cpu_seconds,
            "memory_mb": self.memory_mb,
            "processes": self.processes,
            "file_size_mb": self.file_size_mb,
            "orphans": self.orphans,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class Confinement:
    """What one program may touch: the workspace (minus the guard's paths), nothing else."""

    workspace: Path  # resolved; bound read-write
    guard: PathGuard = field(default_factory=PathGuard)
    git_writable: bool = False  # an approved command may write .git (never config or hooks)
    cwd: Path | None = None  # default: the workspace
    workspace_writable: bool = True  # False: the whole workspace is read-only (the harness's git)
    # Host files (absolute) the program reads at their own path, read-only: a patch git
    # applies, kept outside the workspace. Everything else outside stays unseen.
    readable: tuple[Path, ...] = ()


class Sandbox(Protocol):
    """Starts programs confined; see the module docstring."""

    @property
    def kind(self) -> str: ...

    def describe(self) -> dict[str, Any]:
        """JSON-ready account of the isolation (recorded in ``tool_started`` and evidence)."""
        ...

    def popen(
        self,
        argv: Sequence[str],
        confinement: Confinement,
        *,
        stdout: int,
        stderr: int,
        env: Mapping[str, str] | None = None,
    ) -> subprocess.Popen[bytes]:
        """Start ``argv`` in its own session, confined; stdin is /dev/null (input the
        program needs is a file named in ``confinement.readable``).

        The program sees the scrubbed environment (an allowlist of variables plus the
        settings' ``env`` names) with ``env`` set on top exactly as given. Every call
        must end with :meth:`finish`, also when the caller fails.
        """
        ...

    def finish(self, proc: subprocess.Popen[bytes]) -> int:
        """End a call: kill every process it started that still runs, reap ``proc``, free
        what ``popen`` set up. Idempotent; returns how many processes it had to kill."""
        ...
