"""Choosing the sandbox for a run: bubblewrap where it works, else what the mode allows.

``required`` refuses to run without a working bubblewrap (ConfigError saying how to
install it); ``auto`` falls back to the unconfined sandbox, whose ``describe()``
says why; ``off`` is always unconfined.
"""

from __future__ import annotations

import os
import shutil

from keel.core.errors import ConfigError
from keel.sandbox.base import SANDBOX_MODES, Sandbox, SandboxSettings
from keel.sandbox.bubblewrap import BubblewrapSandbox, probe_bubblewrap
from keel.sandbox.unconfined import UnconfinedSandbox

INSTALL_HINT = (
    "install bubblewrap (`apt-get install bubblewrap` on Debian and Ubuntu, "
    "`dnf install bubblewrap` on Fedora, `pacman -S bubblewrap` on Arch)"
)
USERNS_HINT = (
    "allow unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1, "
    "or an AppArmor profile for bwrap on Ubuntu 24.04+)"
)


def open_sandbox(settings: SandboxSettings, *, search_path: str | None = None) -> Sandbox:
    """The sandbox ``settings`` ask for; bwrap is looked up on ``search_path`` (default PATH)."""
    if settings.mode not in SANDBOX_MODES:
        raise ConfigError(
            f"unknown sandbox mode {settings.mode!r}; choose one of {'|'.join(SANDBOX_MODES)}"
        )
    if settings.mode == "off":
        return UnconfinedSandbox(settings, 'sandbox = "off": programs run with your rights')
    where = os.environ.get("PATH", os.defpath) if search_path is None else search_path
    binary = shutil.which("bwrap", path=where)
    if binary is None:
        problem, fix = "bubblewrap (bwrap) is not installed", INSTALL_HINT
    else:
        probe = probe_bubblewrap(binary)
        if probe.works:
            return BubblewrapSandbox(settings, probe)
        problem, fix = f"bubblewrap at {binary} does not work here ({probe.reason})", USERNS_HINT
    if settings.mode == "required":
        raise ConfigError(
            f'sandbox = "required" but {problem}: {fix}, or run with --sandbox auto|off'
        )
    return UnconfinedSandbox(settings, f"{problem}; commands run unconfined: {fix}")


__all__ = ["INSTALL_HINT", "open_sandbox"]
