"""Isolated workspaces on real git repositories and real directories.

The user's repository is photographed before and after (HEAD, every ref, the index
file's bytes, ``git ls-files -s``, the stash, every work-tree file with its mode) and
must be byte-for-byte the same; the child's changes come back through ``patch()``
and ``apply_patch_bytes`` into the parent.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from keel.core.errors import UsageError
from keel.core.guard import PathGuard
from keel.runtime.worktrees import COPY, GIT_WORKTREE, create, default_root, remove_stale
from keel.tools.patches import apply_patch_bytes


def git(ws: Path, *args: str, check: bool = True) -> str:
    base = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com"]
    done = subprocess.run([*base, *args], cwd=ws, capture_output=True, text=True, check=False)
    if check:
        assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A repository with a branch, a stash entry, and staged, unstaged and untracked changes."""
    ws = tmp_path / "ws"
    (ws / "src" / "pkg").mkdir(parents=True)
    (ws / "README.md").write_text("readme\n")
    (ws / "src" / "pkg" / "mod.py").write_text("a = 1\nb = 2\n")
    (ws / "staged.txt").write_text("old\n")
    (ws / "gone.txt").write_text("to delete\n")
    (ws / ".gitignore").write_text("*.log\n")
    git(ws.parent, "init", "-q", "-b", "main", str(ws))
    git(ws, "add", "-A")
    git(ws, "commit", "-qm", "first")
    git(ws, "branch", "feature")
    (ws / "README.md").write_text("stashed\n")
    git(ws, "stash", "push", "-q")
    (ws / "src" / "pkg" / "mod.py").write_text("a = 1\nb = 3\n")  # unstaged
    (ws / "staged.txt").write_text("new\n")
    git(ws, "add", "staged.txt")  # staged
    (ws / "gone.txt").unlink()  # deleted, not staged
    (ws / "notes.txt").write_text("untracked\n")
    (ws / "debug.log").write_text("ignored\n")
    (ws / ".keel").mkdir()
    (ws / ".keel" / "keel.db").write_text("store\n")
    return ws


def photograph(ws: Path) -> dict[str, Any]:
    """Everything of the user's repository an isolated workspace must not change."""
    files: dict[str, tuple[bytes, int]] = {}
    for folder, dirs, names in os.walk(ws):
        dirs[:] = [d for d in dirs if not (folder == str(ws) and d == ".git")]
        for name in names:
            path = Path(folder) / name
            files[path.relative_to(ws).as_posix()] = (path.read_bytes(), path.stat().st_mode)
    return {
        "head": git(ws, "rev-parse", "HEAD"),
        "symbolic": git(ws, "symbolic-ref", "HEAD"),
        "refs": git(ws, "for-each-ref"),
        "index": (ws / ".git" / "index").read_bytes(),
        "ls-files": git(ws, "ls-files", "-s"),
        "stash": git(ws, "stash", "list"),
        "files": files,
    }


def test_isolated_workspace_holds_staged_unstaged_and_untracked_changes(
    repo: Path, tmp_path: Path
) -> None:
    child = create(repo, root=tmp_path / "wt", name="c1")
    try:
        assert child.kind == GIT_WORKTREE
        assert child.path == (tmp_path / "wt" / "c1").resolve()
        assert (child.path / "src" / "pkg" / "mod.py").read_text() == "a = 1\nb = 3\n"
        assert (child.path / "staged.txt").read_text() == "new\n"
        assert (child.path / "notes.txt").read_text() == "untracked\n"
        assert not (child.path / "gone.txt").exists()
        assert (child.path / "README.md").read_text() == "readme\n"  # the stash stays stashed
        assert not (child.path / "debug.log").exists()  # ignored files are not brought
        assert not (child.path / ".keel").exists()
        assert git(repo, "rev-parse", f"{child.base}^") == git(repo, "rev-parse", "HEAD")
        assert child.patch() == b""
    finally:
        child.remove()


def test_users_head_branches_index_stash_and_tree_are_unchanged(repo: Path, tmp_path: Path) -> None:
    before = photograph(repo)
    child = create(repo, root=tmp_path / "wt", name="c1")
    (child.path / "staged.txt").write_text("child\n")
    assert child.patch()
    child.remove()
    assert photograph(repo) == before


def test_child_changes_come_back_in_the_patch_and_apply_to_the_parent(
    repo: Path, tmp_path: Path
) -> None:
    child = create(repo, root=tmp_path / "wt", name="c1")
    (child.path / "src" / "pkg" / "mod.py").write_text("a = 1\nb = 3\nc = 4\n")  # edit
    (child.path / "src" / "new").mkdir()
    (child.path / "src" / "new" / "added.py").write_text("added\n")  # add, new directory
    (child.path / "notes.txt").unlink()  # delete (a file untracked in the parent)
    (child.path / "blob.bin").write_bytes(bytes(range(256)) * 4)  # binary
    (child.path / "README.md").chmod(0o755)  # executable bit
    (child.path / "debug2.log").write_text("ignored by .gitignore\n")
    patch = child.patch()
    child.remove()

    assert b"GIT binary patch" in patch
    assert b"new mode 100755" in patch
    assert b"debug2.log" not in patch
    summary = apply_patch_bytes(repo, patch, PathGuard())

    assert (repo / "src" / "pkg" / "mod.py").read_text() == "a = 1\nb = 3\nc = 4\n"
    assert (repo / "src" / "new" / "added.py").read_text() == "added\n"
    assert not (repo / "notes.txt").exists()
    assert (repo / "blob.bin").read_bytes() == bytes(range(256)) * 4
    assert os.access(repo / "README.md", os.X_OK)
    assert summary.changed["notes.txt"] == ""
    assert set(summary.changed) == {
        "src/pkg/mod.py",
        "src/new/added.py",
        "notes.txt",
        "blob.bin",
        "README.md",
    }
    assert git(repo, "diff", "--cached", "--name-only") == "staged.txt\n"  # index untouched


def test_keel_directory_made_in_the_child_stays_out_of_the_patch(
    repo: Path, tmp_path: Path
) -> None:
    child = create(repo, root=tmp_path / "wt", name="c1")
    (child.path / ".keel").mkdir()
    (child.path / ".keel" / "keel.db").write_text("child store\n")
    try:
        assert child.patch() == b""
    finally:
        child.remove()


def test_remove_leaves_no_worktree_and_no_directory_and_is_idempotent(
    repo: Path, tmp_path: Path
) -> None:
    child = create(repo, root=tmp_path / "wt", name="c1")
    (child.path / "scratch.txt").write_text("uncommitted work of the child\n")
    assert str(child.path) in git(repo, "worktree", "list", "--porcelain")
    child.remove()
    child.remove()
    assert str(child.path) not in git(repo, "worktree", "list", "--porcelain")
    assert not child.path.exists()
    assert not (repo / ".git" / "worktrees" / "c1").exists()


def test_remove_stale_removes_what_a_crash_left_and_keeps_the_named(
    repo: Path, tmp_path: Path
) -> None:
    root = tmp_path / "wt"
    kept = create(repo, root=root, name="live")
    left = create(repo, root=root, name="crashed")
    shutil.rmtree(kept.path.parent / "crashed" / "src")  # a half-deleted leftover
    (root / "orphan.git").mkdir()  # a copy's private git dir whose copy is gone

    assert remove_stale(repo, root, keep={"live"}) == ["crashed", "orphan"]
    listed = git(repo, "worktree", "list", "--porcelain")
    assert str(left.path) not in listed and not left.path.exists()
    assert str(kept.path) in listed and (kept.path / "README.md").exists()
    assert remove_stale(repo, root, keep={"live"}) == []
    kept.remove()


def test_repository_without_commits_is_isolated_from_its_files(tmp_path: Path) -> None:
    ws = tmp_path / "fresh"
    git(tmp_path, "init", "-q", str(ws))
    (ws / "first.txt").write_text("first\n")
    child = create(ws, root=tmp_path / "wt", name="c1")
    try:
        assert (child.path / "first.txt").read_text() == "first\n"
        (child.path / "first.txt").write_text("second\n")
        apply_patch_bytes(ws, child.patch(), PathGuard())
        assert (ws / "first.txt").read_text() == "second\n"
    finally:
        child.remove()


def test_copy_mode_round_trip_for_a_directory_that_is_not_a_repository(tmp_path: Path) -> None:
    ws = tmp_path / "plain"
    (ws / "docs").mkdir(parents=True)
    (ws / "docs" / "a.md").write_text("alpha\n")
    (ws / "tool.sh").write_text("#!/bin/sh\n")
    (ws / "link").symlink_to("docs/a.md")
    (ws / ".keel").mkdir()
    (ws / ".keel" / "keel.db").write_text("store\n")
    before = {p: p.read_bytes() for p in ws.rglob("*") if p.is_file() and not p.is_symlink()}

    child = create(ws, root=tmp_path / "wt", name="c1")
    assert child.kind == COPY
    assert (child.path / "link").is_symlink()
    assert os.readlink(child.path / "link") == "docs/a.md"
    assert not (child.path / ".keel").exists()
    assert not (child.path / ".git").exists()  # its git directory is outside the copy
    assert child.patch() == b""
    assert {p: p.read_bytes() for p in ws.rglob("*") if p.is_file() and not p.is_symlink()} == (
        before
    )

    (child.path / "docs" / "a.md").write_text("alpha\nbeta\n")
    (child.path / "docs" / "b.bin").write_bytes(b"\0\1\2\3")
    (child.path / "tool.sh").chmod(0o755)
    (child.path / "link").unlink()
    patch = child.patch()
    child.remove()
    child.remove()
    assert not child.path.exists() and not (tmp_path / "wt" / "c1.git").exists()

    apply_patch_bytes(ws, patch, PathGuard())
    assert (ws / "docs" / "a.md").read_text() == "alpha\nbeta\n"
    assert (ws / "docs" / "b.bin").read_bytes() == b"\0\1\2\3"
    assert os.access(ws / "tool.sh", os.X_OK)
    assert not (ws / "link").is_symlink()
    assert (ws / ".keel" / "keel.db").read_text() == "store\n"


def plant_hostile_config(ws: Path, marker: Path) -> None:
    """fsmonitor, a hooks directory and a filter driver, each a program leaving ``marker``."""
    program = ws.parent / "evil.sh"
    program.write_text(f'#!/bin/sh\necho "$0 $@" >> {marker}\ncat\n')
    program.chmod(0o755)
    hooks = ws.parent / "evil-hooks"
    hooks.mkdir()
    for hook in ("post-checkout", "pre-commit", "post-index-change", "reference-transaction"):
        (hooks / hook).write_text(f"#!/bin/sh\necho hook-{hook} >> {marker}\n")
        (hooks / hook).chmod(0o755)
    (ws / ".gitattributes").write_text("*.txt filter=evil\n")
    git(ws, "config", "core.fsmonitor", str(program))
    git(ws, "config", "core.hooksPath", str(hooks))
    for command in ("clean", "smudge"):
        git(ws, "config", f"filter.evil.{command}", str(program))
    git(ws, "config", "filter.evil.required", "true")


def test_hostile_repository_configuration_never_runs(repo: Path, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    plant_hostile_config(repo, marker)
    proof = tmp_path / "proof"  # the same plant under plain git runs its programs
    shutil.copytree(repo, proof, symlinks=True)
    git(proof, "worktree", "add", "-q", "--detach", str(tmp_path / "proof-wt"))
    assert marker.exists()
    marker.unlink()

    child = create(repo, root=tmp_path / "wt", name="c1")
    (child.path / "notes.txt").write_text("changed by the child\n")
    (child.path / "more.txt").write_text("new\n")
    patch = child.patch()
    child.remove()
    apply_patch_bytes(repo, patch, PathGuard())
    assert (repo / "more.txt").read_text() == "new\n"
    remove_stale(repo, tmp_path / "wt", keep=set())
    assert not marker.exists()


def test_bad_names_and_roots_are_refused(repo: Path, tmp_path: Path) -> None:
    for name in ("", "../up", "a/b", ".hidden", "-x", "c.git", "x" * 101):
        with pytest.raises(UsageError, match="name"):
            create(repo, root=tmp_path / "wt", name=name)
    with pytest.raises(UsageError, match="outside the workspace"):
        create(repo, root=repo / "inside", name="c1")
    with pytest.raises(UsageError, match="not a directory"):
        create(tmp_path / "missing", root=tmp_path / "wt", name="c1")
    child = create(repo, root=tmp_path / "wt", name="c1")
    with pytest.raises(UsageError, match="already exists"):
        create(repo, root=tmp_path / "wt", name="c1")
    child.remove()


def test_default_root_is_outside_the_workspace_and_per_parent(
    repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    first, second = default_root(repo), default_root(tmp_path / "other")
    assert first.is_relative_to(tmp_path / "cache") and first != second
    assert not first.is_relative_to(repo)


def test_child_rewriting_its_git_file_cannot_redirect_patch_or_remove(
    repo: Path, tmp_path: Path
) -> None:
    decoy = tmp_path / "decoy"
    git(tmp_path, "init", "-q", str(decoy))
    child = create(repo, root=tmp_path / "wt", name="c1")
    (child.path / ".git").write_text(f"gitdir: {decoy / '.git'}\n")
    (child.path / "notes.txt").write_text("child\n")
    patch = child.patch()
    assert b"+child" in patch and b".git" not in patch.replace(b".gitignore", b"")
    child.remove()
    assert not child.path.exists()
    assert str(child.path) not in git(repo, "worktree", "list", "--porcelain")
    assert not (repo / ".git" / "worktrees" / "c1").exists()
