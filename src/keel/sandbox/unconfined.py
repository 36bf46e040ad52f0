"""The unconfined sandbox (kind "none"): the user's rights, still bounded and cleaned up.

Used when ``sandbox = "off"``, or ``"auto"`` without a working bubblewrap. Nothing
is hidden or read-only (a confinement's ``readable`` files need nothing: every host
file the user may read is readable) and the network is open, but each program still starts in
its own session with the scrubbed environment (``HOME`` and ``TMPDIR`` in a fresh
directory removed afterwards), the resource limits and, where possible, its own
pids cgroup; ending the call kills its process group and cgroup. What it cannot
do is end the tree when Keel itself is killed: a resume finds such a command by its
recorded process group (its scratch directory then stays in the temporary directory).
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from keel.sandbox.base import Confinement, SandboxSettings
from keel.sandbox.calls import CallResources, CallTracker
from keel.sandbox.cgroups import find_pids_hierarchy
from keel.sandbox.environment import ALLOWED_NAMES, ALLOWED_PREFIXES, scrubbed_environment
from keel.sandbox.limits import resource_limits


class UnconfinedSandbox:
    """Programs run with the user's rights; ``reason`` says why there is no OS sandbox."""

    def __init__(self, settings: SandboxSettings, reason: str) -> None:
        self.settings = settings
        self.reason = reason
        pids = find_pids_hierarchy()
        self._limits = resource_limits(settings, pids)
        self._calls = CallTracker(self._limits, pids)

    @property
    def kind(self) -> str:
        return "none"

    def describe(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "reason": self.reason,
            "network": True,
            "filesystem": "the user's rights: nothing is hidden or read-only",
            "environment": {
                "allowlist": [*ALLOWED_NAMES, *(f"{p}*" for p in ALLOWED_PREFIXES)],
                "passed": list(self.settings.env),
                "home": "a fresh empty directory per call",
            },
            **self._limits.describe(self.settings),
            "process_tree": "process group (and cgroup when enforced) killed when the call "
            "ends; left running if Keel is killed",
        }

    def popen(
        self,
        argv: Sequence[str],
        confinement: Confinement,
        *,
        stdout: int,
        stderr: int,
        env: Mapping[str, str] | None = None,
    ) -> subprocess.Popen[bytes]:
        scratch = Path(tempfile.mkdtemp(prefix=f"keel-call-{os.getpid()}-"))
        (scratch / "home").mkdir()
        (scratch / "tmp").mkdir()
        environment = scrubbed_environment(
            os.environ,
            passed=self.settings.env,
            home=str(scratch / "home"),
            tmpdir=str(scratch / "tmp"),
            extra=env,
        )
        return self._calls.start(
            argv,
            cwd=confinement.cwd or confinement.workspace,
            env=environment,
            stdout=stdout,
            stderr=stderr,
            resources=CallResources(scratch=scratch),
        )

    def finish(self, proc: subprocess.Popen[bytes]) -> int:
        return self._calls.finish(proc)


__all__ = ["UnconfinedSandbox"]
