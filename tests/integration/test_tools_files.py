"""File tools on a real directory: read, write, edit, list, glob, grep, and write intents."""

from __future__ import annotations

import hashlib
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from keel.core.errors import ToolArgumentError, ToolError
from keel.tools import ToolContext, ToolResult, default_registry
from keel.tools.files import READ_MAX_CHARS
from keel.tools.search import GLOB_MAX_RESULTS, GREP_MAX_MATCHES

Call = Callable[..., ToolResult]


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    return root.resolve()


@pytest.fixture
def ctx(ws: Path) -> ToolContext:
    return ToolContext(workspace=ws, run_id="run_1", call_id="call_1", owner="me")


@pytest.fixture
def call(ctx: ToolContext) -> Call:
    registry = default_registry()

    def run(name: str, **args: Any) -> ToolResult:
        return registry.execute(name, args, ctx)

    return run


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --- read_file ------------------------------------------------------------------------


def test_read_file_numbers_lines(ws: Path, call: Call) -> None:
    (ws / "a.txt").write_text("alpha\nbeta\n")
    assert call("read_file", path="a.txt").output == "     1\talpha\n     2\tbeta"


def test_read_file_offset_and_limit_show_a_window_and_how_to_go_on(ws: Path, call: Call) -> None:
    (ws / "a.txt").write_text("".join(f"line {i}\n" for i in range(1, 11)))
    out = call("read_file", path="a.txt", offset=3, limit=2).output.splitlines()
    assert out == [
        "     3\tline 3",
        "     4\tline 4",
        "[showing lines 3-4 of 10; read on with offset=5]",
    ]


def test_read_file_bounds_a_large_file(ws: Path, call: Call) -> None:
    (ws / "big.txt").write_text(("y" * 100 + "\n") * 2000)
    out = call("read_file", path="big.txt").output
    assert len(out) <= READ_MAX_CHARS + 100
    assert out.splitlines()[-1].startswith("[showing lines 1-")
    assert "read on with offset=" in out


def test_read_file_truncates_a_very_long_line(ws: Path, call: Call) -> None:
    (ws / "min.js").write_text("z" * 5000)
    assert call("read_file", path="min.js").output.endswith(
        "… [line truncated: 3000 characters omitted]"
    )


def test_read_file_errors_are_precise(ws: Path, call: Call) -> None:
    (ws / "d").mkdir()
    (ws / "bin").write_bytes(b"\x7fELF\x00\x01")
    (ws / "a.txt").write_text("one\n")
    (ws / "empty.txt").write_text("")
    with pytest.raises(ToolError, match=r"file 'nope\.txt' does not exist"):
        call("read_file", path="nope.txt")
    with pytest.raises(ToolError, match="'d' is a directory; use list_dir"):
        call("read_file", path="d")
    with pytest.raises(ToolError, match="'bin' is a binary file"):
        call("read_file", path="bin")
    with pytest.raises(ToolError, match=r"offset 5 is past the end of a\.txt, which has 1 lines"):
        call("read_file", path="a.txt", offset=5)
    with pytest.raises(ToolArgumentError, match="offset: Input should be greater than or equal"):
        call("read_file", path="a.txt", offset=0)
    assert call("read_file", path="empty.txt").output == "empty.txt is empty"


# --- write_file -----------------------------------------------------------------------


def test_write_file_creates_parents_and_reports_the_hash(ws: Path, call: Call) -> None:
    result = call("write_file", path="src/pkg/mod.py", content="x = 1\n")
    assert (ws / "src/pkg/mod.py").read_text() == "x = 1\n"
    assert result.changed_files == {"src/pkg/mod.py": sha(b"x = 1\n")}
    assert result.output == "created src/pkg/mod.py (6 bytes)"


def test_write_file_overwrites_and_keeps_the_file_mode(ws: Path, call: Call) -> None:
    script = ws / "run.sh"
    script.write_text("old")
    script.chmod(0o755)
    result = call("write_file", path="run.sh", content="#!/bin/sh\necho new\n")
    assert result.output.startswith("overwrote run.sh")
    assert script.read_text() == "#!/bin/sh\necho new\n"
    assert stat.S_IMODE(script.stat().st_mode) == 0o755
    assert [p.name for p in ws.iterdir()] == ["run.sh"]  # no temporary file left behind


def test_write_file_refuses_a_directory_and_a_file_as_parent(ws: Path, call: Call) -> None:
    (ws / "d").mkdir()
    (ws / "f").write_text("")
    with pytest.raises(ToolError, match="path 'd' is a directory"):
        call("write_file", path="d", content="x")
    with pytest.raises(ToolError, match="a parent is a file"):
        call("write_file", path="f/x.txt", content="x")


def test_write_file_intent_tells_whether_the_write_happened(ws: Path, ctx: ToolContext) -> None:
    write = default_registry().get("write_file")
    args = {"path": "new/out.txt", "content": "hello"}
    intent = write.intent(ctx, args)
    assert intent == {"new/out.txt": sha(b"hello")}
    assert write.effect_happened(ctx, intent) is False
    write.run(ctx, write.parse_arguments(args))
    assert write.effect_happened(ctx, intent) is True
    (ws / "new/out.txt").write_text("changed by someone else")
    assert write.effect_happened(ctx, intent) is False


# --- edit_file ------------------------------------------------------------------------


def test_edit_file_replaces_the_unique_match(ws: Path, call: Call) -> None:
    (ws / "req.txt").write_text("flask==2.0\nrequests==2.19.0\n")
    result = call(
        "edit_file", path="req.txt", old_text="requests==2.19.0", new_text="requests==2.32.3"
    )
    assert (ws / "req.txt").read_text() == "flask==2.0\nrequests==2.32.3\n"
    assert result.output == "edited req.txt: replaced 1 occurrence at line 2"
    assert result.changed_files == {"req.txt": sha(b"flask==2.0\nrequests==2.32.3\n")}


def test_edit_file_with_no_match_says_so_and_leaves_the_file(ws: Path, call: Call) -> None:
    (ws / "a.py").write_text("def f():\n    return 1\n")
    with pytest.raises(ToolError) as info:
        call("edit_file", path="a.py", old_text="return 2", new_text="return 3")
    assert str(info.value) == (
        "old_text was not found in a.py; read_file the file and copy the exact text to replace"
    )
    assert (ws / "a.py").read_text() == "def f():\n    return 1\n"


def test_edit_file_no_match_hints_at_a_whitespace_difference(ws: Path, call: Call) -> None:
    (ws / "a.py").write_text("def f():\n    return 1\n")
    with pytest.raises(ToolError, match="a match exists if whitespace is ignored"):
        call("edit_file", path="a.py", old_text="def f():\n  return 1", new_text="x")


def test_edit_file_no_match_hints_where_the_first_line_is(ws: Path, call: Call) -> None:
    (ws / "a.py").write_text("import os\ndef f():\n    return 1\n")
    with pytest.raises(ToolError, match="its first line occurs at line 2, but the lines after"):
        call("edit_file", path="a.py", old_text="def f():\n    return 2", new_text="x")


def test_edit_file_with_several_matches_says_how_many(ws: Path, call: Call) -> None:
    (ws / "a.py").write_text("x = 1\ny = 2\nx = 1\nx = 1\n")
    with pytest.raises(ToolError) as info:
        call("edit_file", path="a.py", old_text="x = 1", new_text="x = 9")
    assert str(info.value) == (
        "old_text occurs 3 times in a.py (at lines 1, 3, 4); "
        "include more surrounding lines so it matches exactly once"
    )
    assert (ws / "a.py").read_text() == "x = 1\ny = 2\nx = 1\nx = 1\n"


def test_edit_file_refuses_empty_or_identical_text_and_missing_files(ws: Path, call: Call) -> None:
    (ws / "a.py").write_text("x = 1\n")
    with pytest.raises(ToolArgumentError, match="old_text: String should have at least 1"):
        call("edit_file", path="a.py", old_text="", new_text="y")
    with pytest.raises(ToolError, match="identical"):
        call("edit_file", path="a.py", old_text="x", new_text="x")
    with pytest.raises(ToolError, match=r"file 'b\.py' does not exist"):
        call("edit_file", path="b.py", old_text="x", new_text="y")


def test_edit_file_intent_tells_whether_the_edit_happened(ws: Path, ctx: ToolContext) -> None:
    (ws / "a.py").write_text("x = 1\n")
    edit = default_registry().get("edit_file")
    args = {"path": "a.py", "old_text": "1", "new_text": "2"}
    intent = edit.intent(ctx, args)
    assert intent == {"a.py": sha(b"x = 2\n")}
    assert edit.effect_happened(ctx, intent) is False
    edit.run(ctx, edit.parse_arguments(args))
    assert edit.effect_happened(ctx, intent) is True


def test_edit_file_intent_fails_like_the_edit_would(ws: Path, ctx: ToolContext) -> None:
    (ws / "a.py").write_text("x = 1\nx = 1\n")
    with pytest.raises(ToolError, match="occurs 2 times"):
        default_registry().get("edit_file").intent(
            ctx, {"path": "a.py", "old_text": "x", "new_text": "y"}
        )


# --- list_dir -------------------------------------------------------------------------


def test_list_dir_shows_dirs_files_and_sizes(ws: Path, call: Call) -> None:
    (ws / "src").mkdir()
    (ws / "src/m.py").write_text("abc")
    (ws / "README").write_text("hi")
    assert call("list_dir").output.splitlines() == [".:", "README  (2 bytes)", "src/"]
    assert call("list_dir", path="src").output.splitlines() == ["src:", "m.py  (3 bytes)"]


def test_list_dir_errors(ws: Path, call: Call) -> None:
    (ws / "f").write_text("")
    (ws / "empty").mkdir()
    with pytest.raises(ToolError, match="directory 'nope' does not exist"):
        call("list_dir", path="nope")
    with pytest.raises(ToolError, match="'f' is a file, not a directory"):
        call("list_dir", path="f")
    assert call("list_dir", path="empty").output == "empty is empty"


# --- glob -----------------------------------------------------------------------------


@pytest.fixture
def tree(ws: Path) -> Path:
    for rel in ["a.py", "b.txt", "src/c.py", "src/deep/d.py", "src/deep/e.md", ".git/config"]:
        (ws / rel).parent.mkdir(parents=True, exist_ok=True)
        (ws / rel).write_text(f"content of {rel}\n")
    return ws


def test_glob_star_stays_in_one_directory(tree: Path, call: Call) -> None:
    assert call("glob", pattern="*.py").output == "a.py"
    assert call("glob", pattern="src/*").output.splitlines() == ["src/c.py", "src/deep/"]


def test_glob_double_star_spans_directories_and_skips_git(tree: Path, call: Call) -> None:
    assert call("glob", pattern="**/*.py").output.splitlines() == [
        "a.py",
        "src/c.py",
        "src/deep/d.py",
    ]
    assert "config" not in call("glob", pattern="**/*").output


def test_glob_character_classes_and_literal_paths(tree: Path, call: Call) -> None:
    assert call("glob", pattern="src/deep/[d-e].*").output.splitlines() == [
        "src/deep/d.py",
        "src/deep/e.md",
    ]
    assert call("glob", pattern="src/deep/[!d]*").output == "src/deep/e.md"
    assert call("glob", pattern="src/c.py").output == "src/c.py"


def test_glob_without_matches_says_so(tree: Path, call: Call) -> None:
    assert call("glob", pattern="**/*.rs").output == "no paths match '**/*.rs'"
    assert call("glob", pattern="nowhere/*.py").output == "no paths match 'nowhere/*.py'"


def test_glob_results_are_bounded(ws: Path, call: Call) -> None:
    for i in range(GLOB_MAX_RESULTS + 7):
        (ws / f"f{i:04}.txt").write_text("")
    lines = call("glob", pattern="*.txt").output.splitlines()
    assert len(lines) == GLOB_MAX_RESULTS + 1
    assert lines[-1] == "[7 more matches not shown; narrow the pattern]"


# --- grep -----------------------------------------------------------------------------


def test_grep_finds_lines_with_paths_and_numbers(tree: Path, call: Call) -> None:
    out = call("grep", pattern=r"content of src/.*\.py").output.splitlines()
    assert out == [
        "src/c.py:1: content of src/c.py",
        "src/deep/d.py:1: content of src/deep/d.py",
        "[2 matching lines in 2 files]",
    ]


def test_grep_filters_by_name_glob_and_path_glob(tree: Path, call: Call) -> None:
    by_name = call("grep", pattern="content", glob="*.md").output.splitlines()
    assert by_name[0] == "src/deep/e.md:1: content of src/deep/e.md"
    by_path = call("grep", pattern="content", path="src", glob="deep/*.py").output.splitlines()
    assert by_path[0] == "src/deep/d.py:1: content of src/deep/d.py"
    assert len(by_path) == 2


def test_grep_searches_a_single_file(tree: Path, call: Call) -> None:
    assert call("grep", pattern="content", path="b.txt").output.splitlines()[0] == (
        "b.txt:1: content of b.txt"
    )


def test_grep_skips_binary_files_and_says_so(ws: Path, call: Call) -> None:
    (ws / "blob.bin").write_bytes(b"needle\x00\x01\x02")
    (ws / "t.txt").write_text("needle\n")
    out = call("grep", pattern="needle").output.splitlines()
    assert out == ["t.txt:1: needle", "[1 matching lines in 1 files]", "[1 binary files skipped]"]


def test_grep_bounds_its_matches(ws: Path, call: Call) -> None:
    (ws / "many.txt").write_text("hit\n" * (GREP_MAX_MATCHES + 50))
    out = call("grep", pattern="hit").output.splitlines()
    assert len([line for line in out if line.startswith("many.txt:")]) == GREP_MAX_MATCHES
    assert out[-1] == f"[stopped at {GREP_MAX_MATCHES} matches; narrow the pattern, path or glob]"


def test_grep_errors(tree: Path, call: Call) -> None:
    with pytest.raises(ToolError, match=r"invalid regular expression '\(unclosed'"):
        call("grep", pattern="(unclosed")
    with pytest.raises(ToolError, match="path 'nope' does not exist"):
        call("grep", pattern="x", path="nope")
    assert call("grep", pattern="zzz").output == "no lines match 'zzz' in ."


def test_read_only_tools_change_nothing(tree: Path, call: Call) -> None:
    before = sorted((p.as_posix(), p.stat().st_mtime_ns) for p in tree.rglob("*"))
    call("read_file", path="a.py")
    call("list_dir")
    call("glob", pattern="**/*")
    call("grep", pattern="content")
    assert sorted((p.as_posix(), p.stat().st_mtime_ns) for p in tree.rglob("*")) == before


def test_text_that_is_not_unicode_is_a_tool_error_before_and_during_the_write(
    ws: Path, ctx: ToolContext, call: Call
) -> None:
    args = {"path": "x.txt", "content": "ok \ud800"}  # a lone surrogate survives JSON decoding
    with pytest.raises(ToolError, match="content is not valid Unicode text: surrogates"):
        default_registry().get("write_file").intent(ctx, args)
    with pytest.raises(ToolError, match="content is not valid Unicode text"):
        call("write_file", **args)
    assert not (ws / "x.txt").exists()
