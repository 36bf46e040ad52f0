"""Lease holders that die or freeze: real processes, real signals, one SQLite file."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from keel.core.errors import TaskNotClaimable
from keel.core.tasks import Task, TaskStatus
from keel.store.sqlite.store import SQLiteStore

LEASE = 1.0

# Claims the task, says so on stdout, then heartbeats every 0.2 s until refused; after
# the first refusal it tries every other holder write and reports each outcome.
HOLDER = r"""
import json, sys, time
from keel.store.sqlite.store import SQLiteStore

path, task_id, lease = sys.argv[1], sys.argv[2], float(sys.argv[3])
store = SQLiteStore(path)
task = store.claim_task(owner="holder", lease_seconds=lease, task_id=task_id)
print(json.dumps({"token": task.lease_token, "expires": task.lease_expires_at.timestamp()}),
      flush=True)
outcomes = {}

def attempt(name, write):
    try:
        write()
        outcomes[name] = "accepted"
    except Exception as exc:
        outcomes[name] = type(exc).__name__

token = task.lease_token
while "heartbeat" not in outcomes or outcomes["heartbeat"] == "accepted":
    time.sleep(0.2)
    attempt("heartbeat", lambda: store.heartbeat_task(
        task_id, owner="holder", token=token, lease_seconds=lease))
attempt("link", lambda: store.link_task_run(task_id, "run_x", owner="holder", token=token))
attempt("complete", lambda: store.complete_task(task_id, owner="holder", token=token))
attempt("complete_by_name", lambda: store.complete_task(task_id, owner="holder"))
attempt("fail", lambda: store.fail_task(task_id, owner="holder", reason="x", token=token))
attempt("release", lambda: store.release_task(task_id, owner="holder", token=token))
print(json.dumps(outcomes), flush=True)
"""


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SQLiteStore]:
    s = SQLiteStore(tmp_path / "keel.db")
    yield s
    s.close()


def start_holder(store: SQLiteStore, task: Task) -> tuple[subprocess.Popen[str], dict[str, float]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(store.path), task.id, str(LEASE)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line, proc.stderr.read() if proc.stderr else "holder said nothing"
    return proc, json.loads(line)


def test_sigkilled_holder_task_is_claimable_again_within_lease_plus_one_second(
    store: SQLiteStore,
) -> None:
    task = store.create_task("build", actor="planner")
    proc, claim = start_holder(store, task)
    claimed_at = claim["expires"] - LEASE
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=10)  # reaps it and closes its pipes
    with pytest.raises(TaskNotClaimable, match="holder holds it"):
        store.claim_task(owner="rescuer", lease_seconds=30, task_id=task.id)
    deadline = claimed_at + LEASE + 1.0
    taken = None
    while taken is None and time.time() < deadline + 1.0:
        try:
            taken = store.claim_task(owner="rescuer", lease_seconds=30, task_id=task.id)
        except TaskNotClaimable:
            time.sleep(0.02)
    assert taken is not None
    assert time.time() <= deadline, "not claimable within lease + 1 s"
    assert (taken.owner, taken.attempt) == ("rescuer", 2)
    reclaim = store.task_events(task.id)[-2]
    assert (reclaim.type, reclaim.data["previous_owner"]) == ("task_reclaimed", "holder")


def test_frozen_holder_resumed_after_a_reclaim_has_every_write_refused(
    store: SQLiteStore,
) -> None:
    task = store.create_task("build", actor="planner")
    proc, _ = start_holder(store, task)
    try:
        time.sleep(0.5)  # it heartbeats for a while
        os.kill(proc.pid, signal.SIGSTOP)
        frozen_at = time.time()
        taken = None
        while taken is None and time.time() < frozen_at + LEASE + 3:
            try:
                taken = store.claim_task(owner="rescuer", lease_seconds=30, task_id=task.id)
            except TaskNotClaimable:
                time.sleep(0.05)
        assert taken is not None, "the frozen holder's lease never expired"
        history_at_reclaim = store.task_events(task.id)
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    outcomes = json.loads(out.strip().splitlines()[-1])
    assert outcomes == {
        "heartbeat": "LeaseLost",
        "link": "LeaseLost",
        "complete": "LeaseLost",
        "complete_by_name": "NotOwner",
        "fail": "LeaseLost",
        "release": "LeaseLost",
    }
    assert store.task_events(task.id) == history_at_reclaim  # nothing it tried was written
    now = store.get_task(task.id)
    assert (now.status, now.owner, now.lease_token) == (
        TaskStatus.IN_PROGRESS,
        "rescuer",
        taken.lease_token,
    )
