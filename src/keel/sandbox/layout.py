"""The file system a bubblewrap sandbox shows: bwrap's mount arguments for one call.

The root is empty. Visible read-only: the system directories, the interpreter's and
toolchains' prefixes (``sys.prefix`` and friends, the real directories on ``PATH``
and, for a ``bin`` directory, its parent prefix — never a home directory itself),
the settings' ``read_only`` paths, and the git directory of a worktree kept outside
the workspace. Private: ``/proc``, ``/dev``, ``/tmp`` (with ``HOME`` inside it).
Read-write: the workspace, then read-only again for each protected path of the
guard (``.keel``, ``.git/config``, ``.git/hooks``, the store's files; all of
``.git`` unless the call may write it).

A protected path that does not exist yet is held by an empty read-only directory
mounted at its topmost missing component, so it cannot be created during the call;
the mount point bwrap makes for it on the host is removed afterwards when still
empty. Not for the store's files, which SQLite itself creates and deletes during
the call: an absent journal of a store kept inside the workspace is not held.

Secret and denied files found by a bounded walk of the workspace are masked (bound
over by ``/dev/null``, which cannot be opened: the sandbox mounts no devices), and
so are the host's password hashes, SSH host keys and credential files at the top
of a visible toolchain prefix.
"""

from __future__ import annotations

import glob
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from fnmatch import translate
from pathlib import Path

from keel.core.redact import looks_secret
from keel.sandbox.base import Confinement, SandboxSettings

SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt")
HOST_SECRETS = ("/etc/shadow", "/etc/shadow-", "/etc/gshadow", "/etc/gshadow-")
HOST_SECRET_GLOBS = ("/etc/ssh/ssh_host_*_key",)
CREDENTIAL_FILES = frozenset(
    {".netrc", ".npmrc", ".pypirc", ".pgpass", ".git-credentials", "credentials", ".docker"}
)
SKIPPED_DIRS = frozenset(
    {".git", "node_modules", ".venv", "venv", "__pycache__", ".tox", ".nox", ".mypy_cache"}
    | {".pytest_cache", ".ruff_cache"}
)
SCAN_LIMIT = 20_000  # workspace entries looked at per call for secrets to mask
SANDBOX_TMP = "/tmp"
SANDBOX_HOME = "/tmp/home"
_NOT_THERE = ("/proc", "/dev", "/sys")  # never bound from the host
_GLOB_CHARS = re.compile(r"[*?\[]")


@dataclass(frozen=True, slots=True, kw_only=True)
class HostView:
    """The host directories every call of one sandbox sees, worked out once."""

    system: tuple[str, ...]  # real directories bound at their own path
    symlinks: tuple[tuple[str, str], ...]  # (target, path): /bin -> usr/bin
    toolchains: tuple[tuple[str, str], ...]  # (source, destination), after /tmp
    masked: tuple[str, ...]  # host files and directories hidden inside the view

    def system_args(self) -> list[str]:
        """The system directories, and private /proc, /dev, /tmp and HOME."""
        args: list[str] = []
        for path in self.system:
            args += ["--ro-bind", path, path]
        for target, path in self.symlinks:
            args += ["--symlink", target, path]
        return [
            *args,
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--tmpfs",
            SANDBOX_TMP,
            "--dir",
            SANDBOX_HOME,
        ]

    def to_dict(self) -> dict[str, list[str]]:
        return {
            "system": sorted([*self.system, *(path for _, path in self.symlinks)]),
            "toolchains": sorted({dest for _, dest in self.toolchains}),
            "masked_host_paths": list(self.masked),
        }


@dataclass(slots=True, kw_only=True)
class CallLayout:
    """bwrap's file-system arguments for one call and what they create on the host."""

    args: list[str] = field(default_factory=list)
    created: list[Path] = field(default_factory=list)  # placeholder mount points


def host_view(settings: SandboxSettings, environ: Mapping[str, str]) -> HostView:
    """What of the host a sandbox with ``settings`` shows read-only."""
    system: list[str] = []
    symlinks: list[tuple[str, str]] = []
    for path in SYSTEM_DIRS:
        if os.path.islink(path):
            symlinks.append((os.readlink(path), path))
        elif os.path.isdir(path):
            system.append(path)
    homes = {_real(path) for path in (environ.get("HOME", ""), os.path.expanduser("~")) if path}
    wanted: list[tuple[str, str]] = []
    for prefix in (sys.base_prefix, sys.prefix, sys.base_exec_prefix, sys.exec_prefix):
        wanted.extend(_bind_both(prefix))
    for entry in environ.get("PATH", "").split(os.pathsep):
        if not os.path.isabs(entry) or not os.path.isdir(entry) or _is_home_or_above(entry, homes):
            continue
        wanted.extend(_bind_both(entry))
        real = _real(entry)
        parent = os.path.dirname(real)
        if os.path.basename(real) in ("bin", "sbin") and not _is_home_or_above(parent, homes):
            wanted.append((parent, parent))
    for extra in settings.read_only:
        path = os.path.abspath(os.path.expanduser(extra))
        if os.path.exists(path):
            wanted.extend(_bind_both(path))
    if settings.network:
        resolver = _real("/etc/resolv.conf")
        if os.path.exists(resolver):
            wanted.append((os.path.dirname(resolver), os.path.dirname(resolver)))
    covered = [*system, *(path for _, path in symlinks)]
    toolchains = _outermost(wanted, covered)
    masked = [path for path in HOST_SECRETS if os.path.lexists(path)]
    for pattern in HOST_SECRET_GLOBS:
        masked.extend(sorted(glob.glob(pattern)))
    for _, dest in toolchains:
        masked.extend(_credential_files(dest))
    return HostView(
        system=tuple(system),
        symlinks=tuple(symlinks),
        toolchains=tuple(toolchains),
        masked=tuple(masked),
    )


def call_layout(view: HostView, confinement: Confinement) -> CallLayout:
    """The mount arguments (in bwrap's order) for one call under ``confinement``."""
    workspace = str(confinement.workspace)
    layout = CallLayout(args=view.system_args())
    args = layout.args
    for source, dest in view.toolchains:
        if not _within(dest, workspace):
            args += ["--ro-bind", source, dest]
    for path in view.masked:
        _mask(args, path)
    args += ["--bind" if confinement.workspace_writable else "--ro-bind", workspace, workspace]
    for gitdir in _linked_git_dirs(workspace):
        args += ["--ro-bind", gitdir, gitdir]
    read_only = _protect(layout, confinement) if confinement.workspace_writable else []
    _scan(layout, confinement, read_only)
    return layout


# --- the workspace -------------------------------------------------------------------


def _protect(layout: CallLayout, confinement: Confinement) -> list[str]:
    """Read-only binds (or placeholders) for the guard's literal protected paths.

    The store's own files get no placeholder: SQLite creates and deletes its journal
    next to the database while the call runs, and must find no directory there.
    """
    guard = confinement.guard
    patterns = [*guard.protected, *guard.store_paths]
    if not confinement.git_writable:
        patterns.append(".git")
    literal = sorted(
        {p.strip("/") for p in patterns if p.strip("/") and not _GLOB_CHARS.search(p)},
        key=lambda rel: (rel.count("/"), rel),
    )
    store_files = {p.strip("/") for p in guard.store_paths}
    workspace = str(confinement.workspace)
    done: list[str] = []
    for rel in literal:
        if any(_within(rel, other) for other in done):
            continue
        path = os.path.join(workspace, rel)
        if os.path.lexists(path):
            real = _real(path)
            if _within(real, workspace) and real != workspace:
                layout.args += ["--ro-bind", real, real]
                done.append(rel)
            continue
        if rel in store_files:
            continue
        top = _topmost_missing(workspace, rel)
        if top is None:
            continue
        parent = _real(os.path.dirname(top))
        if not _within(parent, workspace):
            continue  # below a symlink leading out: not visible inside anyway
        hold = os.path.join(parent, os.path.basename(top))
        layout.args += ["--tmpfs", hold, "--remount-ro", hold]
        layout.created.append(Path(hold))
        done.append(os.path.relpath(top, workspace))
    return done


def _scan(layout: CallLayout, confinement: Confinement, read_only: list[str]) -> None:
    """Mask secret and denied entries, bind deeper protected ones read-only (bounded walk)."""
    guard = confinement.guard
    hide = _LeafMatcher((*guard.secret, *guard.hidden))
    protect = _LeafMatcher((*guard.protected, *guard.store_paths))
    check_protected = confinement.workspace_writable
    root = str(confinement.workspace)
    stack = [("", root)]
    seen = 0
    while stack:
        rel_dir, real_dir = stack.pop()
        try:
            entries = list(os.scandir(real_dir))
        except OSError:
            continue
        for entry in entries:
            seen += 1
            if seen > SCAN_LIMIT:
                return
            rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
            try:
                if entry.is_symlink():
                    continue  # not followed: its target is either hidden or checked itself
                is_dir = entry.is_dir(follow_symlinks=False)
            except OSError:
                continue
            if hide(rel, entry.name):
                _mask(layout.args, entry.path, is_dir=is_dir)
                continue
            if (
                check_protected
                and protect(rel, entry.name)
                and not any(_within(rel, done) for done in read_only)
            ):
                layout.args += ["--ro-bind", entry.path, entry.path]
                read_only.append(rel)
            if is_dir and entry.name not in SKIPPED_DIRS:
                stack.append((rel, entry.path))


class _LeafMatcher:
    """PathGuard's ``covered_by`` for one path whose parents the walk already checked."""

    def __init__(self, patterns: tuple[str, ...]) -> None:
        stripped = [p.strip("/") for p in patterns if p.strip("/")]
        names = [translate(p) for p in stripped if "/" not in p]
        paths = [translate(p) for p in stripped if "/" in p]
        self._name = re.compile("|".join(names)) if names else None
        self._path = re.compile("|".join(paths)) if paths else None

    def __call__(self, rel: str, name: str) -> bool:
        return bool(
            (self._name is not None and self._name.match(name))
            or (self._path is not None and self._path.match(rel))
        )


def _linked_git_dirs(workspace: str) -> list[str]:
    """The git directories of a worktree or submodule kept outside it (``.git`` a file)."""
    dotgit = os.path.join(workspace, ".git")
    if os.path.islink(dotgit) or not os.path.isfile(dotgit):
        return []
    try:
        with open(dotgit, encoding="utf-8", errors="replace") as f:
            first = f.readline(4096)
    except OSError:
        return []
    if not first.startswith("gitdir:"):
        return []
    found = [_real(os.path.join(workspace, first.removeprefix("gitdir:").strip()))]
    try:
        with open(os.path.join(found[0], "commondir"), encoding="utf-8") as f:
            found.append(_real(os.path.join(found[0], f.readline(4096).strip())))
    except OSError:
        pass  # a submodule's or main repository's own directory: nothing shared
    return [path for path in found if os.path.isdir(path) and not _within(path, workspace)]


# --- helpers ---------------------------------------------------------------------------


def _mask(args: list[str], path: str, *, is_dir: bool | None = None) -> None:
    if is_dir is None:
        is_dir = os.path.isdir(path) and not os.path.islink(path)
    if is_dir:
        args += ["--tmpfs", path, "--remount-ro", path]
    else:
        args += ["--ro-bind", "/dev/null", path]


def _topmost_missing(workspace: str, rel: str) -> str | None:
    current = workspace
    for part in rel.split("/"):
        current = os.path.join(current, part)
        if not os.path.lexists(current):
            return current
    return None


def _bind_both(path: str) -> list[tuple[str, str]]:
    """Bind ``path`` at its real path, and at the path it is known by when that differs."""
    real = _real(path)
    if not os.path.exists(real):
        return []
    return [(real, real)] if real == path else [(real, real), (real, os.path.normpath(path))]


def _outermost(wanted: list[tuple[str, str]], covered: list[str]) -> list[tuple[str, str]]:
    """``wanted`` without duplicates, system paths, and paths inside another wanted one."""
    kept: list[tuple[str, str]] = []
    for source, dest in sorted(set(wanted), key=lambda item: (len(item[1]), item[1])):
        if dest == "/" or any(_within(dest, other) for other in (*covered, *_NOT_THERE)):
            continue
        if any(_within(dest, other) for _, other in kept):
            continue
        kept.append((source, dest))
    return kept


def _credential_files(prefix: str) -> list[str]:
    try:
        names = os.listdir(prefix)
    except OSError:
        return []
    return [
        os.path.join(prefix, name)
        for name in sorted(names)
        if name in CREDENTIAL_FILES or looks_secret(name)
    ]


def _is_home_or_above(path: str, homes: set[str]) -> bool:
    real = _real(path)
    return real == "/" or any(_within(home, real) for home in homes)


def _within(path: str, parent: str) -> bool:
    """True when ``path`` is ``parent`` or below it (lexically)."""
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def _real(path: str) -> str:
    return os.path.realpath(path)


__all__ = [
    "SANDBOX_HOME",
    "SANDBOX_TMP",
    "SCAN_LIMIT",
    "CallLayout",
    "HostView",
    "call_layout",
    "host_view",
]
