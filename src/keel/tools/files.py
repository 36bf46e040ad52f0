"""File tools: read_file, write_file and edit_file, confined to the workspace.

write_file and edit_file are VERIFY_THEN_CONTINUE: before they run, their intent
(path -> sha256 of the content the file will have) is computed from the arguments,
and writes are atomic renames, so after a crash the file's hash tells whether the
effect happened. Both refuse, in their intent too, any write whose real path the
run's ``PathGuard`` protects (``.keel/``, the store, ``.git/config``, ``.git/hooks/``),
however the path is spelled and through whatever link inside the workspace.

Reads are bounded: read_file streams to the lines asked for (``keel.tools.lines``)
and holds one chunk at a time, whatever the file's size; after the lines it shows
it counts the file's remaining lines only within ``FILE_WINDOW_BYTES`` and says
when it stopped counting. edit_file refuses a file over ``FILE_WINDOW_BYTES``
(it holds the file a few times over while it edits). Every cut says what it left
out. Paths in results are shown as ``keel.core.pathnames`` spells them.
"""

from __future__ import annotations

import os
from typing import Annotated

from pydantic import Field

from keel.core.errors import ToolError
from keel.core.pathnames import shown_path
from keel.tools.base import Effect, PathArgument, Recovery, ToolContext, ToolResult, tool
from keel.tools.deadline import Stopwatch
from keel.tools.fsroot import WorkspaceRoot
from keel.tools.lines import LineReader
from keel.tools.workspace import (
    read_in_workspace,
    refuse_protected,
    replace_in_workspace,
    sha256_bytes,
    write_target,
)

READ_DEFAULT_LINES = 2000
READ_MAX_CHARS = 50_000  # whole output of one read_file call
READ_MAX_LINE_CHARS = 2000
BINARY_SNIFF_BYTES = 8192
# The most of one file a tool takes in beyond skipping to an offset: read_file counts
# lines this far past what it shows; edit_file edits files up to this size.
FILE_WINDOW_BYTES = 20 * 1024 * 1024
_LINE_KEEP_BYTES = 4 * READ_MAX_LINE_CHARS + 4  # enough bytes for READ_MAX_LINE_CHARS characters

FilePath = Annotated[PathArgument, Field(description="File path relative to the workspace root.")]


def looks_binary(head: bytes) -> bool:
    """A NUL byte in the first few KiB marks a file as binary (what git and grep assume)."""
    return b"\x00" in head[:BINARY_SNIFF_BYTES]


def encode_text(text: str, what: str) -> bytes:
    """UTF-8 bytes of ``text``; a lone surrogate (possible in JSON) is a ToolError, not a crash."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ToolError(
            f"{what} is not valid Unicode text: {exc.reason} at character {exc.start}"
        ) from None


def read_text(ctx: ToolContext, path: str, *, tool: str = "edit_file") -> tuple[str, str]:
    """(workspace-relative path, text) of an existing UTF-8-ish text file of at most
    ``FILE_WINDOW_BYTES``, or a ToolError saying why not.

    Bytes that are not UTF-8 are kept as surrogate escapes: ``encode_edited`` writes
    them back unchanged, so an edit never damages the rest of a Latin-1 file.
    """
    rel, data = read_in_workspace(ctx.workspace, path, limit=FILE_WINDOW_BYTES, tool=tool)
    Stopwatch(ctx.deadline).check(tool, lambda: f"read {shown_path(rel)} ({len(data)} bytes)")
    if looks_binary(data):
        raise ToolError(f"{path!r} is a binary file ({len(data)} bytes); it cannot be shown")
    return rel, data.decode("utf-8", errors="surrogateescape")


def encode_edited(text: str) -> bytes:
    """The bytes of a text ``read_text`` gave (edited with valid text): bytes that were
    not UTF-8 come back as they were."""
    return text.encode("utf-8", errors="surrogateescape")


@tool(effect=Effect.READ, recovery=Recovery.REPLAY_SAFE)
def read_file(
    ctx: ToolContext,
    path: FilePath,
    offset: Annotated[
        int | None, Field(ge=1, description="First line to show, 1-based (default 1).")
    ] = None,
    limit: Annotated[
        int | None,
        Field(ge=1, description=f"Most lines to show (default {READ_DEFAULT_LINES})."),
    ] = None,
) -> ToolResult:
    """Read a text file; lines come numbered, and long files are shown in bounded pieces."""
    clock = Stopwatch(ctx.deadline)
    first = offset or 1
    wanted = limit or READ_DEFAULT_LINES
    with WorkspaceRoot(ctx.workspace) as root:
        opened = root.open(path)
        if opened is None:
            raise ToolError(f"file {path!r} does not exist; list_dir or glob show what exists")
        with opened:
            if opened.is_dir:
                raise ToolError(f"{path!r} is a directory; use list_dir to see its entries")
            if not opened.is_file:
                raise ToolError(f"{path!r} is not a regular file")
            rel, size = opened.shown, opened.st.st_size
            if looks_binary(os.pread(opened.fd, BINARY_SNIFF_BYTES, 0)):
                raise ToolError(f"{path!r} is a binary file ({size} bytes); it cannot be shown")
            reader = LineReader(
                opened.fd,
                lambda: clock.check(
                    "read_file",
                    lambda: (
                        f"read {reader.consumed} of the {size} bytes of {rel} "
                        f"(up to line {reader.number}); read a smaller piece"
                    ),
                ),
            )
            if not reader.skip_to(first):
                if reader.number == 1 and reader.consumed == 0:
                    return ToolResult(output=f"{rel} is empty")
                lines = reader.number - 1
                raise ToolError(f"offset {first} is past the end of {rel}, which has {lines} lines")
            shown, left_out = _take_lines(reader, wanted)
            last = first + len(shown) - 1
            if left_out:
                counted, at_end = reader.count_rest(FILE_WINDOW_BYTES)
                total = last + left_out + counted
                shown.append(_more_note(first, last, total, at_end, reader.consumed, size))
    return ToolResult(output="\n".join(shown))


def _take_lines(reader: LineReader, wanted: int) -> tuple[list[str], int]:
    """Up to ``wanted`` numbered lines within READ_MAX_CHARS, and how many lines were read
    past them (0: the file ended; 1: more follow)."""
    shown: list[str] = []
    used = 0
    while len(shown) < wanted:
        line = reader.next_line(_LINE_KEEP_BYTES)
        if line is None:
            return shown, 0
        text = line.head.decode("utf-8", errors="replace")
        if line.length > len(line.head):  # only the line's head was read
            kept = text[:READ_MAX_LINE_CHARS]
            cut = line.length - len(kept.encode("utf-8", errors="replace"))
            text = f"{kept}… [line truncated: {cut} bytes omitted]"
        elif len(text) > READ_MAX_LINE_CHARS:
            cut = len(text) - READ_MAX_LINE_CHARS
            text = f"{text[:READ_MAX_LINE_CHARS]}… [line truncated: {cut} characters omitted]"
        entry = f"{line.number:>6}\t{text}"
        if shown and used + len(entry) + 1 > READ_MAX_CHARS:
            return shown, 1  # not shown: it is where the next read starts
        shown.append(entry)
        used += len(entry) + 1
    return shown, int(reader.next_line(0) is not None)


def _more_note(first: int, last: int, total: int, at_end: bool, scanned: int, size: int) -> str:
    if at_end:
        return f"[showing lines {first}-{last} of {total}; read on with offset={last + 1}]"
    return (
        f"[showing lines {first}-{last}; the file has {size} bytes and more lines follow "
        f"(lines were counted up to byte {scanned}: at least {total}); read on with "
        f"offset={last + 1}]"
    )


def _write_intent(ctx: ToolContext, path: str, content: str) -> dict[str, str]:
    rel = write_target(ctx.workspace, path, ctx.guard)
    return {shown_path(rel): sha256_bytes(encode_text(content, "content"))}


@tool(effect=Effect.WRITE, recovery=Recovery.VERIFY_THEN_CONTINUE, intent=_write_intent)
def write_file(
    ctx: ToolContext,
    path: FilePath,
    content: Annotated[str, Field(description="The file's complete new content.")],
) -> ToolResult:
    """Create or overwrite a file with the given content; missing parent directories are made."""
    data = encode_text(content, "content")
    rel, existed = replace_in_workspace(ctx.workspace, path, data, ctx.guard, fsync=ctx.fsync)
    verb = "overwrote" if existed else "created"
    shown = shown_path(rel)
    return ToolResult(
        output=f"{verb} {shown} ({len(data)} bytes)",
        changed_files={shown: sha256_bytes(data)},
    )


def apply_edit(rel: str, text: str, old_text: str, new_text: str) -> tuple[str, int]:
    """``text`` with the one occurrence of ``old_text`` replaced, and its line number.

    Refuses (ToolError) when ``old_text`` does not occur, with a hint where a near
    match is, or occurs more than once, saying how often.
    """
    if old_text == new_text:
        raise ToolError("old_text and new_text are identical; there is nothing to change")
    encode_text(old_text, "old_text")  # valid text only: a lone surrogate is refused
    encode_text(new_text, "new_text")
    rel = shown_path(rel)
    at = text.find(old_text)
    if at < 0:
        raise ToolError(f"old_text was not found in {rel}; {_near_miss_hint(text, old_text)}")
    if text.find(old_text, at + 1) >= 0:
        count = max(text.count(old_text), 2)  # overlapping occurrences count as two
        lines = _line_numbers(text, old_text)
        raise ToolError(
            f"old_text occurs {count} times in {rel} (at lines {', '.join(map(str, lines))}); "
            "include more surrounding lines so it matches exactly once"
        )
    line = text.count("\n", 0, at) + 1
    return text[:at] + new_text + text[at + len(old_text) :], line


def _edit_intent(ctx: ToolContext, path: str, old_text: str, new_text: str) -> dict[str, str]:
    rel, text = read_text(ctx, path)
    refuse_protected(path, rel, ctx.guard)
    new, _ = apply_edit(rel, text, old_text, new_text)
    return {shown_path(rel): sha256_bytes(encode_edited(new))}


@tool(effect=Effect.WRITE, recovery=Recovery.VERIFY_THEN_CONTINUE, intent=_edit_intent)
def edit_file(
    ctx: ToolContext,
    path: FilePath,
    old_text: Annotated[
        str,
        Field(
            min_length=1,
            description="Exact text to replace, including whitespace; must occur exactly once.",
        ),
    ],
    new_text: Annotated[str, Field(description="The text to put in its place.")],
) -> ToolResult:
    """Replace one exact, unique occurrence of old_text in a file with new_text."""
    rel, text = read_text(ctx, path)
    refuse_protected(path, rel, ctx.guard)
    new, line = apply_edit(rel, text, old_text, new_text)
    data = encode_edited(new)
    rel, _ = replace_in_workspace(ctx.workspace, path, data, ctx.guard, fsync=ctx.fsync)
    shown = shown_path(rel)
    return ToolResult(
        output=f"edited {shown}: replaced 1 occurrence at line {line}",
        changed_files={shown: sha256_bytes(data)},
    )


def _line_numbers(text: str, needle: str, most: int = 10) -> list[int]:
    found: list[int] = []
    start = text.find(needle)
    while start >= 0 and len(found) < most:
        found.append(text.count("\n", 0, start) + 1)
        start = text.find(needle, start + 1)
    return found


def _near_miss_hint(text: str, old_text: str) -> str:
    squashed_text = _squash(text)
    if _squash(old_text) and _squash(old_text) in squashed_text:
        return (
            "a match exists if whitespace is ignored (indentation, line endings or trailing "
            "spaces differ); read_file the region and copy the text exactly"
        )
    first = next((ln.strip() for ln in old_text.splitlines() if ln.strip()), "")
    if first:
        for number, line in enumerate(text.splitlines(), start=1):
            if first in line:
                return (
                    f"its first line occurs at line {number}, but the lines after it differ; "
                    "read_file from there and copy the text exactly"
                )
    return "read_file the file and copy the exact text to replace"


def _squash(text: str) -> str:
    return " ".join(text.split())
