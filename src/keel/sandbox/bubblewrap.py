"""The bubblewrap sandbox: each program in fresh namespaces over an empty root.

``bwrap`` gets every namespace it supports (``--unshare-all``: user, mount, pid,
network unless the settings allow it, IPC, UTS, cgroup), drops every capability,
disables user namespaces inside where this bwrap can (0.8+), and dies with Keel
(``--die-with-parent``: note that Linux sends that signal when the *thread* that
started the program exits, so a call must be waited for by the thread that began
it, as ``run_command`` and the verifier do). The program is the second process of
its pid namespace, so when it exits bwrap's init ends and the kernel kills whatever
it left behind. What is visible is described in ``layout``, plus the confinement's
``readable`` host files, bound read-only at their own path; limits in ``limits``.

Whether bwrap works here is probed once per process and binary (it can be
installed but refused user namespaces, as on some Ubuntu and container setups).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from keel.sandbox.base import Confinement, SandboxSettings
from keel.sandbox.calls import CallResources, CallTracker
from keel.sandbox.cgroups import find_pids_hierarchy
from keel.sandbox.environment import ALLOWED_NAMES, ALLOWED_PREFIXES, scrubbed_environment
from keel.sandbox.layout import SANDBOX_HOME, SANDBOX_TMP, SCAN_LIMIT, call_layout, host_view
from keel.sandbox.limits import resource_limits

PROBE_TIMEOUT_S = 10.0
HELPER_PROCESSES = 2  # bwrap itself and the init of the pid namespace
STRICT_FLAGS = (
    "--unshare-all",
    "--unshare-user",
    "--disable-userns",
    "--cap-drop",
    "ALL",
    "--die-with-parent",
)
BASIC_FLAGS = ("--unshare-all", "--cap-drop", "ALL", "--die-with-parent")


@dataclass(frozen=True, slots=True, kw_only=True)
class BubblewrapProbe:
    """Whether the bwrap at ``path`` can start a program here, and with which flags."""

    path: str
    works: bool
    version: str = ""
    flags: tuple[str, ...] = ()
    reason: str = ""  # when it does not work: bwrap's own complaint


@functools.cache
def probe_bubblewrap(path: str) -> BubblewrapProbe:
    """Run ``true`` under ``path`` the way calls will (strict flags, else basic); cached."""
    try:
        shown = _run([path, "--version"]).stdout.decode(errors="replace").split()
    except (OSError, subprocess.SubprocessError) as exc:
        return BubblewrapProbe(path=path, works=False, reason=f"cannot run {path}: {exc}")
    version = shown[-1] if shown else ""
    program = shutil.which("true", path="/usr/bin:/bin") or "/bin/true"
    base = host_view(SandboxSettings(), {}).system_args()
    reason = ""
    for flags in (STRICT_FLAGS, BASIC_FLAGS):
        try:
            trial = _run([path, *flags, *base, "--", program])
        except (OSError, subprocess.SubprocessError) as exc:
            reason = str(exc)
            continue
        if trial.returncode == 0:
            return BubblewrapProbe(path=path, works=True, version=version, flags=flags)
        said = trial.stderr.decode(errors="replace").strip().splitlines()
        reason = said[0] if said else f"exit code {trial.returncode}"
    return BubblewrapProbe(path=path, works=False, version=version, reason=reason)


class BubblewrapSandbox:
    """Programs confined by bubblewrap (see the module docstring)."""

    def __init__(self, settings: SandboxSettings, probe: BubblewrapProbe) -> None:
        self.settings = settings
        self.probe = probe
        self._view = host_view(settings, os.environ)
        pids = find_pids_hierarchy()
        self._limits = resource_limits(settings, pids)
        self._calls = CallTracker(self._limits, pids, helpers=HELPER_PROCESSES)
        self._flags = [*probe.flags, *(("--share-net",) if settings.network else ())]

    @property
    def kind(self) -> str:
        return "bubblewrap"

    def describe(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "version": self.probe.version,
            "binary": self.probe.path,
            "network": self.settings.network,
            "filesystem": {
                "root": "empty",
                "workspace": "read-write, except protected paths and .git (read-only "
                "unless the call may write it)",
                "secrets_masked": "files the guard marks secret or denied, among the first "
                f"{SCAN_LIMIT} workspace entries (.git, node_modules, virtualenvs and caches "
                "not searched)",
                "home": "hidden",
                "tmp": "private",
                **self._view.to_dict(),
            },
            "environment": {
                "allowlist": [*ALLOWED_NAMES, *(f"{p}*" for p in ALLOWED_PREFIXES)],
                "passed": list(self.settings.env),
                "home": SANDBOX_HOME,
            },
            "capabilities": "none",
            "nested_user_namespaces": (
                "disabled" if "--disable-userns" in self._flags else "not disabled"
            ),
            **self._limits.describe(self.settings),
            "process_tree": "pid namespace + process group; killed when the call ends "
            "and when Keel dies",
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
        layout = call_layout(self._view, confinement)
        cwd = confinement.cwd or confinement.workspace
        readable = [arg for path in confinement.readable for arg in _ro_bind(path)]
        command = [
            self.probe.path,
            *self._flags,
            *layout.args,
            *readable,
            "--chdir",
            str(cwd),
            "--",
            *argv,
        ]
        environment = scrubbed_environment(
            os.environ,
            passed=self.settings.env,
            home=SANDBOX_HOME,
            tmpdir=SANDBOX_TMP,
            extra=env,
        )
        return self._calls.start(
            command,
            cwd=confinement.workspace,
            env=environment,  # bwrap passes its own environment on unchanged
            stdout=stdout,
            stderr=stderr,
            resources=CallResources(created_dirs=layout.created),
        )

    def finish(self, proc: subprocess.Popen[bytes]) -> int:
        return self._calls.finish(proc)


def _ro_bind(path: Path) -> list[str]:
    """bwrap's arguments showing the host file ``path`` read-only at its own path."""
    if not path.is_absolute():
        raise OSError(f"a file the program reads must be named by an absolute path: {path}")
    return ["--ro-bind", str(path), str(path)]


def _run(argv: list[str]) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        argv,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=PROBE_TIMEOUT_S,
        check=False,
    )


__all__ = [
    "BASIC_FLAGS",
    "STRICT_FLAGS",
    "BubblewrapProbe",
    "BubblewrapSandbox",
    "probe_bubblewrap",
]
