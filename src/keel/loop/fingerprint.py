"""Which files a command changed: a stat walk before and after, hashes only for changes."""

from __future__ import annotations

import os
from pathlib import Path

from keel.core.pathnames import shown_path
from keel.tools.workspace import sha256_file

SKIPPED_DIRS = frozenset(
    {
        ".git",
        ".keel",
        ".venv",
        "venv",
        "node_modules",
        "__pycache__",
        ".pytest_cache",
        ".mypy_cache",
        ".ruff_cache",
        ".hypothesis",
    }
)

Fingerprint = dict[str, tuple[int, int]]


def fingerprint(workspace: Path) -> Fingerprint:
    """posix path -> (size, mtime_ns) of every regular file, not following symlinks."""
    found: Fingerprint = {}
    stack = [workspace]
    while stack:
        folder = stack.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                if entry.name not in SKIPPED_DIRS:
                    stack.append(Path(entry.path))
            elif entry.is_file(follow_symlinks=False):
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue  # removed since it was listed
                rel = Path(entry.path).relative_to(workspace).as_posix()
                found[rel] = (st.st_size, st.st_mtime_ns)
    return found


def changed_since(workspace: Path, before: Fingerprint) -> dict[str, str]:
    """Changed or new files -> sha256; removed files -> ""."""
    after = fingerprint(workspace)
    changed = {}
    for path, stamp in after.items():
        if before.get(path) != stamp:
            try:
                changed[path] = sha256_file(workspace / path)
            except OSError:
                changed[path] = ""  # removed (or unreadable) since the walk saw it
    for path in before.keys() - after.keys():
        changed[path] = ""
    return changed


def shown_changes(workspace: Path, before: Fingerprint) -> dict[str, str]:
    """``changed_since`` keyed by paths as the model is shown them (``\\xHH`` escapes)."""
    return {shown_path(path): digest for path, digest in changed_since(workspace, before).items()}
