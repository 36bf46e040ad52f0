"""`keel worker --concurrency 2` keeps tasks apart: isolated workspaces, and a workspace lock.

Real worker processes on a real SQLite file drive scripted models in real git
repositories. Each task writes its own file, sleeps (so two tasks run side by side),
then reads the file the other task wrote: in isolated workspaces neither ever sees
the other's uncommitted file, and the worktrees are gone afterwards; on one shared
workspace the two runs take turns (their drives never overlap in time).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from keel.core.events import Event, EventType
from keel.core.status import RunStatus
from keel.core.tasks import TaskStatus
from keel.runtime import worktrees
from keel.runtime.workspace_lock import WorkspaceLock, holder_root, lock_path
from keel.store.sqlite.store import SQLiteStore
from keel.tools.patches import patch_paths

KEEL = [sys.executable, "-m", "keel.cli.app"]


def git(ws: Path, *args: str) -> str:
    base = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com"]
    done = subprocess.run([*base, *args], cwd=ws, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Keel's cache (worktrees, locks) for this test and the workers it starts."""
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
    (ws / "dirty.txt").write_text("uncommitted in the parent\n")
    return ws


def script(tmp_path: Path, mine: str, theirs: str) -> str:
    """Write ``mine``, sleep a second, read ``theirs`` and the parent's dirty file."""
    turns: list[dict[str, Any]] = [
        call("write_file", path=mine, content=f"written by the task owning {mine}\n"),
        call("run_command", argv=["sleep", "1"]),
        call("read_file", path=theirs),
        call("read_file", path="dirty.txt"),
        call("request_completion", summary=f"wrote {mine}"),
    ]
    path = tmp_path / f"{mine}.json"
    path.write_text(json.dumps(turns))
    return f"scripted:{path}"


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"tool_calls": [{"name": name, "arguments": arguments}]}


def worker(tmp_path: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*KEEL, "worker", "--store", f"sqlite:///{tmp_path / 'keel.db'}", "--poll", "0.1", *args],
        cwd=tmp_path,
        env={**os.environ, "KEEL_LEASE_TTL": "30"},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def tool_outcomes(events: list[Event], path: str) -> list[tuple[str, str]]:
    """(event type, text) of each read_file call of ``path``."""
    found = []
    for e in events:
        if (
            e.type in (EventType.TOOL_FINISHED, EventType.TOOL_FAILED)
            and e.data.get("tool") == "read_file"
            and e.data["arguments"].get("path") == path
        ):
            found.append((e.type.value, str(e.data.get("message") or e.data.get("output"))))
    return found


def drive_interval(events: list[Event]) -> tuple[datetime, datetime]:
    """From the first model request to the run's end: when the run was being driven."""
    start = next(e.recorded_at for e in events if e.type is EventType.MODEL_REQUESTED)
    return start, events[-1].recorded_at


@pytest.mark.sandboxed
def test_isolated_tasks_run_side_by_side_without_seeing_each_other(
    tmp_path: Path, repo: Path, cache: Path
) -> None:
    store = SQLiteStore(tmp_path / "keel.db")
    tasks = {
        mine: store.create_task(
            f"write {mine}",
            actor="lead",
            options={
                "cwd": str(repo),
                "model": script(tmp_path, mine, theirs),
                "mode": "auto",
                "workspace": "isolated",
            },
        )
        for mine, theirs in (("a.txt", "b.txt"), ("b.txt", "a.txt"))
    }
    index_before = (repo / ".git" / "index").read_bytes()
    proc = worker(tmp_path, "--concurrency", "2", "--until-idle")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err

    intervals = []
    for mine, task in tasks.items():
        theirs = "b.txt" if mine == "a.txt" else "a.txt"
        done = store.get_task(task.id)
        assert done.status is TaskStatus.COMPLETED, (done, err)
        assert done.run_id is not None
        run = store.load_run(done.run_id)
        assert run.status is RunStatus.COMPLETED
        assert Path(run.workspace).parent == worktrees.default_root(repo).resolve()
        events = list(store.read_events(run.run_id))
        [(kind, text)] = tool_outcomes(events, theirs)
        assert kind == "tool_failed" and "written by" not in text  # never saw the other's
        [(kind, text)] = tool_outcomes(events, "dirty.txt")
        assert kind == "tool_finished" and "uncommitted in the parent" in text
        intervals.append(drive_interval(events))
        # The changes came back as a patch artifact of the run, named in the result.
        assert done.result is not None
        artifact_id = done.result.splitlines()[-1].removeprefix("patch: ")
        artifact, patch = store.get_artifact(artifact_id)
        assert artifact.run_id == run.run_id and artifact.name == f"patch-{run.run_id}.diff"
        assert patch_paths(patch) == [mine]

    (a_start, a_end), (b_start, b_end) = intervals
    assert a_start < b_end and b_start < a_end  # they did run at the same time
    assert not (repo / "a.txt").exists() and not (repo / "b.txt").exists()
    assert (repo / ".git" / "index").read_bytes() == index_before
    assert git(repo, "worktree", "list", "--porcelain").count("worktree ") == 1
    assert not any(worktrees.default_root(repo).iterdir())
    store.close()


@pytest.mark.sandboxed
def test_tasks_on_one_shared_workspace_take_turns(tmp_path: Path, repo: Path, cache: Path) -> None:
    store = SQLiteStore(tmp_path / "keel.db")
    tasks = [
        store.create_task(
            f"write {mine}",
            actor="lead",
            options={"cwd": str(repo), "model": script(tmp_path, mine, theirs), "mode": "auto"},
        )
        for mine, theirs in (("a.txt", "b.txt"), ("b.txt", "a.txt"))
    ]
    proc = worker(tmp_path, "--concurrency", "2", "--until-idle")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err

    runs = []
    for task in tasks:
        done = store.get_task(task.id)
        assert done.status is TaskStatus.COMPLETED, (done, err)
        assert done.run_id is not None and "patch:" not in (done.result or "")
        runs.append(list(store.read_events(done.run_id)))
    (a_start, a_end), (b_start, b_end) = map(drive_interval, runs)
    assert a_end < b_start or b_end < a_start, "two runs wrote one workspace at once"
    first, second = sorted(runs, key=lambda events: drive_interval(events)[0])
    first_file = "a.txt" if first is runs[0] else "b.txt"
    second_file = "b.txt" if first_file == "a.txt" else "a.txt"
    [(kind, _)] = tool_outcomes(first, second_file)
    assert kind == "tool_failed"  # the second had not run yet
    [(kind, text)] = tool_outcomes(second, first_file)
    assert kind == "tool_finished" and "written by" in text  # shared: it sees the first's
    assert (repo / "a.txt").exists() and (repo / "b.txt").exists()
    store.close()


def test_a_slot_waiting_for_a_busy_workspace_stops_with_the_worker(
    tmp_path: Path, repo: Path, cache: Path
) -> None:
    store = SQLiteStore(tmp_path / "keel.db")
    done = tmp_path / "done.json"
    done.write_text(json.dumps([{"content": "finished"}]))
    task = store.create_task(
        "wait for the workspace",
        actor="lead",
        options={"cwd": str(repo), "model": f"scripted:{done}", "mode": "edit"},
    )
    with WorkspaceLock(repo, root_id="run_someone_else"):
        proc = worker(tmp_path)
        deadline = time.monotonic() + 30
        while store.get_task(task.id).run_id is None:
            assert time.monotonic() < deadline, proc.stderr
            time.sleep(0.05)
        time.sleep(0.5)  # the slot is waiting for the lock now
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
        assert proc.returncode == 0, err
    released = store.get_task(task.id)
    assert released.status is TaskStatus.PENDING and released.owner is None
    assert released.run_id is not None
    events = list(store.read_events(released.run_id))
    assert not [e for e in events if e.type is EventType.MODEL_REQUESTED]  # it never ran

    again = worker(tmp_path, "--until-idle")  # the lock is free now
    _, err = again.communicate(timeout=60)
    assert again.returncode == 0, err
    assert store.get_task(task.id).status is TaskStatus.COMPLETED
    store.close()


def test_the_lock_is_shared_within_a_run_tree_and_exclusive_across_trees(
    tmp_path: Path, cache: Path
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    holder = WorkspaceLock(ws, root_id="run_root")
    assert holder.acquire()
    assert holder_root(lock_path(ws)) == "run_root"
    assert not str(lock_path(ws)).startswith(str(ws))  # outside the workspace
    child = WorkspaceLock(ws / "." / "", root_id="run_root")  # the same directory spelt so
    assert child.acquire(should_stop=lambda: True) and child.shared and not child.held
    stranger = WorkspaceLock(ws, root_id="run_other")
    asked: list[int] = []
    assert not stranger.acquire(should_stop=lambda: bool(asked.append(1)) or len(asked) > 3)
    assert len(asked) == 4 and not stranger.held
    holder.release()
    assert holder_root(lock_path(ws)) is None
    assert stranger.acquire(should_stop=lambda: True) and stranger.held
    stranger.release()


def test_tasks_create_isolated_stores_the_option_the_worker_reads(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'keel.db'}"
    made = subprocess.run(
        [*KEEL, "tasks", "create", "refactor", "--isolated", "--json", "--store", url],
        capture_output=True,
        text=True,
        check=False,
    )
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["options"] == {"workspace": "isolated"}
    plain = subprocess.run(
        [*KEEL, "tasks", "create", "document", "--json", "--store", url],
        capture_output=True,
        text=True,
        check=False,
    )
    assert json.loads(plain.stdout)["options"] in (None, {})
