r"""File names as the model sees them and spells them back: valid text, one spelling each.

A Linux file name is bytes. Python decodes bytes that are not UTF-8 as lone
surrogates (``os.fsdecode``'s surrogateescape: byte 0xff becomes U+DCFF), which no
event can store, and a name may hold a newline, which breaks a listing's lines.
So a name is *shown* with escapes, and a path the model sends is *spelled* the
same way:

- a byte that is not part of valid UTF-8 is shown as ``\xHH`` (``bad\xffname``);
- a control character (U+0001 to U+001F, U+007F) is shown as ``\xHH`` (``a\x0ab``);
- a backslash that would otherwise read as such an escape is shown as ``\x5c``;
- everything else is shown as itself.

``shown_path`` and ``spelled_path`` are inverses: a path copied from ``list_dir``,
``glob`` or ``grep`` output reaches the same file. Each name has exactly one
spelling (lower- or upper-case hex digits aside): an escape for bytes that form
valid UTF-8 (``\xc3\xa9`` for ``é``), a raw control character or an escaped
backslash where none is needed is refused with the spelling to use, so a rule
written for ``données/*`` cannot be walked around by spelling the name in bytes.
Pure: no I/O.
"""

from __future__ import annotations

import os
import re

from keel.core.errors import ToolError

NAME_MAX = 255  # bytes in one path component (Linux, macOS)
PATH_MAX = 4095  # bytes in a whole path, without its terminating NUL

_ESCAPE = re.compile(r"\\x([0-9a-fA-F]{2})")
_ESCAPED_VALUES = frozenset([*range(0x01, 0x20), 0x5C, 0x7F, *range(0x80, 0x100)])
_LOOKS_ESCAPED = re.compile(r"x(?:[0-1][0-9a-fA-F]|7[fF]|5[cC]|[89a-fA-F][0-9a-fA-F])")
_NEEDS_SHOWING = re.compile("[\x00-\x1f\x7f\\\\\udc80-\udcff]")
_SURROGATE = re.compile("[\ud800-\udfff]")
_CONTROL = re.compile("[\x00-\x1f\x7f]")


def shown_path(raw: str) -> str:
    """A path as Keel shows it: valid text, control characters and undecodable bytes
    escaped (see the module docstring). ``raw`` is what ``os.fsdecode`` gives."""
    if _NEEDS_SHOWING.search(raw) is None:
        return raw
    out: list[str] = []
    for at, ch in enumerate(raw):
        code = ord(ch)
        if 0xDC80 <= code <= 0xDCFF:
            out.append(f"\\x{code - 0xDC00:02x}")
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\x{code:02x}")
        elif ch == "\\" and _LOOKS_ESCAPED.match(raw, at + 1):
            out.append("\\x5c")
        else:
            out.append(ch)
    return "".join(out)


def spelled_path(path: str, *, what: str = "path", check_lengths: bool = True) -> str:
    r"""The path ``path`` (as the model spells it) names, for the OS (``os.fsencode``-able).

    ToolError, saying what to write instead, for: a NUL, a raw control character, a
    lone surrogate, an escape that is not the name's one spelling, and (with
    ``check_lengths``) a component over NAME_MAX bytes or a path over PATH_MAX bytes.
    """
    if "\x00" in path:
        raise ToolError(f"{what} {path!r} contains a NUL character; file names cannot")
    surrogate = _SURROGATE.search(path)
    if surrogate is not None:
        raise ToolError(
            f"{what} {path!r} contains a lone surrogate (U+{ord(surrogate.group()):04X}) at "
            f"character {surrogate.start()}, which is not text; a byte of a name that is not "
            r"UTF-8 is written \xHH, as list_dir shows it"
        )
    control = _CONTROL.search(path)
    if control is not None:
        raise ToolError(
            f"{what} {path!r} contains the control character U+{ord(control.group()):04X}; "
            f"write it as \\x{ord(control.group()):02x}, as list_dir shows such names"
        )
    raw = _ESCAPE.sub(_unescape, path) if "\\x" in path else path
    if "\x00" in raw:
        raise ToolError(f"{what} {path!r} contains a NUL character (\\x00); file names cannot")
    canonical = os.fsdecode(os.fsencode(raw))  # bytes that form UTF-8 are that text
    expected = shown_path(canonical)
    if expected != _ESCAPE.sub(_lower, path):
        raise ToolError(
            f"{what} {path!r} is not spelled the way Keel shows that name; write {expected!r}"
        )
    if check_lengths:
        check_length(canonical, shown=path, what=what)
    return canonical


def os_name(path: str) -> str:
    """The OS name ``path`` spells, for resolving it; ``path`` itself when it is not a
    spelling any file can have (the tools refuse those with the reason)."""
    try:
        return spelled_path(path, check_lengths=False)
    except ToolError:
        return path


def check_length(raw: str, *, shown: str, what: str = "path") -> None:
    """ToolError when a component of ``raw`` is over NAME_MAX bytes or the whole over
    PATH_MAX (what the kernel answers with ENAMETOOLONG), naming the component."""
    encoded = os.fsencode(raw)
    if len(encoded) > PATH_MAX:
        raise ToolError(
            f"{what} {_excerpt(shown)} is {len(encoded)} bytes long; a path has at most "
            f"{PATH_MAX} bytes"
        )
    parts = encoded.split(b"/")
    for part in parts:
        if len(part) > NAME_MAX:
            name = _excerpt(shown_path(os.fsdecode(part)))
            where = f"{what} {_excerpt(shown)} has a component" if len(parts) > 1 else what
            raise ToolError(
                f"{where} {name} of {len(part)} bytes; a file name has at most {NAME_MAX} bytes"
            )


def _unescape(match: re.Match[str]) -> str:
    value = int(match.group(1), 16)
    if value not in _ESCAPED_VALUES and value != 0:
        return match.group()  # \x41 is the four characters it is written with
    return chr(0xDC00 + value) if value >= 0x80 else chr(value)


def _lower(match: re.Match[str]) -> str:
    """An escape that stands for a byte, in the lower-case hex ``shown_path`` writes."""
    return match.group().lower() if int(match.group(1), 16) in _ESCAPED_VALUES else match.group()


def _excerpt(text: str, most: int = 60) -> str:
    shown = text if len(text) <= most else text[: most - 1] + "…"
    return repr(shown)


__all__ = ["NAME_MAX", "PATH_MAX", "check_length", "os_name", "shown_path", "spelled_path"]
