"""Where a workspace path leads once symbolic links are followed.

The policy judges a path as written and as resolved (a rule the model can spell around
with a symlink is not a rule), once by the rules and once by the containment layer, for
every call that names a path. ``os.path.realpath`` of the whole path costs an ``lstat``
and a round of Python per component, the workspace's own ancestors included, every time.
Here the workspace's real path is kept (checked against its device and inode on each
use, so a moved or replaced workspace is resolved again) and only the components inside
it are looked at; at the first symbolic link, or a ``..``, the whole path is resolved by
``os.path.realpath`` as before. The result is always what
``realpath(join(realpath(workspace), path))`` gives (tests/unit/test_policy_resolution.py
compares the two over random trees of links).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from keel.core.pathnames import os_name

_MAX_ROOTS = 64
_roots: dict[str, tuple[int, int, str]] = {}  # workspace -> (device, inode, real path)


def real_root(workspace: Path) -> str:
    """``os.path.realpath(workspace)``, kept while the workspace is the same directory."""
    key = os.fspath(workspace)
    try:
        found = os.stat(key)
    except OSError:
        return os.path.realpath(key)
    kept = _roots.get(key)
    if kept is not None and kept[0] == found.st_dev and kept[1] == found.st_ino:
        return kept[2]
    real = os.path.realpath(key)
    if len(_roots) >= _MAX_ROOTS:
        _roots.clear()
    _roots[key] = (found.st_dev, found.st_ino, real)
    return real


def resolve(path: str, workspace: Path) -> tuple[str, str]:
    """(the workspace's real path, ``path`` inside it with every link followed), as
    ``realpath`` resolves: never failing on a part that does not exist (the rest is
    joined as written). ``path`` is relative to the workspace, spelled as the file tools
    read it (``os_name``)."""
    name = os_name(path)
    parts = [part for part in name.split("/") if part not in ("", ".")]
    root = real_root(workspace)
    if os.path.isabs(name) or ".." in parts:
        return _resolved_by_realpath(name, workspace)
    here = root.rstrip("/")
    for at, part in enumerate(parts):
        candidate = f"{here}/{part}"
        try:
            mode = os.lstat(candidate).st_mode
        except OSError:  # it does not exist (or cannot be read): the rest as written
            return root, "/".join([candidate, *parts[at + 1 :]])
        if stat.S_ISLNK(mode):
            return _resolved_by_realpath(name, workspace)
        here = candidate
    return root, here or "/"


def _resolved_by_realpath(name: str, workspace: Path) -> tuple[str, str]:
    root = os.path.realpath(workspace)
    return root, os.path.realpath(os.path.join(root, name))


__all__ = ["real_root", "resolve"]
