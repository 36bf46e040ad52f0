"""apply_patch with its git inside the real bubblewrap sandbox: the patch reaches git as a
read-only file, the work tree is all it may write, and a program the repository
configures (were one ever to run) reaches nothing of the host.

Patches come from real child worktrees; markers a hostile configuration tries to plant
are looked for on the host afterwards.
"""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from keel.core.errors import ToolError
from keel.core.guard import PathGuard
from keel.runtime.worktrees import create
from keel.sandbox.base import Confinement, Sandbox, SandboxSettings
from keel.sandbox.choose import open_sandbox
from keel.store.base import Store
from keel.store.url import open_store
from keel.testing.stores import make_run
from keel.tools.base import ToolContext
from keel.tools.patches import apply_patch, apply_patch_bytes, workspace_git

pytestmark = pytest.mark.sandboxed


def git(ws: Path, *args: str) -> str:
    base = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com"]
    done = subprocess.run([*base, *args], cwd=ws, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture
def sandbox() -> Sandbox:
    opened = open_sandbox(SandboxSettings(mode="required"))
    assert opened.kind == "bubblewrap"
    return opened


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    (ws / "src").mkdir(parents=True)
    (ws / "src" / "app.py").write_text("".join(f"line {n}\n" for n in range(1, 21)))
    (ws / "other.txt").write_text("other\n")
    git(tmp_path, "init", "-q", str(ws))
    git(ws, "add", "-A")
    git(ws, "commit", "-qm", "first")
    return ws.resolve()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with open_store(f"sqlite:///{tmp_path / 'keel.db'}") as opened:
        yield opened


@pytest.fixture
def home_marker() -> Iterator[Path]:
    marker = Path.home() / f".keel-apply-patch-test-{uuid.uuid4().hex}"
    yield marker
    marker.unlink(missing_ok=True)


def child_patch(parent: Path, tmp_path: Path, change: dict[str, str]) -> bytes:
    child = create(parent, root=tmp_path / "children", name=f"c{uuid.uuid4().hex[:8]}")
    try:
        for rel, text in change.items():
            (child.path / rel).parent.mkdir(parents=True, exist_ok=True)
            (child.path / rel).write_text(text)
        return child.patch()
    finally:
        child.remove()


def files_of(ws: Path) -> dict[str, bytes]:
    return {
        p.relative_to(ws).as_posix(): p.read_bytes()
        for p in sorted(ws.rglob("*"))
        if p.is_file() and ".git" not in p.relative_to(ws).parts
    }


def test_tool_applies_the_artifact_with_git_confined(
    repo: Path, tmp_path: Path, store: Store, sandbox: Sandbox
) -> None:
    text = (repo / "src" / "app.py").read_text().replace("line 5\n", "line five\n")
    patch = child_patch(repo, tmp_path, {"src/app.py": text, "new/file.txt": "new\n"})
    run = make_run(store, workspace=str(repo))
    artifact = store.put_artifact(run.run_id, "patch", patch)
    ctx = ToolContext(
        workspace=repo, run_id=run.run_id, call_id="c1", owner="t", store=store, sandbox=sandbox
    )

    intent = apply_patch.intent(ctx, {"artifact": artifact.id})
    assert set(intent) == {"src/app.py", "new/file.txt"}
    assert not apply_patch.effect_happened(ctx, intent)
    result = apply_patch.run(ctx, {"artifact": artifact.id})

    assert (repo / "src" / "app.py").read_text() == text
    assert (repo / "new" / "file.txt").read_text() == "new\n"
    assert result.changed_files == intent
    assert apply_patch.effect_happened(ctx, intent)
    assert git(repo, "status", "--porcelain") == " M src/app.py\n?? new/\n"  # index untouched


def test_conflict_shows_the_failing_hunk_and_changes_nothing(
    repo: Path, tmp_path: Path, sandbox: Sandbox
) -> None:
    text = (repo / "src" / "app.py").read_text()
    ours = text.replace("line 2\n", "line two\n").replace("line 18\n", "line eighteen\n")
    patch = child_patch(repo, tmp_path, {"src/app.py": ours, "other.txt": "child\n"})
    (repo / "src" / "app.py").write_text(text.replace("line 18\n", "line 18 (parent)\n"))
    before = files_of(repo)

    with pytest.raises(ToolError) as caught:
        apply_patch_bytes(repo, patch, PathGuard(), sandbox=sandbox)

    message = str(caught.value)
    assert "no file was changed" in message
    assert "src/app.py: 1 of 2 hunk(s) do not apply" in message
    assert "+line eighteen" in message and "+line two" not in message
    assert "other.txt:" not in message
    assert files_of(repo) == before


def test_hostile_repository_configuration_reaches_nothing_outside_the_workspace(
    repo: Path, tmp_path: Path, sandbox: Sandbox, home_marker: Path
) -> None:
    """Filters and fsmonitor are neutralised; an alias proves what runs anyway is confined."""
    outside = tmp_path / "outside-marker"
    plant = (
        f"echo ran > {outside}; echo ran > {home_marker}; "
        "echo ran > .git/planted; echo ran > inside.txt; cat"
    )
    program = repo / "evil.sh"  # inside: visible to the confined git, were it to run it
    program.write_text(f"#!/bin/sh\n{plant}\n")
    program.chmod(0o755)
    patch = child_patch(repo, tmp_path, {"other.txt": "child\n"})
    (repo / ".gitattributes").write_text("*.txt filter=evil\n")
    for command in ("clean", "smudge"):
        git(repo, "config", f"filter.evil.{command}", str(program))
    git(repo, "config", "core.fsmonitor", str(program))
    git(repo, "config", "alias.evil", f"!{plant}")

    apply_patch_bytes(repo, patch, PathGuard(), sandbox=sandbox)
    assert (repo / "other.txt").read_text() == "child\n"
    assert not (repo / "inside.txt").exists()  # no configured program ran at all

    confined = workspace_git(repo, sandbox=sandbox, guard=PathGuard())
    confined.run("evil")  # the program now runs, inside the sandbox
    assert (repo / "inside.txt").read_text() == "ran\n"  # it did run: the work tree is its
    assert not outside.exists()
    assert not home_marker.exists()
    assert not (repo / ".git" / "planted").exists()  # .git is read-only to apply's git


def test_protected_and_secret_paths_stay_refused_with_nothing_changed(
    repo: Path, sandbox: Sandbox
) -> None:
    def hand_patch(path: str) -> bytes:
        return (
            f"diff --git a/{path} b/{path}\nnew file mode 100644\n--- /dev/null\n"
            f"+++ b/{path}\n@@ -0,0 +1 @@\n+planted\n"
        ).encode()

    before = files_of(repo)
    refusals = {
        ".git/hooks/pre-commit": "inside git's own directory",
        ".keel/config.toml": "protected",
        "../outside.txt": "leads outside the workspace",
        ".env": "the sandbox hides it from programs",
    }
    for path, reason in refusals.items():
        with pytest.raises(ToolError, match=reason):
            apply_patch_bytes(
                repo, hand_patch("ok.txt") + hand_patch(path), PathGuard(), sandbox=sandbox
            )
    assert files_of(repo) == before
    assert not (repo.parent / "outside.txt").exists()


def test_unconfined_sandbox_applies_too(repo: Path, tmp_path: Path) -> None:
    """Kind "none" (sandbox off) hands git the same patch file, readable as it is."""
    patch = child_patch(repo, tmp_path, {"other.txt": "child\n", ".env": "A=1\n"})
    unconfined = open_sandbox(SandboxSettings(mode="off"))
    summary = apply_patch_bytes(repo, patch, PathGuard(), sandbox=unconfined)
    assert set(summary.changed) == {"other.txt", ".env"}
    assert (repo / ".env").read_text() == "A=1\n"


def test_readable_files_are_visible_read_only_and_nothing_else_outside(
    repo: Path, tmp_path: Path, sandbox: Sandbox
) -> None:
    shown = tmp_path / "shown.txt"
    shown.write_text("visible\n")
    unseen = tmp_path / "unseen.txt"
    unseen.write_text("unseen\n")
    script = f"cat {shown}; cat {unseen} 2>/dev/null || echo no-unseen; echo x >> {shown} || true"

    def call(confinement: Confinement) -> str:
        proc = sandbox.popen(
            ["sh", "-c", script], confinement, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
        )
        try:
            out, _ = proc.communicate(timeout=60)
        finally:
            sandbox.finish(proc)
        return out.decode()

    assert call(Confinement(workspace=repo, readable=(shown,))) == "visible\nno-unseen\n"
    assert shown.read_text() == "visible\n"
    with pytest.raises(OSError, match="absolute path"):
        call(Confinement(workspace=repo, readable=(Path("shown.txt"),)))
