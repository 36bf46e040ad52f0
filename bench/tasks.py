"""Task-graph throughput on SQLite: full lifecycles per second and claim latency.

A lifecycle is create -> claim -> heartbeat -> complete, each its own transaction
with its event, the way a worker drives a task. For 1, 2, 4 and 8 processes on
one fresh database file, every process repeats lifecycles for ``--seconds``;
the claim takes the oldest ready task (so processes compete for the same rows).

    .venv/bin/python bench/tasks.py [--seconds 3] [--processes 1,2,4,8]

Prints one JSON object: per process count, lifecycles/s and claim p50/p99 in ms.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from keel.store.sqlite.store import SQLiteStore

LEASE_S = 30.0


def _worker(path: str, owner: str, seconds: float, ready: Any, go: Any, out: Any) -> None:
    store = SQLiteStore(path)
    claims: list[float] = []
    done = 0
    ready.put(owner)  # imported and opened: the clock starts only when all are
    go.wait()
    stop = time.monotonic() + seconds
    while time.monotonic() < stop:
        store.create_task(f"task by {owner}", actor=owner)
        t0 = time.perf_counter()
        task = store.claim_task(owner=owner, lease_seconds=LEASE_S)
        claims.append(time.perf_counter() - t0)
        if task is None:  # another process took the one we made; ours is theirs to finish
            continue
        token = task.lease_token
        assert token is not None
        store.heartbeat_task(task.id, owner=owner, token=token, lease_seconds=LEASE_S)
        store.complete_task(task.id, owner=owner, token=token, result="ok")
        done += 1
    store.close()
    out.put((done, claims))


def run(processes: int, seconds: float, folder: Path) -> dict[str, Any]:
    path = str(folder / f"bench-{processes}.db")
    SQLiteStore(path).close()  # migrate once before the clock starts
    ctx = mp.get_context("spawn")
    out, ready, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    procs = [
        ctx.Process(target=_worker, args=(path, f"bench-{i}", seconds, ready, go, out))
        for i in range(processes)
    ]
    for p in procs:
        p.start()
    for _ in procs:
        ready.get(timeout=120)
    go.set()
    results = [out.get(timeout=seconds + 60) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    done = sum(r[0] for r in results)
    claims = sorted(c for r in results for c in r[1])
    q = statistics.quantiles(claims, n=100) if len(claims) > 1 else claims * 99
    return {
        "processes": processes,
        "lifecycles": done,
        "lifecycles_per_s": round(done / seconds, 1),
        "claim_p50_ms": round(q[49] * 1000, 2),
        "claim_p99_ms": round(q[98] * 1000, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--processes", default="1,2,4,8")
    args = parser.parse_args()
    counts = [int(n) for n in args.processes.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        rows = [run(n, args.seconds, Path(tmp)) for n in counts]
    print(
        json.dumps(
            {
                "benchmark": "task lifecycles (create, claim, heartbeat, complete) on SQLite",
                "seconds_per_point": args.seconds,
                "results": rows,
                "target": ">= 300 lifecycles/s at 4 processes",
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
