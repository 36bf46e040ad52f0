"""Staleness of a patch: which files it touches are no longer what it was made from.

A child's patch is made against the parent's state when the child started; by the time
the parent takes it, the parent may have changed some of the same files. Those files
are *stale*: the patch's pre-image for them is not what the workspace holds now.
Pure Python (no git, no repository needed); reads only the files the patch names.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path


def stale_paths(workspace: Path, patch: bytes) -> list[str]:
    """The paths ``patch`` touches whose content in ``workspace`` is no longer its pre-image.

    A git patch names each file's pre-image blob (``index <pre>..<post>``); a file is
    stale when its git blob id now differs (or, for a patch that modifies, deletes or
    renames it, it is missing), and a file the patch creates is stale when it now
    exists. The ids are computed here (``sha1("blob <size>\\0" + content)``, sha256 for
    64-digit ids, a link's id from its target), so ``workspace`` need not be a git
    repository. Paths are as ``keel.tools.patches.patch_paths`` spells them, in patch
    order; a path that is absolute or climbs out with ``..`` is always stale.
    """
    stale: list[str] = []
    for change in _file_changes(patch):
        for path in change.stale_in(workspace):
            if path not in stale:
                stale.append(path)
    return stale


@dataclass(frozen=True, slots=True, kw_only=True)
class _FileChange:
    """One ``diff --git`` section: what it expects to find, and what it creates."""

    old: str | None  # the path it reads (None: it creates ``new``)
    new: str | None  # the path it writes (None: it deletes ``old``)
    pre: str | None  # the pre-image blob id (None: not stated, as in a mode-only change)

    def stale_in(self, workspace: Path) -> list[str]:
        found: list[str] = []
        if self.old is not None:
            current = _blob_id(workspace, self.old, len(self.pre or "") == 64)
            if current is None or (self.pre is not None and not current.startswith(self.pre)):
                found.append(self.old)
        if self.new is not None and self.new != self.old:
            target = _inside(workspace, self.new)
            if target is None or os.path.lexists(target):
                found.append(self.new)
        return found


def _file_changes(patch: bytes) -> list[_FileChange]:
    changes: list[_FileChange] = []
    for chunk in re.split(rb"(?m)^(?=diff --git )", patch):
        if not chunk.startswith(b"diff --git "):
            continue
        lines = chunk.split(b"\n")
        header_old, header_new = _header_paths(lines[0][len(b"diff --git ") :])
        old: str | None = header_old
        new: str | None = header_new
        pre: str | None = None
        created = deleted = False
        for line in lines[1:]:
            if line.startswith((b"@@ ", b"GIT binary patch", b"Binary files ")):
                break
            if line.startswith(b"new file mode "):
                created = True
            elif line.startswith(b"deleted file mode "):
                deleted = True
            elif line.startswith((b"rename from ", b"copy from ")):
                old = _unquoted(line.split(b" ", 2)[2])
            elif line.startswith((b"rename to ", b"copy to ")):
                new = _unquoted(line.split(b" ", 2)[2])
            elif line.startswith(b"index "):
                pre = line[len(b"index ") :].split(b"..", 1)[0].decode("ascii", "replace")
            elif line.startswith(b"--- "):
                old = _side(line[4:], b"a/")
            elif line.startswith(b"+++ "):
                new = _side(line[4:], b"b/")
        if pre is not None and pre.strip("0") == "":
            created, pre = True, None
        changes.append(
            _FileChange(
                old=None if created else old,
                new=None if deleted else new,
                pre=pre,
            )
        )
    return changes


def _header_paths(rest: bytes) -> tuple[str | None, str | None]:
    """Both paths of ``diff --git a/X b/Y`` (quoted, or unquoted and equal)."""
    rest = rest.rstrip(b"\r")
    if rest.startswith(b'"'):
        end = _quoted_end(rest)
        first, second = rest[: end + 1], rest[end + 1 :].lstrip(b" ")
        return _side(first, b"a/"), _side(second, b"b/")
    if rest.endswith(b'"'):
        start = rest.rfind(b' "')
        return _side(rest[:start], b"a/"), _side(rest[start + 1 :], b"b/")
    half = (len(rest) - 1) // 2
    if len(rest) % 2 == 1 and rest[half : half + 1] == b" ":
        first, second = rest[:half], rest[half + 1 :]
        if first[2:] == second[2:]:
            return _side(first, b"a/"), _side(second, b"b/")
    return None, None


def _side(raw: bytes, prefix: bytes) -> str | None:
    """A ``---``/``+++``/header path without its prefix; None for ``/dev/null``. git ends
    a ``---``/``+++`` name holding a space with a tab (a tab in a name is quoted)."""
    raw = raw.rstrip(b"\r").removesuffix(b"\t")
    text = _unquoted(raw)
    if text == "/dev/null":
        return None
    return text.removeprefix(prefix.decode())


def _quoted_end(raw: bytes) -> int:
    at = 1
    while at < len(raw):
        if raw[at : at + 1] == b"\\":
            at += 2
            continue
        if raw[at : at + 1] == b'"':
            return at
        at += 1
    return len(raw) - 1


_ESCAPES = {b"a": 7, b"b": 8, b"t": 9, b"n": 10, b"v": 11, b"f": 12, b"r": 13}


def _unquoted(raw: bytes) -> str:
    """A path as git writes it: C-quoted when it holds unusual bytes, else as is
    (undone with surrogate escapes, as ``patch_paths`` spells names that are not UTF-8)."""
    raw = raw.rstrip(b"\r")
    if not (raw.startswith(b'"') and raw.endswith(b'"') and len(raw) >= 2):
        return raw.decode("utf-8", "surrogateescape")
    body, out, at = raw[1:-1], bytearray(), 0
    while at < len(body):
        byte = body[at : at + 1]
        if byte != b"\\" or at + 1 == len(body):
            out += byte
            at += 1
            continue
        escaped = body[at + 1 : at + 2]
        if escaped.isdigit() and re.fullmatch(rb"[0-7]{3}", body[at + 1 : at + 4]):
            out.append(int(body[at + 1 : at + 4], 8) & 0xFF)
            at += 4
            continue
        out.append(_ESCAPES.get(escaped, escaped[0]))
        at += 2
    return bytes(out).decode("utf-8", "surrogateescape")


def _inside(workspace: Path, rel: str) -> Path | None:
    parts = rel.split("/")
    if rel.startswith("/") or ".." in parts:
        return None
    return workspace / rel


def _blob_id(workspace: Path, rel: str, sha256: bool) -> str | None:
    """The git blob id of ``rel`` as it is now (a link's from its target); None if absent
    or not a file."""
    target = _inside(workspace, rel)
    if target is None:
        return None
    try:
        mode = os.lstat(target).st_mode
        if stat.S_ISLNK(mode):
            content = os.fsencode(os.readlink(target))
        elif stat.S_ISREG(mode):
            content = target.read_bytes()
        else:
            return None
    except OSError:
        return None
    digest = hashlib.sha256() if sha256 else hashlib.sha1()  # git object ids: not for security
    digest.update(b"blob %d\0" % len(content))
    digest.update(content)
    return digest.hexdigest()


__all__ = ["stale_paths"]
