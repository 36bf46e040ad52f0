"""Read-only discovery tools: list_dir, glob and grep.

None of them follows a symbolic link out of the workspace: walks go by directory
descriptor and never descend through links, glob shows a link only when it
resolves inside, grep opens only regular files, by descriptor and without
following a link. What the run's ``PathGuard`` says must not be listed (``.env``
files, paths a policy rule denies) is left out, never opened, and only counted.
Every result list is bounded and says when it was cut.

Each call stops at its deadline (``ToolContext.deadline``) with ``ToolTimedOut``
saying how far it got. Matching costs time linear in the input: glob patterns go
through ``keel.tools.globbing`` (an automaton over path components, pruning
directories nothing below can match), grep patterns through RE2
(``keel.tools.linesearch``). Names are shown as ``keel.core.pathnames`` spells
them (``\\xHH`` for a byte that is not UTF-8 or a control character), and a name
copied from the output reaches the same file.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Annotated

from pydantic import Field

from keel.core.errors import ToolError
from keel.core.pathnames import shown_path, spelled_path
from keel.tools.base import (
    Effect,
    PathArgument,
    PatternArgument,
    Recovery,
    ToolContext,
    ToolResult,
    tool,
)
from keel.tools.deadline import Stopwatch
from keel.tools.files import BINARY_SNIFF_BYTES, looks_binary
from keel.tools.fsroot import Opened, WorkspaceRoot, open_regular, read_at_most
from keel.tools.globbing import MAGIC, GlobPattern, States
from keel.tools.linesearch import LineRegex, compile_line_regex
from keel.tools.walk import SKIPPED_DIRS, WalkEntry, walk_tree

LIST_MAX_ENTRIES = 1000
GLOB_MAX_RESULTS = 500
GREP_MAX_MATCHES = 200
GREP_MAX_LINE_CHARS = 300
GREP_MAX_FILE_BYTES = 5 * 1024 * 1024  # larger files are skipped, and named
GREP_NAMED_SKIPS = 5  # skipped large files named in the output


@tool(effect=Effect.READ, recovery=Recovery.REPLAY_SAFE)
def list_dir(
    ctx: ToolContext,
    path: Annotated[
        PathArgument,
        Field(description="Directory relative to the workspace root (default: the root)."),
    ] = ".",
) -> ToolResult:
    """List a directory's entries: directories end with '/', files show their size."""
    clock = Stopwatch(ctx.deadline)
    entries: list[WalkEntry] = []
    total = hidden = 0
    with WorkspaceRoot(ctx.workspace) as root:
        opened = root.open(path)
        if opened is None:
            raise ToolError(f"directory {path!r} does not exist")
        with opened:
            if not opened.is_dir:
                raise ToolError(f"{path!r} is a file, not a directory; use read_file to read it")
            where = opened.shown
            check = _checker(clock, "list_dir", lambda: f"listed {total} entries of {where}")
            for entry in _walk(root, opened, ctx, check, max_depth=1, skip=frozenset()):
                if entry.hidden:
                    hidden += 1
                    continue
                total += 1
                if len(entries) < LIST_MAX_ENTRIES:
                    entries.append(entry)
    lines: list[str] = []
    for entry in entries:
        name = shown_path(entry.name)
        if entry.kind == "symlink":
            if entry.inside:
                lines.append(f"{name} -> {shown_path(entry.target)}")
            else:
                lines.append(f"{name} (symbolic link leading outside the workspace)")
        elif entry.kind == "dir":
            lines.append(f"{name}/")
        else:
            lines.append(f"{name}  ({entry.size} bytes)")
    if total > LIST_MAX_ENTRIES:
        lines.append(f"[{total - LIST_MAX_ENTRIES} more entries not shown]")
    if hidden:
        lines.append(_hidden_note(hidden))
    return ToolResult(output="\n".join([f"{where}:", *lines]) if lines else f"{where} is empty")


@tool(effect=Effect.READ, recovery=Recovery.REPLAY_SAFE)
def glob(
    ctx: ToolContext,
    pattern: Annotated[
        PatternArgument,
        Field(
            description="Glob relative to the workspace root: '*' and '?' stay within one "
            "directory, '**' spans directories (e.g. 'src/**/*.py').",
        ),
    ],
) -> ToolResult:
    """Find files and directories whose workspace-relative path matches a glob pattern."""
    clock = Stopwatch(ctx.deadline)
    with WorkspaceRoot(ctx.workspace) as root:
        segments = _pattern_segments(pattern, root.real)
        literal: list[str] = []
        for segment in segments:
            if MAGIC.search(segment):
                break
            literal.append(segment)
        rest = segments[len(literal) :]
        base = root.open("/".join(literal) or ".")
        if base is None:
            return ToolResult(output=_glob_output(pattern, [], 0, 0, 0))
        with base:
            if not rest:
                if not ctx.guard.listable(base.rel):
                    return ToolResult(output=_glob_output(pattern, [], 0, 0, 1))
                shown = f"{base.shown}/" if base.is_dir and base.rel != "." else base.shown
                return ToolResult(output=_glob_output(pattern, [shown], 1, 0, 0))
            if not base.is_dir:
                return ToolResult(output=_glob_output(pattern, [], 0, 0, 0))
            search = _GlobSearch(glob_matcher("/".join(rest)), base.rel)
            check = _checker(clock, "glob", search.progress)
            depth = None if "**" in rest else len(rest)
            for entry in _walk(root, base, ctx, check, max_depth=depth, descend=search.descend):
                search.see(entry)
    return ToolResult(
        output=_glob_output(
            pattern, sorted(search.found), search.total, search.hidden_links, search.hidden
        )
    )


class _GlobSearch:
    """glob's walk: the pattern's states per directory, what matched, what was hidden."""

    def __init__(self, pattern: GlobPattern, base: str) -> None:
        self.pattern = pattern
        self.states: dict[str, States] = {base: pattern.start}
        self.found: list[str] = []
        self.total = self.hidden_links = self.hidden = self.walked = 0

    def see(self, entry: WalkEntry) -> None:
        self.walked += 1
        parent = entry.rel.rsplit("/", 1)[0] if "/" in entry.rel else "."
        states = self.pattern.advance(self.states.get(parent, frozenset()), entry.name)
        if entry.kind == "dir" and self.pattern.alive(states):
            self.states[entry.rel] = states
        matches = self.pattern.accepts(states)
        if entry.hidden:
            self.hidden += matches or entry.kind == "dir"
        elif not matches:
            return
        elif entry.kind == "symlink" and not entry.inside:
            self.hidden_links += 1
        else:
            self.total += 1
            if len(self.found) < GLOB_MAX_RESULTS:
                name = shown_path(entry.rel)
                self.found.append(f"{name}/" if entry.kind == "dir" else name)

    def descend(self, entry: WalkEntry) -> bool:
        return entry.rel in self.states

    def progress(self) -> str:
        return (
            f"walked {self.walked} entries in {len(self.states)} directories that could "
            f"still match, found {self.total} matches so far; narrow the pattern (a literal "
            "directory first, fewer '**')"
        )


@tool(effect=Effect.READ, recovery=Recovery.REPLAY_SAFE)
def grep(
    ctx: ToolContext,
    pattern: Annotated[
        str,
        Field(
            description="Regular expression (RE2 syntax: no backreferences or lookaround), "
            "matched within each line.",
        ),
    ],
    path: Annotated[
        PathArgument,
        Field(description="File or directory to search (default: the whole workspace)."),
    ] = ".",
    glob: Annotated[
        PatternArgument | None,
        Field(
            description="Only search files matching this glob: without '/' it matches the "
            "file name ('*.py'), with '/' the path below `path` ('src/**/*.py').",
        ),
    ] = None,
) -> ToolResult:
    """Search text files for lines matching a regular expression; binary files are skipped."""
    clock = Stopwatch(ctx.deadline)
    search = _Search(compile_line_regex(pattern))
    name_filter = glob_matcher(glob) if glob else None
    by_path = "/" in (glob or "")
    check = _checker(clock, "grep", search.progress)
    with WorkspaceRoot(ctx.workspace) as root:
        start = root.open(path)
        if start is None:
            raise ToolError(f"path {path!r} does not exist")
        with start:
            if start.is_file:
                if name_filter is None or name_filter.matches("." if by_path else start.name):
                    search.scan(start.rel, start.fd, start.st.st_size, check)
            elif not start.is_dir:
                raise ToolError(f"{path!r} is not a regular file or a directory")
            else:
                for entry in _walk(root, start, ctx, check):
                    wanted = entry.kind == "file" and (
                        name_filter is None
                        or name_filter.matches(
                            _below(entry.rel, start.rel) if by_path else entry.name
                        )
                    )
                    if entry.hidden:  # counted, never opened
                        search.hidden += wanted or entry.kind == "dir"
                    elif wanted and search.entry(entry.dir_fd, entry.name, entry.rel, check):
                        break
    return ToolResult(output=search.report(pattern, path))


class _Search:
    """grep's running tally: matching lines, files matched, what was skipped and why."""

    def __init__(self, regex: LineRegex) -> None:
        self.regex = regex
        self.matches: list[str] = []
        self.files = self.files_matched = self.binary = self.hidden = 0
        self.large: list[str] = []
        self.more = False

    def entry(self, dir_fd: int, name: str, rel: str, check: Callable[[], None]) -> bool:
        """Search a walked file, opened by descriptor; True when the match limit was reached."""
        opened = open_regular(dir_fd, name)
        if opened is None:
            return False  # replaced by a link or something else since it was listed
        fd, size = opened
        try:
            return self.scan(rel, fd, size, check)
        finally:
            os.close(fd)

    def scan(self, rel: str, fd: int, size: int, check: Callable[[], None]) -> bool:
        """Search the open file ``fd``; True when the match limit was reached."""
        self.files += 1
        shown = shown_path(rel)
        data = read_at_most(fd, GREP_MAX_FILE_BYTES + 1) if size <= GREP_MAX_FILE_BYTES else b""
        if size > GREP_MAX_FILE_BYTES or len(data) > GREP_MAX_FILE_BYTES:
            self.large.append(shown)
            return False
        if looks_binary(data[:BINARY_SNIFF_BYTES]):
            self.binary += 1
            return False
        before = len(self.matches)

        def found(number: int, line: bytes) -> bool:
            if len(self.matches) >= GREP_MAX_MATCHES:
                self.more = True
                return True
            text = line.decode("utf-8", errors="replace")
            cut = "…" if len(text) > GREP_MAX_LINE_CHARS else ""
            self.matches.append(f"{shown}:{number}: {text[:GREP_MAX_LINE_CHARS]}{cut}")
            return False

        self.regex.search(data, found, check)
        self.files_matched += len(self.matches) > before
        return self.more

    def progress(self) -> str:
        return (
            f"searched {self.files} files and found {len(self.matches)} matching lines so "
            "far; narrow the path or the glob"
        )

    def report(self, pattern: str, path: str) -> str:
        notes = []
        if self.more:
            notes.append(
                f"[stopped at {GREP_MAX_MATCHES} matches; narrow the pattern, path or glob]"
            )
        if self.binary:
            notes.append(f"[{self.binary} binary files skipped]")
        if self.large:
            named = ", ".join(self.large[:GREP_NAMED_SKIPS])
            others = len(self.large) - GREP_NAMED_SKIPS
            more = f" and {others} more" if others > 0 else ""
            notes.append(
                f"[{len(self.large)} files over {GREP_MAX_FILE_BYTES} bytes not searched: "
                f"{named}{more}; read_file reads them in pieces]"
            )
        if self.hidden:
            notes.append(_hidden_note(self.hidden))
        if not self.matches:
            return "\n".join([f"no lines match {pattern!r} in {path}", *notes])
        summary = f"[{len(self.matches)} matching lines in {self.files_matched} files]"
        return "\n".join([*self.matches, summary, *notes])


def glob_matcher(pattern: str) -> GlobPattern:
    """The matcher of a glob as the model spells it (``keel.core.pathnames``)."""
    return GlobPattern(spelled_path(pattern, what="pattern", check_lengths=False))


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


def _checker(clock: Stopwatch, tool: str, covered: Callable[[], str]) -> Callable[[], None]:
    return lambda: clock.check(tool, covered)


def _walk(
    root: WorkspaceRoot,
    directory: Opened,
    ctx: ToolContext,
    check: Callable[[], None],
    *,
    max_depth: int | None = None,
    skip: frozenset[str] = SKIPPED_DIRS,
    descend: Callable[[WalkEntry], bool] | None = None,
) -> Iterator[WalkEntry]:
    """The walk below the open ``directory``, marking what the run's guard hides."""
    return walk_tree(
        root,
        directory.fd,
        directory.rel,
        max_depth=max_depth,
        listable=ctx.guard.listable,
        skip=skip,
        check=check,
        descend=descend,
    )


def _below(rel: str, start: str) -> str:
    return rel if start == "." else rel[len(start) + 1 :]


def _hidden_note(count: int) -> str:
    return f"[{count} entries hidden by policy]"


def _glob_output(pattern: str, found: list[str], total: int, hidden_links: int, hidden: int) -> str:
    lines = list(found)
    if total > len(found):
        lines.append(f"[{total - len(found)} more matches not shown; narrow the pattern]")
    if hidden_links:
        lines.append(f"[{hidden_links} symbolic links leading outside the workspace not shown]")
    if hidden:
        lines.append(_hidden_note(hidden))
    return "\n".join(lines) if found else "\n".join([f"no paths match {pattern!r}", *lines])
