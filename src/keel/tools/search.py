"""Read-only discovery tools: list_dir, glob and grep.

None of them follows a symbolic link out of the workspace: walks go by directory
descriptor and never descend through links, glob shows a link only when it
resolves inside, grep opens only regular files, by descriptor and without
following a link. What the run's ``PathGuard`` says must not be listed (``.env``
files, paths a policy rule denies) is left out, never opened, and only counted.
Every result list is bounded and says when it was cut.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from typing import Annotated

from pydantic import Field

from keel.core.errors import ToolError
from keel.tools.base import Effect, Recovery, ToolContext, ToolResult, tool
from keel.tools.files import BINARY_SNIFF_BYTES, looks_binary
from keel.tools.fsroot import Opened, WorkspaceRoot, open_regular, read_all
from keel.tools.walk import SKIPPED_DIRS, WalkEntry, walk_tree

LIST_MAX_ENTRIES = 1000
GLOB_MAX_RESULTS = 500
GREP_MAX_MATCHES = 200
GREP_MAX_LINE_CHARS = 300
GREP_MAX_FILE_BYTES = 5 * 1024 * 1024
_MAGIC = re.compile(r"[*?\[]")


@tool(effect=Effect.READ, recovery=Recovery.REPLAY_SAFE)
def list_dir(
    ctx: ToolContext,
    path: Annotated[
        str, Field(description="Directory relative to the workspace root (default: the root).")
    ] = ".",
) -> ToolResult:
    """List a directory's entries: directories end with '/', files show their size."""
    with WorkspaceRoot(ctx.workspace) as root:
        opened = root.open(path)
        if opened is None:
            raise ToolError(f"directory {path!r} does not exist")
        with opened:
            if not opened.is_dir:
                raise ToolError(f"{path!r} is a file, not a directory; use read_file to read it")
            where = opened.rel
            entries, hidden = [], 0
            for entry in _walk(root, opened, ctx, max_depth=1, skip=frozenset()):
                if entry.hidden:
                    hidden += 1
                else:
                    entries.append(entry)
    lines: list[str] = []
    for entry in entries[:LIST_MAX_ENTRIES]:
        if entry.kind == "symlink":
            if entry.inside:
                lines.append(f"{entry.name} -> {entry.target}")
            else:
                lines.append(f"{entry.name} (symbolic link leading outside the workspace)")
        elif entry.kind == "dir":
            lines.append(f"{entry.name}/")
        else:
            lines.append(f"{entry.name}  ({entry.size} bytes)")
    if len(entries) > LIST_MAX_ENTRIES:
        lines.append(f"[{len(entries) - LIST_MAX_ENTRIES} more entries not shown]")
    if hidden:
        lines.append(_hidden_note(hidden))
    return ToolResult(output="\n".join([f"{where}:", *lines]) if lines else f"{where} is empty")


@tool(effect=Effect.READ, recovery=Recovery.REPLAY_SAFE)
def glob(
    ctx: ToolContext,
    pattern: Annotated[
        str,
        Field(
            description="Glob relative to the workspace root: '*' and '?' stay within one "
            "directory, '**' spans directories (e.g. 'src/**/*.py').",
        ),
    ],
) -> ToolResult:
    """Find files and directories whose workspace-relative path matches a glob pattern."""
    with WorkspaceRoot(ctx.workspace) as root:
        segments = _pattern_segments(pattern, root.real)
        literal: list[str] = []
        for segment in segments:
            if _MAGIC.search(segment):
                break
            literal.append(segment)
        rest = segments[len(literal) :]
        base = root.open("/".join(literal) or ".")
        if base is None:
            return ToolResult(output=_glob_output(pattern, [], 0, 0))
        with base:
            if not rest:
                if not ctx.guard.listable(base.rel):
                    return ToolResult(output=_glob_output(pattern, [], 0, 1))
                shown = f"{base.rel}/" if base.is_dir and base.rel != "." else base.rel
                return ToolResult(output=_glob_output(pattern, [shown], 0, 0))
            if not base.is_dir:
                return ToolResult(output=_glob_output(pattern, [], 0, 0))
            matcher = glob_regex("/".join(rest))
            depth = None if "**" in rest else len(rest)
            found: list[str] = []
            hidden_links = hidden = 0
            for entry in _walk(root, base, ctx, max_depth=depth):
                matches = matcher.fullmatch(_below(entry.rel, base.rel)) is not None
                if entry.hidden:
                    hidden += matches or entry.kind == "dir"
                elif not matches:
                    continue
                elif entry.kind == "symlink" and not entry.inside:
                    hidden_links += 1
                else:
                    found.append(f"{entry.rel}/" if entry.kind == "dir" else entry.rel)
    return ToolResult(output=_glob_output(pattern, sorted(found), hidden_links, hidden))


@tool(effect=Effect.READ, recovery=Recovery.REPLAY_SAFE)
def grep(
    ctx: ToolContext,
    pattern: Annotated[str, Field(description="Python regular expression, matched per line.")],
    path: Annotated[
        str, Field(description="File or directory to search (default: the whole workspace).")
    ] = ".",
    glob: Annotated[
        str | None,
        Field(
            description="Only search files matching this glob: without '/' it matches the "
            "file name ('*.py'), with '/' the path below `path` ('src/**/*.py').",
        ),
    ] = None,
) -> ToolResult:
    """Search text files for lines matching a regular expression; binary files are skipped."""
    try:
        regex = re.compile(pattern)
    except re.error as exc:
        raise ToolError(f"invalid regular expression {pattern!r}: {exc}") from None
    name_filter = glob_regex(glob) if glob else None
    by_path = "/" in (glob or "")
    search = _Search(regex)
    with WorkspaceRoot(ctx.workspace) as root:
        start = root.open(path)
        if start is None:
            raise ToolError(f"path {path!r} does not exist")
        with start:
            if start.is_file:
                if name_filter is None or name_filter.fullmatch("." if by_path else start.name):
                    search.scan(start.rel, start.fd, start.st.st_size)
            elif not start.is_dir:
                raise ToolError(f"{path!r} is not a regular file or a directory")
            else:
                for entry in _walk(root, start, ctx):
                    wanted = entry.kind == "file" and (
                        name_filter is None
                        or name_filter.fullmatch(
                            _below(entry.rel, start.rel) if by_path else entry.name
                        )
                        is not None
                    )
                    if entry.hidden:  # counted, never opened
                        search.hidden += wanted or entry.kind == "dir"
                    elif wanted and search.entry(entry.dir_fd, entry.name, entry.rel):
                        break
    return ToolResult(output=search.report(pattern, path))


class _Search:
    """grep's running tally: matching lines, files matched, what was skipped and why."""

    def __init__(self, regex: re.Pattern[str]) -> None:
        self.regex = regex
        self.matches: list[str] = []
        self.files_matched = self.binary = self.large = self.hidden = 0
        self.more = False

    def entry(self, dir_fd: int, name: str, rel: str) -> bool:
        """Search a walked file, opened by descriptor; True when the match limit was reached."""
        opened = open_regular(dir_fd, name)
        if opened is None:
            return False  # replaced by a link or something else since it was listed
        fd, size = opened
        try:
            return self.scan(rel, fd, size)
        finally:
            os.close(fd)

    def scan(self, rel: str, fd: int, size: int) -> bool:
        """Search the open file ``fd``; True when the match limit was reached."""
        if size > GREP_MAX_FILE_BYTES:
            self.large += 1
            return False
        data = read_all(fd, size)
        if looks_binary(data[:BINARY_SNIFF_BYTES]):
            self.binary += 1
            return False
        hit = False
        for number, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
            if self.regex.search(line):
                if len(self.matches) >= GREP_MAX_MATCHES:
                    self.more = True
                    break
                hit = True
                cut = "…" if len(line) > GREP_MAX_LINE_CHARS else ""
                self.matches.append(f"{rel}:{number}: {line[:GREP_MAX_LINE_CHARS]}{cut}")
        self.files_matched += hit
        return self.more

    def report(self, pattern: str, path: str) -> str:
        notes = []
        if self.more:
            notes.append(
                f"[stopped at {GREP_MAX_MATCHES} matches; narrow the pattern, path or glob]"
            )
        if self.binary:
            notes.append(f"[{self.binary} binary files skipped]")
        if self.large:
            notes.append(f"[{self.large} files over {GREP_MAX_FILE_BYTES} bytes skipped]")
        if self.hidden:
            notes.append(_hidden_note(self.hidden))
        if not self.matches:
            return "\n".join([f"no lines match {pattern!r} in {path}", *notes])
        summary = f"[{len(self.matches)} matching lines in {self.files_matched} files]"
        return "\n".join([*self.matches, summary, *notes])


def glob_regex(pattern: str) -> re.Pattern[str]:
    """A regex for whole posix paths: '*' and '?' never cross '/', '**' spans directories."""
    segments = pattern.split("/")
    out = []
    for i, segment in enumerate(segments):
        last = i == len(segments) - 1
        if segment == "**":
            out.append(".*" if last else "(?:[^/]+/)*")
        else:
            out.append(_segment_regex(segment) + ("" if last else "/"))
    return re.compile("".join(out))


def _segment_regex(segment: str) -> str:
    out, i = [], 0
    while i < len(segment):
        char = segment[i]
        if char == "*":
            out.append("[^/]*")
        elif char == "?":
            out.append("[^/]")
        elif char == "[" and (end := segment.find("]", i + 2)) > 0:
            body = segment[i + 1 : end]
            negate = body.startswith("!")
            body = re.sub(r"([\\^\]])", r"\\\1", body[1:] if negate else body)
            out.append(f"[{'^/' if negate else ''}{body}]")
            i = end
        else:
            out.append(re.escape(char))
        i += 1
    return "".join(out)


def _pattern_segments(pattern: str, root: str) -> list[str]:
    text = pattern.strip()
    if not text:
        raise ToolError("pattern is empty; e.g. '**/*.py'")
    if os.path.isabs(text):
        if not text.startswith(root + "/"):
            raise ToolError(f"pattern {pattern!r} is outside the workspace {root}")
        text = text[len(root) + 1 :]
    segments = [s for s in text.split("/") if s not in ("", ".")]
    if ".." in segments:
        raise ToolError(f"pattern {pattern!r} is outside the workspace {root}: '..' is refused")
    return segments or ["."]


def _walk(
    root: WorkspaceRoot,
    directory: Opened,
    ctx: ToolContext,
    *,
    max_depth: int | None = None,
    skip: frozenset[str] = SKIPPED_DIRS,
) -> Iterator[WalkEntry]:
    """The walk below the open ``directory``, marking what the run's guard hides."""
    return walk_tree(
        root,
        directory.fd,
        directory.rel,
        max_depth=max_depth,
        listable=ctx.guard.listable,
        skip=skip,
    )


def _below(rel: str, start: str) -> str:
    return rel if start == "." else rel[len(start) + 1 :]


def _hidden_note(count: int) -> str:
    return f"[{count} entries hidden by policy]"


def _glob_output(pattern: str, found: list[str], hidden_links: int, hidden: int) -> str:
    lines = found[:GLOB_MAX_RESULTS]
    if len(found) > GLOB_MAX_RESULTS:
        lines.append(
            f"[{len(found) - GLOB_MAX_RESULTS} more matches not shown; narrow the pattern]"
        )
    if hidden_links:
        lines.append(f"[{hidden_links} symbolic links leading outside the workspace not shown]")
    if hidden:
        lines.append(_hidden_note(hidden))
    return "\n".join(lines) if found else "\n".join([f"no paths match {pattern!r}", *lines])
