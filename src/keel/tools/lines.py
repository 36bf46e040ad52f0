"""A file's lines, streamed: skip to a line, take some, count the rest, in bounded memory.

``LineReader`` reads an open file a chunk (``CHUNK_BYTES``) at a time and never
holds more than one chunk plus the heads of the lines it hands out: skipping to
line 5,000,000 of a 300 MB file counts newlines chunk by chunk, and a line of a
gigabyte is handed out as its first ``keep`` bytes and its length. Lines end at
``\\n``; a last line without one is a line too. The caller's ``check`` runs before
every chunk is read, so a deadline stops a long skip.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

CHUNK_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class Line:
    """One line: its number, its first bytes (no newline) and its whole length in bytes."""

    number: int
    head: bytes
    length: int


class LineReader:
    """Lines of the open file ``fd`` from its current position; ``number`` is the next's."""

    def __init__(self, fd: int, check: Callable[[], None] | None = None) -> None:
        self._fd = fd
        self._check = check
        self._buf = b""
        self._pos = 0
        self._eof = False
        self.number = 1  # the number of the line that starts at the current position
        self.consumed = 0  # bytes of the file behind the current position

    def _fill(self) -> bool:
        """More bytes in the buffer; False at the end of the file."""
        if self._pos < len(self._buf):
            return True
        if self._eof:
            return False
        if self._check is not None:
            self._check()
        self._buf, self._pos = os.read(self._fd, CHUNK_BYTES), 0
        self._eof = not self._buf
        return not self._eof

    def skip_to(self, number: int) -> bool:
        """Move to the start of line ``number``; False when the file ends before it."""
        while self.number < number:
            if not self._fill():
                return False
            need = number - self.number
            buf, pos = self._buf, self._pos
            found = buf.count(b"\n", pos)
            if found < need:
                self.number += found
                self.consumed += len(buf) - pos
                self._pos = len(buf)
                continue
            for _ in range(need):
                pos = buf.index(b"\n", pos) + 1
            self.number = number
            self.consumed += pos - self._pos
            self._pos = pos
        return self._fill()  # the line exists when a byte of it does

    def next_line(self, keep: int) -> Line | None:
        """The line at the current position (its first ``keep`` bytes), or None at the end."""
        if not self._fill():
            return None
        head: list[bytes] = []
        kept = length = 0
        while self._fill():
            buf, pos = self._buf, self._pos
            end = buf.find(b"\n", pos)
            stop = len(buf) if end < 0 else end
            if kept < keep:
                piece = buf[pos : min(stop, pos + keep - kept)]
                head.append(piece)
                kept += len(piece)
            length += stop - pos
            self.consumed += stop - pos + (end >= 0)
            self._pos = stop + (end >= 0)
            if end >= 0:
                break
        line = Line(number=self.number, head=b"".join(head), length=length)
        self.number += 1
        return line

    def count_rest(self, budget: int) -> tuple[int, bool]:
        """(lines from here on, reached the end) reading at most about ``budget`` more bytes."""
        lines = 0
        scanned = 0
        partial = False  # the bytes since the last newline are the start of a line
        while scanned < budget and self._fill():
            buf, pos = self._buf, self._pos
            lines += buf.count(b"\n", pos)
            partial = buf[-1:] != b"\n"
            scanned += len(buf) - pos
            self.consumed += len(buf) - pos
            self._pos = len(buf)
        if self._fill():
            return lines, False
        return lines + partial, True


__all__ = ["CHUNK_BYTES", "Line", "LineReader"]
