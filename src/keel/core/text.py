"""Text made valid for the record: no lone surrogates in anything that is stored.

JSON lets a sender spell a lone surrogate (``"\\ud800"``), a provider's decoder passes
it on, and Python strings hold it, but UTF-8 cannot encode it: a store that writes
such a string fails, and a run whose model said it would fail on every resume. So
what the model sends is made valid where it enters (each lone surrogate becomes
U+FFFD, and the caller records that it happened), and everything the loop stores
passes ``valid_data`` once more as a last guard. Pure: no I/O.
"""

from __future__ import annotations

import re
from typing import Any

from keel.core.errors import UsageError

REPLACEMENT = "\ufffd"
_SURROGATE = re.compile("[\ud800-\udfff]")
MAX_DEPTH = 64  # nesting kept as structure; deeper values are shown as text


def valid_text(text: str) -> tuple[str, int]:
    """``text`` with every lone surrogate replaced by U+FFFD, and how many were replaced.

    A high and a low surrogate side by side (a pair left uncombined by some decoder)
    become the one character they encode; only what is left over is replaced.
    """
    if text.isascii() or _SURROGATE.search(text) is None:
        return text, 0
    joined = _PAIR.sub(_combine, text)
    return _SURROGATE.subn(REPLACEMENT, joined)


_PAIR = re.compile("[\ud800-\udbff][\udc00-\udfff]")


def _combine(match: re.Match[str]) -> str:
    high, low = (ord(ch) for ch in match.group())
    return chr(0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00))


def valid_data(value: Any, *, depth: int = 0) -> Any:
    """``value`` (JSON-like) with every string made valid; the same object when nothing was.

    Keys are strings too and are made valid the same way; containers nested deeper
    than ``MAX_DEPTH`` are kept as their (valid) ``repr``.
    """
    if isinstance(value, str):
        return valid_text(value)[0]
    if isinstance(value, dict):
        if depth >= MAX_DEPTH:
            return valid_text(repr(value))[0]
        changed = False
        out: dict[Any, Any] = {}
        for key, item in value.items():
            new_key = valid_text(key)[0] if isinstance(key, str) else key
            new_item = valid_data(item, depth=depth + 1)
            changed = changed or new_key is not key or new_item is not item
            out[new_key] = new_item
        return out if changed else value
    if isinstance(value, list | tuple):
        if depth >= MAX_DEPTH:
            return valid_text(repr(value))[0]
        items = [valid_data(item, depth=depth + 1) for item in value]
        if all(new is old for new, old in zip(items, value, strict=True)):
            return value
        return items if isinstance(value, list) else tuple(items)
    return value


def has_lone_surrogate(text: str) -> bool:
    """True when ``text`` holds a surrogate code point (UTF-8 cannot encode it)."""
    return not text.isascii() and _SURROGATE.search(text) is not None


def check_storable(what: str, text: str) -> None:
    """UsageError (nothing stored) unless every store can keep ``text``: a NUL is refused
    by PostgreSQL's text columns, a lone surrogate by UTF-8. For what a caller names
    itself (a goal, a task's subject); what a model sends is made valid instead."""
    if "\x00" in text:
        raise UsageError(f"{what} contains a NUL character, which cannot be stored; remove it")
    if has_lone_surrogate(text):
        found = _SURROGATE.search(text)
        assert found is not None
        raise UsageError(
            f"{what} contains a lone surrogate (U+{ord(found.group()):04X}), which is not "
            "text UTF-8 can hold; send valid Unicode"
        )


def printable(text: str, *, limit: int = 500) -> str:
    """``text`` as one valid, printable line of at most ``limit`` characters (for reasons).

    Control characters become spaces: C0 (NUL included, which PostgreSQL text refuses),
    DEL and C1 (``\x9b`` is a terminal's CSI) — so a line shown on a terminal can carry
    no escape sequence from the model or a provider.
    """
    line = valid_text(text)[0].translate(_CONTROLS_TO_SPACE).strip()
    return line if len(line) <= limit else line[: limit - 1] + "…"


def terminal_safe(text: str) -> str:
    """``text`` valid, with every control character but the line break (C0, DEL, C1)
    made a space: what a terminal shows of the model's or a provider's words can carry
    no escape sequence (clearing the screen, retitling the window, writing the
    clipboard)."""
    return valid_text(text)[0].translate(_CONTROLS_BUT_NEWLINE)


_CONTROL_CODES = (*range(0x20), *range(0x7F, 0xA0))
_CONTROLS_TO_SPACE = dict.fromkeys(_CONTROL_CODES, " ")
_CONTROLS_BUT_NEWLINE = {code: " " for code in _CONTROL_CODES if code != 0x0A}


__all__ = [
    "MAX_DEPTH",
    "REPLACEMENT",
    "has_lone_surrogate",
    "printable",
    "terminal_safe",
    "valid_data",
    "valid_text",
]
