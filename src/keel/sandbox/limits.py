"""Resource limits of one program, applied in the child between fork and exec.

``RLIMIT_CPU`` (seconds of CPU per process: SIGXCPU, then SIGKILL a second later),
``RLIMIT_DATA`` (memory: heap and private mappings; ``RLIMIT_AS`` would break
runtimes that reserve large address ranges, such as the JVM and V8),
``RLIMIT_FSIZE`` (largest file written: SIGXFSZ), ``RLIMIT_CORE`` = 0, and for
processes: a per-call pids cgroup where one can be created (see ``cgroups``),
else ``RLIMIT_NPROC`` for users other than root (it counts all of the user's
processes, so the limit is set to those already running plus the allowance; the
kernel does not apply it to root). Hard limits are set too: the program cannot
raise them again.
"""

from __future__ import annotations

import os
import resource
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from keel.sandbox.base import SandboxSettings
from keel.sandbox.cgroups import PidsHierarchy, join

MIB = 1024 * 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class ResourceLimits:
    """The rlimits every program of a sandbox gets, and how processes are bounded."""

    rlimits: tuple[tuple[int, int, int], ...]  # (resource, soft, hard)
    processes: int  # the settings' allowance of processes alive at once
    processes_enforced_by: str  # "cgroup-pids", "rlimit-nproc" or "none"

    def describe(self, settings: SandboxSettings) -> dict[str, Any]:
        return {
            "cpu_seconds": {"limit": settings.cpu_seconds, "enforced_by": "rlimit-cpu"},
            "memory_mb": {"limit": settings.memory_mb, "enforced_by": "rlimit-data"},
            "file_size_mb": {"limit": settings.file_size_mb, "enforced_by": "rlimit-fsize"},
            "processes": {"limit": self.processes, "enforced_by": self.processes_enforced_by},
            "core_dumps": False,
        }


def resource_limits(settings: SandboxSettings, pids: PidsHierarchy | None) -> ResourceLimits:
    """The limits for ``settings`` on this machine, clamped to the hard limits Keel has."""
    wanted = [
        (resource.RLIMIT_CPU, settings.cpu_seconds, settings.cpu_seconds + 1),
        (resource.RLIMIT_DATA, settings.memory_mb * MIB, settings.memory_mb * MIB),
        (resource.RLIMIT_FSIZE, settings.file_size_mb * MIB, settings.file_size_mb * MIB),
        (resource.RLIMIT_CORE, 0, 0),
    ]
    if pids is not None:
        enforced_by = "cgroup-pids"
    elif os.geteuid() != 0:
        enforced_by = "rlimit-nproc"
        allowance = settings.processes + _processes_of(os.getuid())
        wanted.append((resource.RLIMIT_NPROC, allowance, allowance))
    else:
        enforced_by = "none"
    return ResourceLimits(
        rlimits=tuple(_clamped(*limit) for limit in wanted),
        processes=settings.processes,
        processes_enforced_by=enforced_by,
    )


def child_setup(limits: ResourceLimits, cgroup_join: str | None) -> Callable[[], None]:
    """The ``preexec_fn`` of a call: join its cgroup, then lower the limits.

    It only calls ``os`` and ``resource`` functions on values prepared beforehand,
    as code between fork and exec must.
    """
    rlimits = limits.rlimits

    def setup() -> None:
        if cgroup_join is not None:
            join(cgroup_join)
        for which, soft, hard in rlimits:
            resource.setrlimit(which, (soft, hard))

    return setup


def _clamped(which: int, soft: int, hard: int) -> tuple[int, int, int]:
    _, current_hard = resource.getrlimit(which)
    if current_hard != resource.RLIM_INFINITY:
        hard = min(hard, current_hard)
        soft = min(soft, hard)
    return which, soft, hard


def _processes_of(uid: int) -> int:
    """How many processes ``uid`` runs now (RLIMIT_NPROC counts them all)."""
    count = 0
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                count += entry.stat().st_uid == uid
            except OSError:
                continue
    return count


__all__ = ["MIB", "ResourceLimits", "child_setup", "resource_limits"]
