"""`keel gc` on real worktrees a crash left behind, found through a real SQLite store.

Each workspace is a real git worktree (or copy) under a private cache directory; the
runs and tasks that own them are real records whose status decides: the workspace of
an ended run goes (directory and git's worktree entry), that of a live run stays.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from keel.core.budget import Budget
from keel.core.records import RunOptions
from keel.core.state import RunState, transition
from keel.core.status import RunStatus
from keel.core.tasks import Task
from keel.runtime import worktrees
from keel.runtime.gc import collect_workspaces
from keel.store.sqlite.store import SQLiteStore

KEEL = [sys.executable, "-m", "keel.cli.app"]


def git(ws: Path, *args: str) -> str:
    base = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com"]
    done = subprocess.run([*base, *args], cwd=ws, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(folder))
    return folder


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    ws = tmp_path / "repo"
    ws.mkdir()
    (ws / "README.md").write_text("readme\n")
    git(tmp_path, "init", "-q", str(ws))
    git(ws, "add", "-A")
    git(ws, "commit", "-qm", "first")
    return ws


@pytest.fixture
def store(tmp_path: Path) -> SQLiteStore:
    return SQLiteStore(tmp_path / "keel.db")


def child_run(store: SQLiteStore, repo: Path, name: str, *, ended: bool) -> RunState:
    """A child run working in an isolated workspace of ``repo``; ended, or still running."""
    ws = worktrees.create(repo, root=worktrees.default_root(repo), name=name)
    options = RunOptions(
        model="scripted:x.json",
        budget=Budget(max_steps=5),
        depth=1,
        workspace_kind="isolated",
        isolated=ws.to_dict(),
    )
    state = store.create_run(goal="child", workspace=str(ws.path), options=options)
    return end(store, state) if ended else state


def end(store: SQLiteStore, state: RunState) -> RunState:
    ended, _ = store.append_events(
        state.run_id,
        [transition(state, RunStatus.CANCELLED, "parent_cancelled")],
        expected_seq=state.last_seq,
    )
    return ended


def isolated_task(store: SQLiteStore, repo: Path, *, ended: bool) -> tuple[Task, RunState]:
    """A worker's isolated task with its run (as ``keel worker`` makes them); when ``ended``,
    the run failed and the task was settled, but the worker died before removing the
    workspace."""
    task = store.create_task(
        "isolated", actor="t", options={"cwd": str(repo), "workspace": "isolated"}
    )
    claimed = store.claim_task(owner="w", lease_seconds=60, task_id=task.id)
    assert claimed is not None and claimed.lease_token is not None
    ws = worktrees.create(
        repo, root=worktrees.default_root(repo), name=f"task-{task.id}-{claimed.attempt}"
    )
    run = store.create_run(
        goal="isolated",
        workspace=str(ws.path),
        options=RunOptions(model="scripted:x.json", budget=Budget(max_steps=5)),
        task_id=task.id,
    )
    store.link_task_run(task.id, run.run_id, owner="w", token=claimed.lease_token)
    if ended:
        run = end(store, run)
        store.fail_task(task.id, owner="w", token=claimed.lease_token, reason="cancelled")
    return store.get_task(task.id), run


def registered(repo: Path) -> list[str]:
    listed = git(repo, "worktree", "list", "--porcelain").splitlines()
    return [line.removeprefix("worktree ") for line in listed if line.startswith("worktree ")]


def gc(tmp_path: Path, *args: str) -> dict[str, Any]:
    done = subprocess.run(
        [*KEEL, "gc", "--json", "--store", f"sqlite:///{tmp_path / 'keel.db'}", *args],
        capture_output=True,
        text=True,
        env=os.environ.copy(),
        check=False,
    )
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def test_gc_removes_the_worktrees_of_ended_runs_and_keeps_those_of_live_ones(
    tmp_path: Path, repo: Path, store: SQLiteStore, cache: Path
) -> None:
    dead_child = child_run(store, repo, "child-dead", ended=True)
    live_child = child_run(store, repo, "child-live", ended=False)
    dead_task, dead_task_run = isolated_task(store, repo, ended=True)
    live_task, live_task_run = isolated_task(store, repo, ended=False)
    # An earlier attempt of the live task whose run was never made (a crash mid-setup).
    leftover = worktrees.create(
        repo, root=worktrees.default_root(repo), name=f"task-{live_task.id}-0"
    )
    dead = [dead_child.workspace, dead_task_run.workspace, str(leftover.path)]
    live = [live_child.workspace, live_task_run.workspace]
    assert set(registered(repo)) == {str(repo), *dead, *live}

    previewed = gc(tmp_path, "--dry-run")
    assert sorted(w["path"] for w in previewed["removed"]) == sorted(dead)
    assert all(Path(p).is_dir() for p in dead)  # a dry run removes nothing

    report = gc(tmp_path)

    assert sorted(w["path"] for w in report["removed"]) == sorted(dead)
    assert sorted(w["path"] for w in report["kept"]) == sorted(live)
    by_path = {w["path"]: w for w in report["removed"]}
    assert by_path[dead_child.workspace]["run_id"] == dead_child.run_id
    assert by_path[dead_task_run.workspace]["task_id"] == dead_task.id
    assert by_path[str(leftover.path)]["why"] == "no run uses it"
    for path in dead:
        assert not Path(path).exists()
        assert not Path(path + ".json").exists()
    assert sorted(registered(repo)) == sorted([str(repo), *live])
    assert all((Path(p) / "README.md").is_file() for p in live)
    assert gc(tmp_path)["removed"] == []  # nothing left to do

    # Once the live ones end (and their task is settled), they go too.
    end(store, store.load_run(live_child.run_id))
    assert [w.path for w in collect_workspaces(store).removed] == [live_child.workspace]
    assert registered(repo) == [str(repo), live_task_run.workspace]
    store.close()


def test_a_task_whose_run_ended_but_whose_changes_were_not_taken_keeps_its_workspace(
    repo: Path, store: SQLiteStore, cache: Path
) -> None:
    _, run = isolated_task(store, repo, ended=False)
    end(store, run)  # the worker died after the run ended, before settling the task
    report = collect_workspaces(store)
    assert report.removed == ()
    [kept] = report.kept
    assert kept.path == run.workspace and "not taken" in kept.why
    assert Path(run.workspace).is_dir()
    store.close()


def test_a_copy_of_a_plain_directory_is_removed_with_its_private_git_directory(
    tmp_path: Path, store: SQLiteStore, cache: Path
) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "a.txt").write_text("a\n")
    state = child_run(store, plain, "child-copy", ended=True)
    copy = worktrees.reopen(Path(state.workspace))
    assert copy is not None and copy.kind == worktrees.COPY and copy.git_dir.is_dir()
    [removed] = collect_workspaces(store).removed
    assert removed.path == state.workspace
    assert not copy.path.exists() and not copy.git_dir.exists()
    assert (plain / "a.txt").read_text() == "a\n"
    store.close()
