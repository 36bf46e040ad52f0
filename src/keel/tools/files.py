"""File tools: read_file, write_file and edit_file, confined to the workspace.

write_file and edit_file are VERIFY_THEN_CONTINUE: before they run, their intent
(path -> sha256 of the content the file will have) is computed from the arguments,
and writes are atomic renames, so after a crash the file's hash tells whether the
effect happened. Both refuse, in their intent too, any write whose real path the
run's ``PathGuard`` protects (``.keel/``, the store, ``.git/config``, ``.git/hooks/``),
however the path is spelled and through whatever link inside the workspace.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from keel.core.errors import ToolError
from keel.tools.base import Effect, Recovery, ToolContext, ToolResult, tool
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

FilePath = Annotated[str, Field(description="File path relative to the workspace root.")]


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


def read_text(ctx: ToolContext, path: str) -> tuple[str, str]:
    """(workspace-relative path, text) of an existing UTF-8-ish text file, or a ToolError."""
    rel, data = read_in_workspace(ctx.workspace, path)
    if looks_binary(data):
        raise ToolError(f"{path!r} is a binary file ({len(data)} bytes); it cannot be shown")
    return rel, data.decode("utf-8", errors="replace")


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
    rel, text = read_text(ctx, path)
    lines = text.splitlines()
    if not lines:
        return ToolResult(output=f"{rel} is empty")
    first = offset or 1
    if first > len(lines):
        raise ToolError(f"offset {first} is past the end of {rel}, which has {len(lines)} lines")
    wanted = limit or READ_DEFAULT_LINES
    shown: list[str] = []
    used = 0
    for number in range(first, min(len(lines), first + wanted - 1) + 1):
        line = lines[number - 1]
        if len(line) > READ_MAX_LINE_CHARS:
            cut = len(line) - READ_MAX_LINE_CHARS
            line = f"{line[:READ_MAX_LINE_CHARS]}… [line truncated: {cut} characters omitted]"
        entry = f"{number:>6}\t{line}"
        if shown and used + len(entry) + 1 > READ_MAX_CHARS:
            break
        shown.append(entry)
        used += len(entry) + 1
    last = first + len(shown) - 1
    if last < len(lines):
        shown.append(
            f"[showing lines {first}-{last} of {len(lines)}; read on with offset={last + 1}]"
        )
    return ToolResult(output="\n".join(shown))


def _write_intent(ctx: ToolContext, path: str, content: str) -> dict[str, str]:
    rel = write_target(ctx.workspace, path, ctx.guard)
    return {rel: sha256_bytes(encode_text(content, "content"))}


@tool(effect=Effect.WRITE, recovery=Recovery.VERIFY_THEN_CONTINUE, intent=_write_intent)
def write_file(
    ctx: ToolContext,
    path: FilePath,
    content: Annotated[str, Field(description="The file's complete new content.")],
) -> ToolResult:
    """Create or overwrite a file with the given content; missing parent directories are made."""
    data = encode_text(content, "content")
    rel, existed = replace_in_workspace(ctx.workspace, path, data, ctx.guard)
    verb = "overwrote" if existed else "created"
    return ToolResult(
        output=f"{verb} {rel} ({len(data)} bytes)",
        changed_files={rel: sha256_bytes(data)},
    )


def apply_edit(rel: str, text: str, old_text: str, new_text: str) -> tuple[str, int]:
    """``text`` with the one occurrence of ``old_text`` replaced, and its line number.

    Refuses (ToolError) when ``old_text`` does not occur, with a hint where a near
    match is, or occurs more than once, saying how often.
    """
    if old_text == new_text:
        raise ToolError("old_text and new_text are identical; there is nothing to change")
    at = text.find(old_text)
    if at < 0:
        raise ToolError(f"old_text was not found in {rel}; {_near_miss_hint(text, old_text)}")
    count = _occurrences(text, old_text)
    if count > 1:
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
    return {rel: sha256_bytes(encode_text(new, "new_text"))}


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
    data = encode_text(new, "new_text")
    rel, _ = replace_in_workspace(ctx.workspace, path, data, ctx.guard)
    return ToolResult(
        output=f"edited {rel}: replaced 1 occurrence at line {line}",
        changed_files={rel: sha256_bytes(data)},
    )


def _occurrences(text: str, needle: str) -> int:
    count, start = 0, text.find(needle)
    while start >= 0:
        count += 1
        start = text.find(needle, start + 1)
    return count


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
