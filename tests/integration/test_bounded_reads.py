"""Reads are bounded: a 300 MB file is read in pieces in bounded memory, and every cut says so.

``read_file`` used to load the whole file (830 MB of memory for a 300 MB file) and
``edit_file`` more (1.1 GB). Now read_file streams to the lines asked for, edit_file
refuses files over ``FILE_WINDOW_BYTES`` before reading them, and grep names the
files it did not search. The memory test runs in a subprocess and reads its own
peak resident size (``resource.getrusage``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from keel.core.errors import ToolError, ToolTimedOut
from keel.tools import ToolContext
from keel.tools.builtin import default_registry
from keel.tools.files import FILE_WINDOW_BYTES, READ_MAX_LINE_CHARS

SIZE = 300_000_000
HEAD_LINES = 1000
TAIL_LINES = 100


def make_big_file(path: Path) -> None:
    """A 300 MB text file made in a moment: sparse, with text at its start, a line every
    64 KiB in between (lines of zero bytes between them) and text at its end."""
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
    try:
        head = b"".join(b"head line %d\n" % i for i in range(HEAD_LINES))
        os.write(fd, head)
        for at in range(len(head) + 65536, SIZE - (1 << 20), 65536):
            os.pwrite(fd, b"\nmarker at %d\n" % at, at)
        tail = b"".join(b"tail line %d\n" % i for i in range(TAIL_LINES))
        os.pwrite(fd, tail, SIZE - len(tail))
    finally:
        os.close(fd)


MEASURE = textwrap.dedent(
    """
    import json, resource, sys
    from pathlib import Path
    from keel.core.errors import ToolError
    from keel.tools import ToolContext
    from keel.tools.builtin import default_registry

    registry = default_registry()
    ctx = ToolContext(workspace=Path(sys.argv[1]), run_id="r", call_id="c", owner="o")

    def run(name, **arguments):
        try:
            return registry.execute(name, arguments, ctx).output
        except ToolError as exc:
            return "error: " + str(exc)

    run("read_file", path="small.txt")  # everything imported and warmed up
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out = {
        "first": run("read_file", path="big.log", limit=3),
        "past_end": run("read_file", path="big.log", offset=10**9),
        "edit": run("edit_file", path="big.log", old_text="tail line 99", new_text="x"),
        "grep": run("grep", pattern="tail line 99"),
    }
    lines = int(out["past_end"].rsplit("has ", 1)[1].split()[0])
    out["lines"] = lines
    out["last"] = run("read_file", path="big.log", offset=lines - 2)
    out["grown_kib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    print(json.dumps(out))
    """
)


def test_a_300_mb_file_is_read_in_bounded_memory(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    make_big_file(ws / "big.log")
    (ws / "small.txt").write_text("warm up\n")
    result = subprocess.run(
        [sys.executable, "-c", MEASURE, str(ws)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    # Peak memory grew by a few MiB (one 1 MiB chunk and the shown lines), not 300 MB.
    assert out["grown_kib"] < 64 * 1024, out["grown_kib"]
    assert out["first"].splitlines()[:3] == [
        "     1\thead line 0",
        "     2\thead line 1",
        "     3\thead line 2",
    ]
    assert (
        out["first"]
        .splitlines()[3]
        .startswith(
            f"[showing lines 1-3; the file has {SIZE} bytes and more lines follow (lines were "
            "counted up to byte "
        )
    )
    assert out["first"].endswith("read on with offset=4]")
    assert out["past_end"].startswith(f"error: offset {10**9} is past the end of big.log")
    assert out["last"].splitlines() == [
        f"{out['lines'] - 2:>6}\ttail line 97",
        f"{out['lines'] - 1:>6}\ttail line 98",
        f"{out['lines']:>6}\ttail line 99",
    ]
    assert out["edit"] == (
        f"error: 'big.log' is {SIZE} bytes; edit_file handles files of at most "
        f"{FILE_WINDOW_BYTES} bytes (20 MiB). Nothing was read or changed; for a larger file "
        "use run_command (sed, a script), or read_file with offset and limit to read it in "
        "pieces"
    )
    assert out["grep"].endswith(
        "[1 files over 5242880 bytes not searched: big.log; read_file reads them in pieces]"
    )


def call(ws: Path, name: str, deadline_s: float | None = None, **arguments: object) -> str:
    deadline = None if deadline_s is None else time.monotonic() + deadline_s
    ctx = ToolContext(workspace=ws, run_id="r", call_id="c", owner="o", deadline=deadline)
    return default_registry().execute(name, arguments, ctx).output


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    where = tmp_path / "ws"
    where.mkdir()
    return where


def test_read_file_counts_lines_to_the_end_when_the_end_is_near(ws: Path) -> None:
    (ws / "f.txt").write_text("".join(f"line {i}\n" for i in range(1, 11)))
    assert call(ws, "read_file", path="f.txt", offset=4, limit=2) == (
        "     4\tline 4\n     5\tline 5\n[showing lines 4-5 of 10; read on with offset=6]"
    )
    assert call(ws, "read_file", path="f.txt", offset=9).splitlines() == [
        "     9\tline 9",
        "    10\tline 10",
    ]
    with pytest.raises(ToolError, match=r"offset 11 is past the end of f\.txt, which has 10"):
        call(ws, "read_file", path="f.txt", offset=11)


def test_a_last_line_without_a_newline_is_a_line(ws: Path) -> None:
    (ws / "f.txt").write_bytes(b"one\ntwo")
    assert call(ws, "read_file", path="f.txt") == "     1\tone\n     2\ttwo"
    (ws / "empty.txt").write_bytes(b"")
    assert call(ws, "read_file", path="empty.txt") == "empty.txt is empty"


def test_a_line_longer_than_what_is_read_of_it_says_how_many_bytes_were_left_out(
    ws: Path,
) -> None:
    (ws / "min.js").write_bytes(b"x" * 5_000_000 + b"\nnext\n")
    out = call(ws, "read_file", path="min.js").splitlines()
    kept = 5_000_000 - READ_MAX_LINE_CHARS
    assert out[0] == f"     1\t{'x' * READ_MAX_LINE_CHARS}… [line truncated: {kept} bytes omitted]"
    assert out[1] == "     2\tnext"


def test_read_file_stops_at_its_deadline_saying_how_far_it_read(ws: Path) -> None:
    (ws / "f.txt").write_text("line\n" * 1000)
    with pytest.raises(ToolTimedOut, match=r"read_file ran out of time.*read 0 of the 5000 bytes"):
        call(ws, "read_file", deadline_s=0.0, path="f.txt", offset=500)


def test_edit_file_refuses_a_file_over_the_bound_and_leaves_it_alone(ws: Path) -> None:
    big = ws / "big.txt"
    with open(big, "wb") as handle:
        handle.truncate(FILE_WINDOW_BYTES + 1)
    with pytest.raises(ToolError, match=rf"is {FILE_WINDOW_BYTES + 1} bytes; edit_file handles"):
        call(ws, "edit_file", path="big.txt", old_text="a", new_text="b")
    assert big.stat().st_size == FILE_WINDOW_BYTES + 1


def test_grep_names_the_large_files_it_skipped(ws: Path) -> None:
    for index in range(7):
        with open(ws / f"big{index}.log", "wb") as handle:
            handle.truncate(6 * 1024 * 1024)
    (ws / "small.txt").write_text("needle\n")
    out = call(ws, "grep", pattern="needle").splitlines()
    assert out[0] == "small.txt:1: needle"
    assert out[-1] == (
        "[7 files over 5242880 bytes not searched: big0.log, big1.log, big2.log, big3.log, "
        "big4.log and 2 more; read_file reads them in pieces]"
    )


def test_an_edit_keeps_the_bytes_of_a_file_that_is_not_utf8(ws: Path) -> None:
    (ws / "latin1.txt").write_bytes(b"caf\xe9 au lait\nprice: 3\n")
    call(ws, "edit_file", path="latin1.txt", old_text="price: 3", new_text="price: 4")
    assert (ws / "latin1.txt").read_bytes() == b"caf\xe9 au lait\nprice: 4\n"
