"""Read-only discovery tools: list_dir, glob and grep.

None of them follows a symbolic link out of the workspace: walks never descend
through links, glob shows a link only when it resolves inside, grep reads only
regular files. Every result list is bounded and says when it was cut.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated

from pydantic import Field

from keel.core.errors import ToolError
from keel.tools.base import Effect, Recovery, ToolContext, ToolResult, tool
from keel.tools.files import BINARY_SNIFF_BYTES, looks_binary
from keel.tools.workspace import relative_posix, resolve_in_workspace, walk_workspace

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
    real = resolve_in_workspace(ctx.workspace, path, for_write=False)
    if not real.exists():
        raise ToolError(f"directory {path!r} does not exist")
    if not real.is_dir():
        raise ToolError(f"{path!r} is a file, not a directory; use read_file to read it")
    root = ctx.workspace.resolve()
    with os.scandir(real) as it:
        entries = sorted(it, key=lambda e: e.name)
    lines: list[str] = []
    for entry in entries[:LIST_MAX_ENTRIES]:
        if entry.is_symlink():
            target = Path(os.path.realpath(entry.path))
            if target == root or root in target.parents:
                lines.append(f"{entry.name} -> {relative_posix(root, target)}")
            else:
                lines.append(f"{entry.name} (symbolic link leading outside the workspace)")
        elif entry.is_dir(follow_symlinks=False):
            lines.append(f"{entry.name}/")
        else:
            lines.append(f"{entry.name}  ({entry.stat(follow_symlinks=False).st_size} bytes)")
    if len(entries) > LIST_MAX_ENTRIES:
        lines.append(f"[{len(entries) - LIST_MAX_ENTRIES} more entries not shown]")
    where = relative_posix(root, real)
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
    root = ctx.workspace.resolve()
    segments = _pattern_segments(pattern, root)
    literal: list[str] = []
    for segment in segments:
        if _MAGIC.search(segment):
            break
        literal.append(segment)
    rest = segments[len(literal) :]
    base = resolve_in_workspace(ctx.workspace, "/".join(literal) or ".", for_write=False)
    if not rest:
        found = [_display(root, base)] if base.exists() else []
        return ToolResult(output=_glob_output(pattern, found, 0))
    if not base.is_dir():
        return ToolResult(output=_glob_output(pattern, [], 0))
    matcher = glob_regex("/".join(rest))
    depth = None if "**" in rest else len(rest)
    found, hidden_links = [], 0
    for entry in walk_workspace(root, base, max_depth=depth):
        if not matcher.fullmatch(entry.path.relative_to(base).as_posix()):
            continue
        if entry.kind == "symlink" and not entry.inside:
            hidden_links += 1
            continue
        found.append(_display(root, entry.path) if entry.kind != "symlink" else entry.rel)
    return ToolResult(output=_glob_output(pattern, sorted(found), hidden_links))


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
    root = ctx.workspace.resolve()
    start = resolve_in_workspace(ctx.workspace, path, for_write=False)
    if not start.exists():
        raise ToolError(f"path {path!r} does not exist")
    name_filter = glob_regex(glob) if glob else None
    if start.is_file():
        files = [start]
    else:
        files = [e.path for e in walk_workspace(root, start) if e.kind == "file"]
    matches: list[str] = []
    skipped_binary = skipped_large = files_matched = 0
    more = False
    for file in files:
        if name_filter is not None:
            target = file.name if "/" not in (glob or "") else _below(file, start)
            if not name_filter.fullmatch(target):
                continue
        if file.stat().st_size > GREP_MAX_FILE_BYTES:
            skipped_large += 1
            continue
        data = file.read_bytes()
        if looks_binary(data[:BINARY_SNIFF_BYTES]):
            skipped_binary += 1
            continue
        rel = relative_posix(root, file)
        hit = False
        for number, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
            if regex.search(line):
                if len(matches) >= GREP_MAX_MATCHES:
                    more = True
                    break
                hit = True
                cut = "…" if len(line) > GREP_MAX_LINE_CHARS else ""
                matches.append(f"{rel}:{number}: {line[:GREP_MAX_LINE_CHARS]}{cut}")
        files_matched += hit
        if more:
            break
    notes = []
    if more:
        notes.append(f"[stopped at {GREP_MAX_MATCHES} matches; narrow the pattern, path or glob]")
    if skipped_binary:
        notes.append(f"[{skipped_binary} binary files skipped]")
    if skipped_large:
        notes.append(f"[{skipped_large} files over {GREP_MAX_FILE_BYTES} bytes skipped]")
    if not matches:
        return ToolResult(output="\n".join([f"no lines match {pattern!r} in {path}", *notes]))
    summary = f"[{len(matches)} matching lines in {files_matched} files]"
    return ToolResult(output="\n".join([*matches, summary, *notes]))


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


def _pattern_segments(pattern: str, root: Path) -> list[str]:
    text = pattern.strip()
    if not text:
        raise ToolError("pattern is empty; e.g. '**/*.py'")
    if os.path.isabs(text):
        if not text.startswith(str(root) + "/"):
            raise ToolError(f"pattern {pattern!r} is outside the workspace {root}")
        text = text[len(str(root)) + 1 :]
    segments = [s for s in text.split("/") if s not in ("", ".")]
    if ".." in segments:
        raise ToolError(f"pattern {pattern!r} is outside the workspace {root}: '..' is refused")
    return segments or ["."]


def _display(root: Path, path: Path) -> str:
    rel = relative_posix(root, path)
    return f"{rel}/" if path.is_dir() and rel != "." else rel


def _below(file: Path, start: Path) -> str:
    return file.relative_to(start).as_posix()


def _glob_output(pattern: str, found: list[str], hidden_links: int) -> str:
    lines = found[:GLOB_MAX_RESULTS]
    if len(found) > GLOB_MAX_RESULTS:
        lines.append(
            f"[{len(found) - GLOB_MAX_RESULTS} more matches not shown; narrow the pattern]"
        )
    if hidden_links:
        lines.append(f"[{hidden_links} symbolic links leading outside the workspace not shown]")
    return "\n".join(lines) if found else "\n".join([f"no paths match {pattern!r}", *lines])
