"""The workspace's change as a diff, for the evidence of a completed run.

The workspace — ``.git/config`` and ``.gitattributes`` included — may have been
written by the model, so the harness's git is told to run nothing it names: no
external diff or textconv (``--no-ext-diff --no-textconv``, ``diff.external``
emptied), no hooks (``core.hooksPath=/dev/null``), no fsmonitor, no pager, and
every ``filter.<name>`` driver the repository configures overridden with empty
``clean``/``smudge``/``process`` commands. Overrides travel in ``GIT_CONFIG_COUNT``
variables (a driver's name cannot break their syntax). System and global
configuration are ignored, ``HOME`` is an empty directory, the environment is the
sandbox's allowlist, git never prompts, takes no optional locks and never looks
above the workspace. When a sandbox is given, git runs inside it with the whole
workspace read-only, so even an unforeseen program could change nothing.

Files the guard marks secret (``.env*`` and the policy's) or hidden are left out,
tracked or untracked, so their content never reaches the diff artifact.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from keel.core.guard import PathGuard
from keel.sandbox.base import Confinement, Sandbox, SandboxSettings
from keel.sandbox.choose import open_sandbox
from keel.sandbox.collect import collect_output

UNTRACKED_DIFF_CAP = 2_000_000  # characters of new files' content shown in the diff
OUTPUT_CAP = 50_000_000  # bytes read from one git command
GIT_TIMEOUT_S = 60.0
OVERRIDES = (
    ("core.fsmonitor", "false"),
    ("core.hooksPath", "/dev/null"),
    ("core.pager", "cat"),
    ("core.untrackedCache", "false"),
    ("diff.external", ""),
)
DRIVER_COMMANDS = ("clean", "smudge", "process")
DIFF_FLAGS = ("--no-ext-diff", "--no-textconv", "--no-color", "--no-renames")


def workspace_diff(
    workspace: Path, *, guard: PathGuard | None = None, sandbox: Sandbox | None = None
) -> str:
    """``git diff HEAD`` plus new files of the workspace when it is a git work tree."""
    if not (workspace / ".git").exists():
        return ""
    git = HardenedGit(workspace, guard=guard or PathGuard(), sandbox=sandbox)
    git.neutralise_filters()
    code, listed = git.run("diff", "HEAD", "--name-only", "-z", *DIFF_FLAGS)
    changed = _names(listed) if code == 0 else []  # no HEAD yet: only new files
    shown = [name for name in changed if git.guard.listable(name)]
    tracked = b""
    if shown:
        pathspec = ["--", *shown] if len(shown) < len(changed) else []
        _, tracked = git.run("diff", "HEAD", *DIFF_FLAGS, *pathspec)
    _, others = git.run("ls-files", "--others", "--exclude-standard", "-z")
    new = [name for name in _names(others) if git.guard.listable(name)]
    return tracked.decode("utf-8", "replace") + _untracked_diff(git, new)


class HardenedGit:
    """git in one workspace that runs no program the workspace configures (module doc)."""

    def __init__(self, workspace: Path, *, guard: PathGuard, sandbox: Sandbox | None) -> None:
        self.workspace = workspace
        self.guard = guard
        self.sandbox = sandbox or open_sandbox(SandboxSettings(mode="off"))
        self.confinement = Confinement(workspace=workspace, guard=guard, workspace_writable=False)
        self.overrides: list[tuple[str, str]] = list(OVERRIDES)

    def environment(self) -> dict[str, str]:
        env = {
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": "/dev/null",
            "GIT_ATTR_NOSYSTEM": "1",
            "GIT_TERMINAL_PROMPT": "0",
            "GIT_OPTIONAL_LOCKS": "0",
            "GIT_LITERAL_PATHSPECS": "1",
            "GIT_PAGER": "cat",
            "PAGER": "cat",
            "GIT_DIR": str(self.workspace / ".git"),
            "GIT_WORK_TREE": str(self.workspace),
            "GIT_CEILING_DIRECTORIES": str(self.workspace.parent),
            "GIT_CONFIG_COUNT": str(len(self.overrides)),
        }
        for index, (key, value) in enumerate(self.overrides):
            env[f"GIT_CONFIG_KEY_{index}"] = key
            env[f"GIT_CONFIG_VALUE_{index}"] = value
        return env

    def neutralise_filters(self) -> None:
        """Override every ``filter.<name>`` driver the repository's configuration names."""
        _, found = self.run("config", "-z", "--get-regexp", r"^filter\.")
        drivers: set[str] = set()
        for entry in _names(found):
            key = entry.split("\n", 1)[0]
            name = key[len("filter.") :].rpartition(".")[0]
            if name:
                drivers.add(name)
        for name in sorted(drivers):
            self.overrides += [(f"filter.{name}.{cmd}", "") for cmd in DRIVER_COMMANDS]
            self.overrides.append((f"filter.{name}.required", "false"))

    def run(self, *args: str) -> tuple[int, bytes]:
        """(exit code, stdout) of ``git --no-pager ARGS``; (-1, b"") when git cannot run."""
        buffer = bytearray()

        def feed(chunk: bytes) -> None:
            if len(buffer) < OUTPUT_CAP:
                buffer.extend(chunk[: OUTPUT_CAP - len(buffer)])

        try:
            proc = self.sandbox.popen(
                ["git", "--no-pager", *args],
                self.confinement,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                env=self.environment(),
            )
        except OSError:
            return -1, b""
        try:
            collected = collect_output(
                proc,
                feed,
                deadline=time.monotonic() + GIT_TIMEOUT_S,
                on_timeout=lambda: self.sandbox.finish(proc),
            )
            code = proc.wait()
        finally:
            self.sandbox.finish(proc)
        return (-1 if collected.timed_out else code), bytes(buffer)


def _untracked_diff(git: HardenedGit, paths: list[str]) -> str:
    """New files as diffs against nothing (read-only: the index is left alone), bounded."""
    parts: list[str] = []
    budget = UNTRACKED_DIFF_CAP
    for path in paths:
        try:
            size = os.lstat(git.workspace / path).st_size
        except OSError:
            continue  # gone since git listed it
        if size > budget:
            parts.append(f"new file: {path} (content not shown: diff size cap reached)\n")
            continue
        _, out = git.run("diff", *DIFF_FLAGS, "--no-index", "--", "/dev/null", path)
        text = out.decode("utf-8", "replace") if out else f"new file: {path}\n"
        budget -= len(text)
        parts.append(text)
    return "".join(parts)


def _names(raw: bytes) -> list[str]:
    return [name for name in raw.decode("utf-8", "surrogateescape").split("\0") if name]


__all__ = ["HardenedGit", "workspace_diff"]
