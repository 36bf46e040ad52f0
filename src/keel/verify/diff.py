"""The workspace's change as a diff, for the evidence of a completed run."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

UNTRACKED_DIFF_CAP = 2_000_000  # characters of new files' content shown in the diff


def workspace_diff(workspace: Path) -> str:
    """``git diff`` of the workspace when it is a git work tree (evidence of the change)."""
    if not (workspace / ".git").exists():
        return ""
    env = {**os.environ, "GIT_PAGER": "cat"}
    try:
        proc = subprocess.run(
            ["git", "diff", "HEAD", "--no-color"],
            cwd=workspace,
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
            check=False,
        )
        untracked = subprocess.run(
            ["git", "ls-files", "--others", "--exclude-standard"],
            cwd=workspace,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return proc.stdout + _untracked_diff(workspace, untracked.stdout.splitlines(), env)


def _untracked_diff(workspace: Path, paths: list[str], env: dict[str, str]) -> str:
    """New files as diffs against nothing (read-only: the index is left alone), bounded."""
    parts: list[str] = []
    budget = UNTRACKED_DIFF_CAP
    for path in paths:
        try:
            size = (workspace / path).stat().st_size
        except OSError:
            continue  # gone since git listed it
        if size > budget:
            parts.append(f"new file: {path} (content not shown: diff size cap reached)\n")
            continue
        try:
            proc = subprocess.run(
                ["git", "diff", "--no-color", "--no-index", "--", "/dev/null", path],
                cwd=workspace,
                capture_output=True,
                text=True,
                timeout=60,
                env=env,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired, UnicodeDecodeError):
            proc = None
        text = proc.stdout if proc is not None and proc.stdout else f"new file: {path}\n"
        budget -= len(text)
        parts.append(text)
    return "".join(parts)
