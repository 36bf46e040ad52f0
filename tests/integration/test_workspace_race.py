"""The symlink-swap race: file tools never reach outside while a directory is swapped.

A real Python subprocess swaps the workspace directory ``d`` for a symbolic link to
a directory outside the workspace and back, by renames, as fast as it can, while
this test makes thousands of calls through the real tools on paths below ``d``.
Checking a path by name and then opening it by name would let some of them land
outside (measured with the old tools: 2 of 300 writes and 2 of 300 reads); the
tools resolve from a descriptor of the workspace with ``O_NOFOLLOW``, so every call
either happens inside or fails with a ToolError.

3,000 calls keep this to a few seconds in ``make test``; a longer soak (say 100,000
calls) belongs in ``bench/``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from keel.core.errors import ToolError
from keel.tools import ToolContext, default_registry
from keel.tools.workspace import current_hash, sha256_bytes

CALLS = 3000
PLANTED = "OUTSIDE-PLANTED-7f3a"  # only ever in the outside directory

SWAPPER = r"""
import ctypes, os, sys
ws, outside = sys.argv[1], sys.argv[2]
os.chdir(ws)
os.symlink(outside, "d.link")
libc = ctypes.CDLL(None, use_errno=True)
exchange = getattr(libc, "renameat2", None)  # atomic: d is always a directory or a link

def swap():
    if exchange is not None and exchange(-100, b"d", -100, b"d.link", 2) == 0:
        return  # AT_FDCWD = -100, RENAME_EXCHANGE = 2
    try:  # no renameat2: three renames, d briefly missing (a tool may then create it)
        os.rename("d", "d.tmp"); os.rename("d.link", "d"); os.rename("d.tmp", "d.link")
    except OSError:
        pass

print("ready", flush=True)
swaps = 0
while not os.path.exists("stop"):
    swap()
    swaps += 1
if os.path.islink("d"):
    swap()
print(swaps, flush=True)
"""


def snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Every entry below ``folder`` -> (content, mtime_ns): nothing may change or appear."""
    found: dict[str, tuple[bytes, int]] = {}
    for path in sorted(folder.rglob("*")):
        st = path.lstat()
        content = path.read_bytes() if path.is_file() and not path.is_symlink() else b""
        found[path.relative_to(folder).as_posix()] = (content, st.st_mtime_ns)
    found["."] = (b"", folder.stat().st_mtime_ns)
    return found


@pytest.mark.timeout(120)
def test_no_call_reaches_outside_while_a_directory_is_swapped_for_a_link(
    tmp_path: Path,
) -> None:
    ws = (tmp_path / "ws").resolve()
    outside = (tmp_path / "outside").resolve()
    (ws / "d" / "sub").mkdir(parents=True)
    outside.mkdir()
    (outside / "sub").mkdir()
    # the outside directory mirrors d's names, so any escape would find something
    for root in (ws / "d", outside):
        is_outside = root == outside
        (root / "file.txt").write_text(
            f"{PLANTED}\nmarker=A\n" if is_outside else "inside\nmarker=A\n"
        )
        (root / "sub" / "deep.txt").write_text(PLANTED if is_outside else "deep inside\n")
        (root / "w.txt").write_text(PLANTED if is_outside else "w\n")
    (outside / "planted-outside-only.txt").write_text(PLANTED)
    before = snapshot(outside)

    ctx = ToolContext(workspace=ws, run_id="run_race", call_id="c", owner="me")
    registry = default_registry()
    swapper = subprocess.Popen(
        [sys.executable, "-c", SWAPPER, str(ws), str(outside)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert swapper.stdout is not None
    assert swapper.stdout.readline().strip() == "ready"

    calls: list[tuple[str, dict[str, Any]]] = [
        ("read_file", {"path": "d/file.txt"}),
        ("write_file", {"path": "d/w.txt", "content": "written inside\n"}),
        ("edit_file", {"path": "d/file.txt", "old_text": "marker=A", "new_text": "marker=B"}),
        ("read_file", {"path": "d/sub/deep.txt"}),
        ("list_dir", {"path": "d"}),
        ("grep", {"pattern": "PLANTED|inside", "path": "d"}),
        ("write_file", {"path": "d/sub/new.txt", "content": "new inside\n"}),
        ("edit_file", {"path": "d/file.txt", "old_text": "marker=B", "new_text": "marker=A"}),
        ("grep", {"pattern": "PLANTED"}),
        ("glob", {"pattern": "d/**/*"}),
        ("current_hash", {"path": "d/file.txt"}),  # what effect_happened asks on resume
    ]
    planted_hashes = {sha256_bytes(p.read_bytes()) for p in outside.rglob("*") if p.is_file()}
    outcomes: Counter[str] = Counter()
    started = time.monotonic()
    try:
        for i in range(CALLS):
            name, args = calls[i % len(calls)]
            try:
                if name == "current_hash":
                    assert current_hash(ws, args["path"]) not in planted_hashes
                    outcomes["ok"] += 1
                    continue
                result = registry.get(name).run(ctx, args)  # not execute(): no exception wrapped
            except ToolError as exc:  # any other exception fails the test
                assert PLANTED not in str(exc)
                outcomes["refused" if "outside the workspace" in str(exc) else "tool_error"] += 1
                continue
            assert PLANTED not in result.output, (name, args, result.output)
            assert "planted-outside-only" not in result.output, (name, result.output)
            outcomes["ok"] += 1
    finally:
        (ws / "stop").write_text("")
        out, _ = swapper.communicate(timeout=30)
    elapsed = time.monotonic() - started

    swaps = int(out.split()[-1])
    assert swapper.returncode == 0
    assert snapshot(outside) == before  # nothing read back, nothing written or created outside
    assert sum(outcomes.values()) == CALLS
    # the race really ran: calls met the link and were refused, others got through inside
    assert swaps > 100, swaps
    assert outcomes["ok"] > 0 and outcomes["refused"] > 0, outcomes
    assert (ws / "d" / "w.txt").read_text() == "written inside\n"
    print(f"{CALLS} calls in {elapsed:.2f}s against {swaps} swaps: {dict(outcomes)}")


def test_the_swapper_really_redirects_a_plain_open(tmp_path: Path) -> None:
    """Control: while the swapper runs, opening ``d/file.txt`` by name does reach outside."""
    ws = (tmp_path / "ws").resolve()
    outside = (tmp_path / "outside").resolve()
    (ws / "d").mkdir(parents=True)
    outside.mkdir()
    (ws / "d" / "file.txt").write_text("inside")
    (outside / "file.txt").write_text(PLANTED)
    swapper = subprocess.Popen(
        [sys.executable, "-c", SWAPPER, str(ws), str(outside)], stdout=subprocess.PIPE, text=True
    )
    assert swapper.stdout is not None
    assert swapper.stdout.readline().strip() == "ready"
    seen: set[str] = set()
    try:
        deadline = time.monotonic() + 20
        while seen != {PLANTED, "inside"} and time.monotonic() < deadline:
            try:
                seen.add((ws / "d" / "file.txt").read_text())
            except OSError:
                continue
    finally:
        (ws / "stop").write_text("")
        swapper.communicate(timeout=30)
    assert seen == {PLANTED, "inside"}  # by name, the same path reads both sides
    assert os.path.isdir(ws / "d") and not os.path.islink(ws / "d")
