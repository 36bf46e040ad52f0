r"""grep's regular expressions: RE2, matched over a file's bytes, line by line, in linear time.

Python's ``re`` backtracks: ``(a+)+$`` over a line of ``a``'s takes exponential
time, and a model can send that. RE2 (``google-re2``) guarantees time linear in
the input for every pattern it accepts; the price is that it accepts no
backreferences (``\1``), lookaround (``(?=…)``, ``(?<!…)``), atomic groups or
possessive quantifiers, and a pattern using them is refused with a message that
says so. ``\Z`` is spelled ``\z`` in RE2.

A pattern matches within one line: it is compiled with ``never_nl`` (no match
crosses a newline, ``\s`` and ``[^x]`` included) and ``(?m)`` (``^`` and ``$`` are
line boundaries). Lines are split at ``\n``; a ``\r`` before it is not part of the
line (``$`` matches before it, and it is not shown). The
file is searched as bytes (its UTF-8 text: ``.`` is one character), a block of
about ``BLOCK_BYTES`` at a time, so the caller's deadline is checked between blocks.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import re2

from keel.core.errors import ToolError

BLOCK_BYTES = 1 << 20
_MULTILINE = "(?m)"

_UNSUPPORTED = (
    (re.compile(r"\\[1-9]|\(\?P=|\\g<|\\k<"), r"backreferences (\1, (?P=name))"),
    (re.compile(r"\(\?<?[=!]"), "lookaround ((?=…), (?!…), (?<=…), (?<!…))"),
    (re.compile(r"\(\?>"), "atomic groups ((?>…))"),
    (re.compile(r"[*+?}]\+"), "possessive quantifiers (*+, ++, ?+)"),
    (re.compile(r"\(\?\("), "conditionals ((?(1)…|…))"),
    (re.compile(r"\\Z"), r"\Z (write \z for the end of the text, or $ for the end of a line)"),
)


class LineRegex:
    """A compiled grep pattern (``compile_line_regex``); ``search`` reports matching lines."""

    def __init__(self, pattern: str, regex: Any) -> None:  # re2 ships no type hints
        self.pattern = pattern
        self._regex = regex

    def search(
        self,
        data: bytes,
        on_line: Callable[[int, bytes], bool],
        check: Callable[[], None] | None = None,
    ) -> None:
        """Call ``on_line(number, line)`` for each matching line, in order, until it
        returns True; ``check`` is called before each block (it may raise to stop)."""
        if b"\r\n" in data:  # CRLF line ends: the lines are what is before them
            data = data.replace(b"\r\n", b"\n")
        size = len(data)
        ends_with_newline = size > 0 and data[-1] == 0x0A
        pos = 0
        counted, number = 0, 1  # ``number`` is the number of the line starting at ``counted``
        while pos < size:
            if check is not None:
                check()
            end = min(size, pos + BLOCK_BYTES)
            if end < size:  # a block ends after a newline (or at the end of the data)
                newline = data.find(b"\n", end - 1)
                end = size if newline < 0 else newline + 1
            at = pos
            while at < end:
                match = self._regex.search(data, at, end)
                if match is None:
                    break
                start = match.start()
                if start >= end and (end < size or ends_with_newline):
                    break  # the empty "line" after this block's last newline is not one
                previous = data.rfind(b"\n", at, start)
                line_start = at if previous < 0 else previous + 1
                line_end = data.find(b"\n", start, end)
                if line_end < 0:
                    line_end = end
                number += data.count(b"\n", counted, line_start)
                counted = line_start
                line = data[line_start:line_end]
                if on_line(number, line):
                    return
                at = line_end + 1
            pos = end


def compile_line_regex(pattern: str) -> LineRegex:
    """``pattern`` compiled for ``LineRegex.search``; a ToolError says what RE2 refused."""
    options = re2.Options()
    options.never_nl = True
    options.log_errors = False
    try:
        regex = re2.compile(_MULTILINE + pattern, options)
    except UnicodeEncodeError as exc:
        raise ToolError(
            f"pattern {pattern!r} is not valid Unicode text: {exc.reason} at character "
            f"{exc.start - len(_MULTILINE)}"
        ) from None
    except re2.error as exc:
        raise ToolError(_refusal(pattern, exc)) from None
    return LineRegex(pattern, regex)


def _refusal(pattern: str, exc: Exception) -> str:
    detail = exc.args[0] if exc.args else str(exc)
    if isinstance(detail, bytes):
        detail = detail.decode("utf-8", "replace")
    detail = str(detail).replace(_MULTILINE, "", 1)
    for construct, what in _UNSUPPORTED:
        if construct.search(pattern):
            return (
                f"invalid regular expression {pattern!r}: grep uses RE2 syntax, which runs in "
                f"time linear in the input and has no {what}; rewrite the pattern without "
                f"them (RE2 says: {detail})"
            )
    return f"invalid regular expression {pattern!r}: {detail} (grep uses RE2 syntax)"


__all__ = ["BLOCK_BYTES", "LineRegex", "compile_line_regex"]
