"""The harness's own git never runs what the workspace configures, and leaves secrets out.

Each planted program is first shown to run under plain git (so the plant is real),
then ``workspace_diff`` runs with the planted configuration and the program's
marker file must not appear, while the diff still shows the change. Unconfined
runs prove the hardening alone; the bubblewrap runs add the read-only sandbox.
"""

from __future__ import annotations

import os
import pty
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from keel.core.guard import PathGuard
from keel.sandbox.base import Sandbox, SandboxSettings
from keel.sandbox.bubblewrap import probe_bubblewrap
from keel.sandbox.choose import open_sandbox
from keel.verify.diff import HardenedGit, workspace_diff


@pytest.fixture(params=["none", "bubblewrap"])
def sandbox(request: pytest.FixtureRequest) -> Sandbox:
    if request.param == "none":
        return open_sandbox(SandboxSettings(mode="off"))
    path = shutil.which("bwrap")
    if path is None:
        pytest.skip("bubblewrap is not installed (apt-get install bubblewrap): skipped")
    probe = probe_bubblewrap(path)
    if not probe.works:
        pytest.skip(f"bubblewrap does not work here ({probe.reason}): skipped")
    return open_sandbox(SandboxSettings(mode="required"))


def git(ws: Path, *args: str) -> subprocess.CompletedProcess[str]:
    base = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com"]
    return subprocess.run([*base, *args], cwd=ws, capture_output=True, text=True, check=False)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    ws = (tmp_path / "ws").resolve()
    ws.mkdir()
    (ws / "a.txt").write_text("one\n")
    (ws / ".gitattributes").write_text("*.txt filter=x diff=y\n")
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "first"]):
        assert git(ws, *args).returncode == 0
    (ws / "a.txt").write_text("one\ntwo\n")
    return ws


@pytest.fixture
def plant(repo: Path, tmp_path: Path) -> Callable[[str, str], Path]:
    """Configure ``key`` in .git/config to a program that leaves a marker; return the marker."""

    def configure(key: str, name: str) -> Path:
        marker = tmp_path / f"ran-{name}"
        program = tmp_path / f"evil-{name}"
        program.write_text(f'#!/bin/sh\necho "$@" >> {marker}\ncat\n')
        program.chmod(0o755)
        assert git(repo, "config", key, str(program)).returncode == 0
        return marker

    return configure


PLANTS = [
    ("diff.external", "external"),
    ("diff.y.command", "driver-command"),
    ("diff.y.textconv", "textconv"),
    ("filter.x.clean", "clean"),
    ("filter.x.process", "process"),
    ("core.fsmonitor", "fsmonitor"),
]


@pytest.mark.parametrize(("key", "name"), PLANTS, ids=[name for _, name in PLANTS])
def test_planted_programs_never_run_during_the_diff(
    repo: Path, sandbox: Sandbox, plant: Callable[[str, str], Path], key: str, name: str
) -> None:
    marker = plant(key, name)
    git(repo, "diff", "HEAD")
    git(repo, "status")
    assert marker.exists(), f"plain git did not run the planted {key}"
    marker.unlink()
    diff = workspace_diff(repo, guard=PathGuard(), sandbox=sandbox)
    assert not marker.exists()
    assert "+two" in diff and "a/a.txt" in diff


def test_a_planted_pager_never_runs(
    repo: Path, sandbox: Sandbox, plant: Callable[[str, str], Path]
) -> None:
    marker = plant("core.pager", "pager")
    leader, follower = pty.openpty()
    try:
        subprocess.run(["git", "diff", "HEAD"], cwd=repo, stdout=follower, check=False)
    finally:
        os.close(follower)
        os.close(leader)
    assert marker.exists(), "plain git on a terminal did not run the planted pager"
    marker.unlink()
    assert "+two" in workspace_diff(repo, sandbox=sandbox)
    assert not marker.exists()


def test_planted_hooks_never_run(repo: Path, sandbox: Sandbox, tmp_path: Path) -> None:
    marker = tmp_path / "ran-hook"
    hooks = tmp_path / "planted-hooks"
    hooks.mkdir()
    for where in (hooks, repo / ".git" / "hooks"):
        hook = where / "post-index-change"
        hook.write_text(f"#!/bin/sh\necho hook >> {marker}\n")
        hook.chmod(0o755)
    git(repo, "add", "a.txt")  # writes the index: post-index-change runs
    assert marker.exists(), "plain git did not run the planted hook"
    marker.unlink()
    git(repo, "config", "core.hooksPath", str(hooks))
    (repo / "a.txt").write_text("one\ntwo\nthree\n")
    assert "+three" in workspace_diff(repo, sandbox=sandbox)
    HardenedGit(repo, guard=PathGuard(), sandbox=sandbox).run("add", "a.txt")
    if sandbox.kind == "none":  # the index was written, yet no hook ran
        assert "+three" in git(repo, "diff", "--cached").stdout
    assert not marker.exists()


def test_odd_filter_driver_names_are_neutralised_too(
    repo: Path, sandbox: Sandbox, tmp_path: Path
) -> None:
    marker = tmp_path / "ran-odd"
    program = tmp_path / "evil-odd"
    program.write_text(f"#!/bin/sh\necho x >> {marker}\ncat\n")
    program.chmod(0o755)
    (repo / ".gitattributes").write_text("*.txt filter=a.b=c\n")  # `-c` could not name it
    git(repo, "config", "filter.a.b=c.clean", str(program))
    git(repo, "diff", "HEAD")
    assert marker.exists(), "plain git did not run the planted filter"
    marker.unlink()
    assert "+two" in workspace_diff(repo, sandbox=sandbox)
    assert not marker.exists()


def test_secret_files_are_left_out_of_the_diff_tracked_or_not(repo: Path, sandbox: Sandbox) -> None:
    (repo / ".env.production").write_text("DB_PASSWORD=planted-tracked-secret\n")
    (repo / "vault").mkdir()
    (repo / "vault" / "key.pem").write_text("planted-policy-secret\n")
    assert git(repo, "add", "-A").returncode == 0
    assert git(repo, "commit", "-qm", "secrets").returncode == 0
    (repo / "a.txt").write_text("one\ntwo\nthree\n")
    (repo / ".env.production").write_text("DB_PASSWORD=planted-changed-secret\n")
    (repo / "vault" / "key.pem").write_text("planted-changed-policy-secret\n")
    (repo / ".env").write_text("OPENAI_API_KEY=planted-untracked-secret\n")
    (repo / "config").mkdir()
    (repo / "config" / ".env.local").write_text("TOKEN=planted-nested-secret\n")
    (repo / "new.txt").write_text("a new file\n")
    guard = PathGuard(secret=(".env", ".env.*", "vault"))
    diff = workspace_diff(repo, guard=guard, sandbox=sandbox)
    assert "planted" not in diff
    assert ".env" not in diff and "vault" not in diff
    assert "+three" in diff and "+a new file" in diff


def test_the_diff_changes_nothing_in_the_workspace(repo: Path, sandbox: Sandbox) -> None:
    (repo / "new.txt").write_text("new\n")
    index = (repo / ".git" / "index").read_bytes()
    before = sorted(str(p.relative_to(repo)) for p in repo.rglob("*"))
    workspace_diff(repo, sandbox=sandbox)
    assert (repo / ".git" / "index").read_bytes() == index
    assert sorted(str(p.relative_to(repo)) for p in repo.rglob("*")) == before


def test_a_repository_without_commits_still_shows_new_files(
    tmp_path: Path, sandbox: Sandbox
) -> None:
    ws = (tmp_path / "fresh").resolve()
    ws.mkdir()
    assert git(ws, "init", "-q").returncode == 0
    (ws / "hello.txt").write_text("hi\n")
    diff = workspace_diff(ws, sandbox=sandbox)
    assert "+++ b/hello.txt" in diff and "+hi" in diff
