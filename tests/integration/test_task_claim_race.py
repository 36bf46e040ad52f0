"""Eight processes race over 2,000 tasks in one SQLite file."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from keel.core.tasks import TaskStatus
from keel.store.sqlite.store import SQLiteStore
from keel.testing.tasks import lease_intervals

TASKS = 2000
PROCESSES = 8

CLAIMER = r"""
import json, sys, time
from keel.store.sqlite.store import SQLiteStore

path, owner, start_at = sys.argv[1], sys.argv[2], float(sys.argv[3])
store = SQLiteStore(path)
claimed, errors = [], []
while time.time() < start_at:
    time.sleep(0.002)
while True:
    try:
        task = store.claim_task(owner=owner, lease_seconds=60)
        if task is None:
            break
        claimed.append(task.id)
        store.complete_task(task.id, owner=owner, token=task.lease_token, result=owner)
    except Exception as exc:
        errors.append(f"{type(exc).__name__}: {exc}")
        if len(errors) > 20:
            break
store.close()
print(json.dumps({"owner": owner, "claimed": claimed, "errors": errors}))
"""


def test_eight_processes_claim_every_task_exactly_once_without_lock_errors(
    tmp_path: Path,
) -> None:
    path = tmp_path / "race.db"
    store = SQLiteStore(path)
    ids = [store.create_task(f"t{i}", actor="planner").id for i in range(TASKS)]
    start_at = time.time() + 1.0
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CLAIMER, str(path), f"worker-{n}", str(start_at)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(PROCESSES)
    ]
    reports = []
    for proc in procs:
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err
        assert "locked" not in err
        reports.append(json.loads(out))

    assert [r["errors"] for r in reports] == [[]] * PROCESSES  # no "database is locked"
    claims = Counter(task_id for r in reports for task_id in r["claimed"])
    assert set(claims) == set(ids)
    assert max(claims.values()) == 1  # every task claimed exactly once
    assert sum(1 for r in reports if r["claimed"]) >= 2  # it really was a race

    tasks = {t.id: t for t in store.list_tasks()}
    assert all(t.status is TaskStatus.COMPLETED for t in tasks.values())
    for task_id in ids:
        events = store.task_events(task_id)
        assert [e.type for e in events].count("task_claimed") == 1
        intervals = sorted((start, end) for _, start, end in lease_intervals(events))
        for (_, end), (start, _) in itertools.pairwise(intervals):
            assert end <= start, f"overlapping leases on {task_id}"
        assert tasks[task_id].result == events[-1].actor  # the claimer completed it
    store.close()


STALLER = r"""
import json, random, sys, time
from keel.core.errors import LeaseLost
from keel.store.sqlite.store import SQLiteStore

path, owner, start_at = sys.argv[1], sys.argv[2], float(sys.argv[3])
random.seed(owner)
store = SQLiteStore(path)
done, lost, errors = [], 0, []
while time.time() < start_at:
    time.sleep(0.002)
idle_since = None
while True:
    task = store.claim_task(owner=owner, lease_seconds=0.25)
    if task is None:
        idle_since = idle_since or time.time()
        if time.time() - idle_since > 1.0:  # longer than any lease: nothing left
            break
        time.sleep(0.02)
        continue
    idle_since = None
    if random.random() < 0.2:
        time.sleep(0.35)  # stall past the lease: someone else may take the task
    try:
        store.complete_task(task.id, owner=owner, token=task.lease_token)
        done.append(task.id)
    except LeaseLost:
        lost += 1
    except Exception as exc:
        errors.append(f"{type(exc).__name__}: {exc}")
store.close()
print(json.dumps({"done": done, "lost": lost, "errors": errors}))
"""


def test_stalled_holders_lose_their_tasks_and_leases_never_overlap(tmp_path: Path) -> None:
    path = tmp_path / "stall.db"
    store = SQLiteStore(path)
    ids = [store.create_task(f"t{i}", actor="planner").id for i in range(200)]
    start_at = time.time() + 1.0
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", STALLER, str(path), f"worker-{n}", str(start_at)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(4)
    ]
    reports = []
    for proc in procs:
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err
        reports.append(json.loads(out))
    assert [r["errors"] for r in reports] == [[]] * 4
    done = Counter(task_id for r in reports for task_id in r["done"])
    assert set(done) == set(ids) and max(done.values()) == 1  # each completed once
    reclaims = 0
    for task_id in ids:
        events = store.task_events(task_id)
        assert [e.type for e in events].count("task_completed") == 1
        reclaims += [e.type for e in events].count("task_reclaimed")
        intervals = sorted((start, end) for _, start, end in lease_intervals(events))
        for (_, end), (start, _) in itertools.pairwise(intervals):
            assert end <= start, f"overlapping leases on {task_id}"
    assert reclaims > 0  # stalls really let others take over
    assert reclaims >= sum(r["lost"] for r in reports)
    store.close()
