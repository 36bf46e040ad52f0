"""stale_paths on real patches: which touched files the parent changed since the child began.

Patches come from real isolated workspaces (a git worktree, or a copy of a directory
that is not a repository); the parent is then changed on disk and the answer must name
exactly the touched files that differ from the patch's pre-images.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from keel.core.guard import PathGuard
from keel.runtime.worktrees import create
from keel.tools.patches import apply_patch_bytes, patch_paths, stale_paths

ODD = "dir with space/é名.txt"  # git quotes this name in a patch (core.quotePath)


def git(ws: Path, *args: str) -> str:
    base = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com"]
    done = subprocess.run([*base, *args], cwd=ws, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def populate(ws: Path) -> None:
    for rel in ("edit.txt", "gone.txt", "same.txt", ODD):
        (ws / rel).parent.mkdir(parents=True, exist_ok=True)
        (ws / rel).write_text(f"{rel}\n" * 3)
    (ws / "blob.bin").write_bytes(bytes(range(256)))
    (ws / "link").symlink_to("edit.txt")
    (ws / "tool.sh").write_text("#!/bin/sh\n")


@pytest.fixture(params=["git", "plain"])
def parent(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    populate(ws)
    if request.param == "git":
        git(tmp_path, "init", "-q", str(ws))
        git(ws, "add", "-A")
        git(ws, "commit", "-qm", "first")
        (ws / "edit.txt").write_text("uncommitted parent state\n")  # the child starts here
    return ws


@pytest.fixture
def patch(parent: Path, tmp_path: Path) -> bytes:
    """A child that edits, deletes, creates, rewrites binary, relinks, chmods and edits ODD."""
    child = create(parent, root=tmp_path / "children", name="c1")
    try:
        (child.path / "edit.txt").write_text("child edit\n")
        (child.path / "gone.txt").unlink()
        (child.path / "made.txt").write_text("made by the child\n")
        (child.path / "blob.bin").write_bytes(bytes(range(255, -1, -1)))
        (child.path / "link").unlink()
        (child.path / "link").symlink_to("same.txt")
        (child.path / "tool.sh").chmod(0o755)
        (child.path / ODD).write_text("child\n")
        return child.patch()
    finally:
        child.remove()


TOUCHED = {"edit.txt", "gone.txt", "made.txt", "blob.bin", "link", "tool.sh", ODD}


def test_an_untouched_parent_has_nothing_stale_and_the_patch_applies(
    parent: Path, patch: bytes
) -> None:
    assert set(patch_paths(patch)) == TOUCHED
    assert b'"a/dir with space/' in patch  # the odd name is quoted in the patch
    assert stale_paths(parent, patch) == []
    apply_patch_bytes(parent, patch, PathGuard())
    assert (parent / "edit.txt").read_text() == "child edit\n"


def test_each_kind_of_parent_change_makes_exactly_that_path_stale(
    parent: Path, patch: bytes
) -> None:
    (parent / "edit.txt").write_text("the parent edited it too\n")  # modified both sides
    (parent / "gone.txt").write_text("parent edit of a file the child deletes\n")
    (parent / "made.txt").write_text("the parent made it too\n")  # created both sides
    (parent / "blob.bin").write_bytes(b"\0parent")
    (parent / "same.txt").write_text("not touched by the patch\n")
    (parent / ODD).write_text("parent\n")
    assert stale_paths(parent, patch) == ["blob.bin", ODD, "edit.txt", "gone.txt", "made.txt"]


def test_a_file_gone_from_the_parent_is_stale_and_so_is_a_relinked_link(
    parent: Path, patch: bytes
) -> None:
    (parent / "edit.txt").unlink()
    (parent / "tool.sh").unlink()  # the patch changes only its mode
    (parent / "link").unlink()
    (parent / "link").symlink_to("gone.txt")
    assert stale_paths(parent, patch) == ["edit.txt", "link", "tool.sh"]


def test_restoring_the_content_makes_it_fresh_again(parent: Path, patch: bytes) -> None:
    original = (parent / "edit.txt").read_bytes()
    (parent / "edit.txt").write_text("changed\n")
    assert stale_paths(parent, patch) == ["edit.txt"]
    (parent / "edit.txt").write_bytes(original)
    assert stale_paths(parent, patch) == []


def test_abbreviated_ids_and_hand_written_patches(tmp_path: Path) -> None:
    ws = tmp_path / "plain"
    ws.mkdir()
    (ws / "a.txt").write_text("hello\n")
    blob = "ce013625030ba8dba906f756967f9e9ca394464a"  # git hash-object of "hello\n"
    short = (
        f"diff --git a/a.txt b/a.txt\nindex {blob[:7]}..0000001 100644\n--- a/a.txt\n"
        "+++ b/a.txt\n@@ -1 +1 @@\n-hello\n+bye\n"
    ).encode()
    assert stale_paths(ws, short) == []
    (ws / "a.txt").write_text("hello!\n")
    assert stale_paths(ws, short) == ["a.txt"]
    climbing = b"diff --git a/../x b/../x\nnew file mode 100644\n--- /dev/null\n+++ b/../x\n"
    assert stale_paths(ws, climbing) == ["../x"]
