"""apply_patch on real workspaces: all or nothing, conflicts shown, unsafe paths refused.

Patches are made by real git from a child's isolated workspace, or written by hand
where a hostile patch is the point; the workspace is photographed before a refused
or conflicting patch and must be unchanged after it.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from keel.core.errors import ToolError
from keel.core.guard import PathGuard
from keel.runtime.worktrees import create
from keel.store.base import Store
from keel.store.url import open_store
from keel.testing.stores import make_run
from keel.tools.base import ToolContext
from keel.tools.patches import apply_patch, apply_patch_bytes, patch_paths, patched_hashes


def git(ws: Path, *args: str) -> str:
    base = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com"]
    done = subprocess.run([*base, *args], cwd=ws, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    (ws / "src").mkdir(parents=True)
    (ws / "src" / "app.py").write_text("".join(f"line {n}\n" for n in range(1, 21)))
    (ws / "other.txt").write_text("other\n")
    git(tmp_path, "init", "-q", str(ws))
    git(ws, "add", "-A")
    git(ws, "commit", "-qm", "first")
    return ws


def child_patch(parent: Path, tmp_path: Path, change: dict[str, str | None]) -> bytes:
    """The patch of a child that wrote (or, for None, deleted) the given files."""
    child = create(parent, root=tmp_path / "children", name=f"c{len(os.listdir(tmp_path))}")
    try:
        for rel, text in change.items():
            if text is None:
                (child.path / rel).unlink()
            else:
                (child.path / rel).parent.mkdir(parents=True, exist_ok=True)
                (child.path / rel).write_text(text)
        return child.patch()
    finally:
        child.remove()


def files_of(ws: Path) -> dict[str, bytes]:
    found: dict[str, bytes] = {}
    for folder, dirs, names in os.walk(ws):
        dirs[:] = [d for d in dirs if d != ".git"]
        for name in names:
            path = Path(folder) / name
            found[path.relative_to(ws).as_posix()] = path.read_bytes()
    return found


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with open_store(f"sqlite:///{tmp_path / 'keel.db'}") as opened:
        yield opened


def context(ws: Path, store: Store | None) -> ToolContext:
    return ToolContext(
        workspace=ws.resolve(), run_id="run_x", call_id="call_1", owner="t", store=store
    )


def test_tool_applies_an_artifact_and_its_intent_tells_whether_it_happened(
    repo: Path, tmp_path: Path, store: Store
) -> None:
    text = (repo / "src" / "app.py").read_text().replace("line 5\n", "line five\n")
    patch = child_patch(repo, tmp_path, {"src/app.py": text, "new/file.txt": "new\n"})
    run = make_run(store, workspace=str(repo))
    artifact = store.put_artifact(run.run_id, "patch", patch)
    ctx = context(repo, store)

    intent = apply_patch.intent(ctx, {"artifact": artifact.id})
    assert set(intent) == {"src/app.py", "new/file.txt"}
    assert not apply_patch.effect_happened(ctx, intent)
    result = apply_patch.run(ctx, {"artifact": artifact.id})

    assert (repo / "src" / "app.py").read_text() == text
    assert (repo / "new" / "file.txt").read_text() == "new\n"
    assert result.changed_files == intent
    assert "2 file(s) changed" in result.output
    assert apply_patch.effect_happened(ctx, intent)


def test_conflicting_parent_edit_fails_with_the_hunk_shown_and_no_file_changed(
    repo: Path, tmp_path: Path
) -> None:
    text = (repo / "src" / "app.py").read_text()
    ours = text.replace("line 10\n", "line ten (child)\n").replace("line 2\n", "line two\n")
    patch = child_patch(repo, tmp_path, {"src/app.py": ours, "other.txt": "child\n"})
    (repo / "src" / "app.py").write_text(text.replace("line 10\n", "line ten (parent)\n"))
    before = files_of(repo)

    with pytest.raises(ToolError) as caught:
        apply_patch_bytes(repo, patch, PathGuard())

    message = str(caught.value)
    assert "no file was changed" in message
    assert "src/app.py: 1 of 1 hunk(s) do not apply" in message or "src/app.py: 1 of" in message
    assert "+line ten (child)" in message
    assert "other.txt:" not in message  # that file's hunk applies
    assert files_of(repo) == before
    with pytest.raises(ToolError, match="line ten"):
        patched_hashes(repo, patch, PathGuard())


def test_separate_hunks_name_only_the_one_that_conflicts(repo: Path, tmp_path: Path) -> None:
    text = (repo / "src" / "app.py").read_text()
    ours = text.replace("line 2\n", "line two\n").replace("line 18\n", "line eighteen\n")
    patch = child_patch(repo, tmp_path, {"src/app.py": ours})
    (repo / "src" / "app.py").write_text(text.replace("line 18\n", "line 18 (parent)\n"))
    with pytest.raises(ToolError) as caught:
        apply_patch_bytes(repo, patch, PathGuard())
    message = str(caught.value)
    assert "src/app.py: 1 of 2 hunk(s) do not apply" in message
    assert "+line eighteen" in message and "+line two" not in message


HOSTILE = {
    ".git/config": "refusing the patch: '.git/config' is inside git's own directory",
    ".git/hooks/pre-commit": "inside git's own directory",
    ".keel/keel.db": "protected",
    "sub/.keel/x": "protected",
    "../outside.txt": "leads outside the workspace",
    "src/../../outside.txt": "leads outside the workspace",
}


def hand_patch(path: str) -> bytes:
    return (
        f"diff --git a/{path} b/{path}\nnew file mode 100644\n--- /dev/null\n+++ b/{path}\n"
        "@@ -0,0 +1 @@\n+planted\n"
    ).encode()


@pytest.mark.parametrize("path", sorted(HOSTILE))
def test_patch_touching_protected_or_outside_paths_is_refused_with_nothing_changed(
    repo: Path, path: str
) -> None:
    before = files_of(repo)
    config = (repo / ".git" / "config").read_bytes()
    patch = hand_patch("ok.txt") + hand_patch(path)  # a harmless file first: still nothing
    with pytest.raises(ToolError, match=HOSTILE[path].replace("(", r"\(").replace(".", r"\.")):
        apply_patch_bytes(repo, patch, PathGuard())
    assert files_of(repo) == before
    assert (repo / ".git" / "config").read_bytes() == config
    assert not (repo.parent / "outside.txt").exists()


def test_absolute_paths_are_refused(repo: Path, tmp_path: Path) -> None:
    target = tmp_path / "abs.txt"
    patch = (
        f"diff --git {target} {target}\nnew file mode 100644\n--- /dev/null\n+++ {target}\n"
        "@@ -0,0 +1 @@\n+planted\n"
    ).encode()
    before = files_of(repo)
    with pytest.raises(ToolError, match="absolute path"):
        apply_patch_bytes(repo, patch, PathGuard())
    assert not target.exists()
    assert files_of(repo) == before


def test_patch_through_a_symbolic_link_is_refused(repo: Path, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (repo / "out").symlink_to(outside)
    (repo / "in").symlink_to("src")
    for path in ("out/planted.txt", "in/planted.txt"):
        with pytest.raises(ToolError, match="symbolic link"):
            apply_patch_bytes(repo, hand_patch(path), PathGuard())
    assert list(outside.iterdir()) == []
    assert not (repo / "src" / "planted.txt").exists()


def test_store_paths_of_the_guard_are_refused(repo: Path) -> None:
    guard = PathGuard(store_paths=("data/keel.db",))
    with pytest.raises(ToolError, match="part of Keel's store"):
        apply_patch_bytes(repo, hand_patch("data/keel.db"), guard)
    assert not (repo / "data").exists()


def test_not_a_patch_and_empty_patch_are_precise_errors(repo: Path) -> None:
    with pytest.raises(ToolError, match="empty"):
        patch_paths(b"  \n")
    with pytest.raises(ToolError, match=r"not a patch git can read: .*No valid patches"):
        patch_paths(b"just some text\nnot a diff\n")
    with pytest.raises(ToolError, match=r"not a patch git can read: .*corrupt patch at line 6"):
        patch_paths(b"diff --git a/x b/x\n--- a/x\n+++ b/x\n@@ -1 +1 @@\n garbage\n")


def test_unknown_artifact_and_missing_store_are_tool_errors(repo: Path, store: Store) -> None:
    with pytest.raises(ToolError, match="no artifact 'art_missing'"):
        apply_patch.run(context(repo, store), {"artifact": "art_missing"})
    with pytest.raises(ToolError, match="needs the run's store"):
        apply_patch.run(context(repo, None), {"artifact": "art_missing"})


def test_patch_applies_to_a_directory_that_is_not_a_repository(tmp_path: Path) -> None:
    ws = tmp_path / "plain"
    ws.mkdir()
    (ws / "a.txt").write_text("a\n")
    patch = child_patch(ws, tmp_path, {"a.txt": "a\nb\n", "c.txt": "c\n"})
    summary = apply_patch_bytes(ws, patch, PathGuard())
    assert (ws / "a.txt").read_text() == "a\nb\n" and (ws / "c.txt").read_text() == "c\n"
    assert set(summary.changed) == {"a.txt", "c.txt"}
    with pytest.raises(ToolError, match="already exists"):
        apply_patch_bytes(ws, patch, PathGuard())  # applied once: a second time conflicts


def test_filter_driver_of_the_workspace_never_runs_while_applying(
    repo: Path, tmp_path: Path
) -> None:
    patch = child_patch(repo, tmp_path, {"other.txt": "child\n"})
    marker = tmp_path / "ran"
    program = tmp_path / "evil.sh"
    program.write_text(f"#!/bin/sh\necho ran >> {marker}\ncat\n")
    program.chmod(0o755)
    (repo / ".gitattributes").write_text("*.txt filter=evil\n")
    for command in ("clean", "smudge"):
        git(repo, "config", f"filter.evil.{command}", str(program))
    git(repo, "config", "core.fsmonitor", str(program))
    git(repo, "hash-object", "--path", "other.txt", "other.txt")  # the plant is real
    assert marker.exists()
    marker.unlink()

    apply_patch_bytes(repo, patch, PathGuard())
    assert (repo / "other.txt").read_text() == "child\n"
    assert not marker.exists()
