"""`keel worker` on one machine: tasks run as linked runs, heartbeats, graceful SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from keel.core.status import RunStatus
from keel.core.tasks import TaskStatus
from keel.store.sqlite.store import SQLiteStore

KEEL = [sys.executable, "-m", "keel.cli.app"]


def _script(tmp_path: Path, name: str, turns: list[dict[str, object]]) -> str:
    path = tmp_path / name
    path.write_text(json.dumps(turns))
    return f"scripted:{path}"


def _worker(tmp_path: Path, *args: str, ttl: float = 30.0) -> subprocess.Popen[str]:
    env = {**os.environ, "KEEL_LEASE_TTL": str(ttl)}
    return subprocess.Popen(
        [*KEEL, "worker", "--store", f"sqlite:///{tmp_path / 'keel.db'}", "--poll", "0.1", *args],
        cwd=tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_worker_runs_ready_tasks_as_linked_runs_in_dependency_order(tmp_path: Path) -> None:
    done = _script(tmp_path, "done.json", [{"content": "finished the work"}])
    options = {"cwd": str(tmp_path), "model": done, "mode": "edit"}
    store = SQLiteStore(tmp_path / "keel.db")
    schema = store.create_task("create database", actor="lead", options=options)
    api = store.create_task("write API", actor="lead", blocked_by=[schema.id], options=options)
    docs = store.create_task("write docs", actor="lead", blocked_by=[schema.id], options=options)

    proc = _worker(tmp_path, "--concurrency", "2", "--until-idle")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err

    for task_id in (schema.id, api.id, docs.id):
        task = store.get_task(task_id)
        assert task.status is TaskStatus.COMPLETED, (task, err)
        assert task.result == "finished the work"
        assert task.run_id is not None
        run = store.load_run(task.run_id)
        assert run.status is RunStatus.COMPLETED
        assert run.task_id == task_id
    runs_started = {
        e.recorded_at: e.task_id
        for t in (schema, api, docs)
        for e in store.task_events(t.id)
        if e.type == "task_claimed"
    }
    first_claimed = runs_started[min(runs_started)]
    assert first_claimed == schema.id
    store.close()


@pytest.mark.sandboxed
def test_heartbeat_keeps_a_short_lease_alive_through_a_long_step(tmp_path: Path) -> None:
    slow = _script(
        tmp_path,
        "slow.json",
        [
            {"tool_calls": [{"name": "run_command", "arguments": {"argv": ["sleep", "3"]}}]},
            {"content": "slept"},
        ],
    )
    store = SQLiteStore(tmp_path / "keel.db")
    task = store.create_task(
        "sleep on it",
        actor="lead",
        options={"cwd": str(tmp_path), "model": slow, "mode": "auto"},
    )
    proc = _worker(tmp_path, "--until-idle", ttl=1.2)
    deadline = time.monotonic() + 30
    while store.get_task(task.id).status is not TaskStatus.IN_PROGRESS:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    time.sleep(2.0)  # well past one lease length: only heartbeats keep it
    assert store.claim_task(owner="intruder", lease_seconds=5, task_id=None) is None
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    final = store.get_task(task.id)
    assert final.status is TaskStatus.COMPLETED
    kinds = [e.type for e in store.task_events(task.id)]
    assert "task_heartbeat" in kinds
    assert "task_reclaimed" not in kinds
    store.close()


@pytest.mark.sandboxed
def test_sigterm_finishes_the_step_releases_the_task_and_exits_zero(tmp_path: Path) -> None:
    slow = _script(
        tmp_path,
        "slow.json",
        [
            {"tool_calls": [{"name": "run_command", "arguments": {"argv": ["sleep", "2"]}}]},
            {"content": "slept"},
        ],
    )
    store = SQLiteStore(tmp_path / "keel.db")
    task = store.create_task(
        "sleep on it", actor="lead", options={"cwd": str(tmp_path), "model": slow, "mode": "auto"}
    )
    proc = _worker(tmp_path)
    deadline = time.monotonic() + 30
    while store.get_task(task.id).run_id is None:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    time.sleep(0.5)  # inside the sleep step
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err

    released = store.get_task(task.id)
    assert released.status is TaskStatus.PENDING
    assert released.owner is None
    assert released.run_id is not None
    run = store.load_run(released.run_id)
    assert run.status is RunStatus.RUNNING  # resumable, not failed
    assert run.usage.tool_calls == 1  # the step in flight finished and was recorded
    assert store.current_run_lease(released.run_id) is None

    again = _worker(tmp_path, "--until-idle")
    _, err = again.communicate(timeout=60)
    assert again.returncode == 0, err
    finished = store.get_task(task.id)
    assert finished.status is TaskStatus.COMPLETED
    assert finished.run_id == released.run_id  # the same run was resumed, not restarted
    assert store.load_run(released.run_id).usage.tool_calls == 1
    store.close()


def test_a_task_whose_run_waits_for_approval_is_handed_back_then_finished_after_approval(
    tmp_path: Path,
) -> None:
    asks = _script(
        tmp_path,
        "asks.json",
        [
            {
                "tool_calls": [
                    {"name": "run_command", "arguments": {"argv": ["sh", "-c", "echo x >> log"]}}
                ]
            },
            {"content": "logged"},
        ],
    )
    store = SQLiteStore(tmp_path / "keel.db")
    task = store.create_task(
        "log once", actor="lead", options={"cwd": str(tmp_path), "model": asks, "mode": "edit"}
    )
    first = _worker(tmp_path, "--until-idle")
    _, err = first.communicate(timeout=60)
    assert first.returncode == 0, err  # idle: the waiting task is not claimed over and over

    parked = store.get_task(task.id)
    assert parked.status is TaskStatus.PENDING
    assert parked.run_id is not None
    assert store.load_run(parked.run_id).status is RunStatus.WAITING
    assert not (tmp_path / "log").exists()
    assert store.claim_task(owner="someone", lease_seconds=5) is None

    approve = subprocess.run(
        [*KEEL, "approve", parked.run_id, "--store", f"sqlite:///{tmp_path / 'keel.db'}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert approve.returncode == 0, approve.stderr
    second = _worker(tmp_path, "--until-idle")
    _, err = second.communicate(timeout=60)
    assert second.returncode == 0, err

    done = store.get_task(task.id)
    assert done.status is TaskStatus.COMPLETED, err
    assert done.run_id == parked.run_id
    assert (tmp_path / "log").read_text() == "x\n"  # approved once, ran once
    store.close()


def test_a_queued_run_the_worker_cannot_drive_fails_with_the_reason_instead_of_looping(
    tmp_path: Path,
) -> None:
    db = f"sqlite:///{tmp_path / 'keel.db'}"
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "KEEL_MODEL")}
    enqueue = subprocess.run(
        [*KEEL, "run", "fix it", "--model", "openai:gpt-4o", "--detach", "--store", db],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert enqueue.returncode == 0, enqueue.stderr
    run_id = enqueue.stdout.split()[0]

    worker = subprocess.run(
        [*KEEL, "worker", "--until-idle", "--poll", "0.1", "--store", db],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert worker.returncode == 0, worker.stderr
    store = SQLiteStore(tmp_path / "keel.db")
    run = store.load_run(run_id)
    assert run.status is RunStatus.FAILED
    assert run.reason is not None and "OPENAI_API_KEY" in run.reason
    assert store.current_run_lease(run_id) is None
    store.close()
