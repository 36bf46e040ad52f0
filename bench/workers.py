"""Many worker processes on one store: Keel on PostgreSQL and SQLite, procrastinate, pgqueuer.

Measures, in one run on one PostgreSQL server:

1. full task lifecycles per second (create -> claim -> heartbeat -> complete, each a
   store call with its event, the way a worker drives a task) with 1, 4 and 16
   processes, on PostgreSQL and on SQLite;
2. enqueue-to-claim latency p50/p99 (database clock: the claim event's time minus
   the task's creation time) with idle workers woken by NOTIFY, and polling only;
3. ``--jobs`` (5,000) no-op jobs drained by 4 processes claiming one at a time:
   Keel (claim, heartbeat, complete), procrastinate and pgqueuer;
4. 16 processes over ``--exactly-once`` (10,000) tasks: every task completed exactly
   once and no two leases of a task overlapping (the test suite runs 2,000).

    .venv/bin/python bench/workers.py [--seconds 4] [--processes 1,4,16] [--jobs 5000]
        [--exactly-once 10000] [--synchronous-commit on]
        [--url postgresql://postgres@127.0.0.1:5432/postgres]

Prints one JSON object. Each measurement runs in its own scratch database.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import pairwise
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg

from keel.store.url import open_store

LEASE_S = 30.0
Ctx = mp.get_context("spawn")


@contextmanager
def scratch(admin_url: str) -> Iterator[str]:
    name = "keel_bench_" + uuid.uuid4().hex[:10]
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield urlunsplit(urlsplit(admin_url)._replace(path="/" + name))
    finally:
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def progress(label: str, result: Any) -> Any:
    """Say each figure on stderr as it is measured (the JSON comes at the end)."""
    print(f"{label}: {json.dumps(result)}", file=sys.stderr, flush=True)
    return result


def with_query(url: str, query: str) -> str:
    return url + ("&" if "?" in url else "?") + query if query else url


def _start_together(procs: list[Any], ready: Any, go: Any) -> None:
    for p in procs:
        p.start()
    for _ in procs:
        ready.get(timeout=300)
    go.set()


def _quantiles(values: list[float]) -> tuple[float, float]:
    values = sorted(values)
    if len(values) < 2:
        return (values[0], values[0]) if values else (float("nan"), float("nan"))
    q = statistics.quantiles(values, n=100)
    return q[49], q[98]


# --- 1. full lifecycles ----------------------------------------------------------------


def _lifecycles(url: str, owner: str, seconds: float, ready: Any, go: Any, out: Any) -> None:
    store = open_store(url)
    ready.put(owner)
    go.wait()
    done = 0
    stop = time.monotonic() + seconds
    while time.monotonic() < stop:
        store.create_task(f"task by {owner}", actor=owner)
        task = store.claim_task(owner=owner, lease_seconds=LEASE_S)
        if task is None:  # another process took ours; it finishes it
            continue
        token = task.lease_token
        assert token is not None
        store.heartbeat_task(task.id, owner=owner, token=token, lease_seconds=LEASE_S)
        store.complete_task(task.id, owner=owner, token=token, result="ok")
        done += 1
    store.close()
    out.put(done)


def lifecycles(url: str, processes: int, seconds: float) -> dict[str, Any]:
    open_store(url).close()  # migrate before the clock starts
    ready, go, out = Ctx.Queue(), Ctx.Event(), Ctx.Queue()
    procs = [
        Ctx.Process(target=_lifecycles, args=(url, f"w{i}", seconds, ready, go, out))
        for i in range(processes)
    ]
    _start_together(procs, ready, go)
    done = sum(out.get(timeout=seconds + 120) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    return {"processes": processes, "lifecycles": done, "per_s": round(done / seconds, 1)}


# --- 2. enqueue-to-claim latency -------------------------------------------------------


def _waiting_worker(url: str, owner: str, mode: str, poll: float, ready: Any, stop: Any) -> None:
    store = open_store(url)
    if mode == "notify":
        store.wait_for_work(0.5)  # start the listener before the clock
    ready.put(owner)
    while not stop.is_set():
        task = store.claim_task(owner=owner, lease_seconds=LEASE_S)
        if task is not None:
            assert task.lease_token is not None
            store.complete_task(task.id, owner=owner, token=task.lease_token)
            continue
        if mode == "notify":
            store.wait_for_work(poll)
        else:
            time.sleep(poll)
    store.close()


def latency(url: str, mode: str, *, tasks: int, workers: int, poll: float) -> dict[str, Any]:
    store = open_store(url)
    ready, stop = Ctx.Queue(), Ctx.Event()
    procs = [
        Ctx.Process(target=_waiting_worker, args=(url, f"w{i}", mode, poll, ready, stop))
        for i in range(workers)
    ]
    for p in procs:
        p.start()
    for _ in procs:
        ready.get(timeout=300)
    time.sleep(0.5)
    ids = []
    for i in range(tasks):
        ids.append(store.create_task(f"latency {i}", actor="bench").id)
        time.sleep(0.02 + (i % 7) * 0.005)  # arrivals spread out, workers idle between
    deadline = time.monotonic() + 60
    while store.list_tasks(status=None) and time.monotonic() < deadline:
        if all(t.status.value == "completed" for t in store.list_tasks()):
            break
        time.sleep(0.1)
    stop.set()
    for p in procs:
        p.join(timeout=30)
    waits = []
    for task_id in ids:
        events = store.task_events(task_id)
        claim = next(e for e in events if e.type == "task_claimed")
        waits.append((claim.recorded_at - events[0].recorded_at).total_seconds() * 1000)
    store.close()
    p50, p99 = _quantiles(waits)
    return {
        "wake": mode,
        "idle_workers": workers,
        "poll_s": poll,
        "tasks": tasks,
        "p50_ms": round(p50, 2),
        "p99_ms": round(p99, 2),
    }


# --- 3. the same jobs, three queues ----------------------------------------------------


def _keel_drain(url: str, owner: str, ready: Any, go: Any, out: Any) -> None:
    store = open_store(url)
    ready.put(owner)
    go.wait()
    done = 0
    while (task := store.claim_task(owner=owner, lease_seconds=LEASE_S)) is not None:
        token = task.lease_token
        assert token is not None
        store.heartbeat_task(task.id, owner=owner, token=token, lease_seconds=LEASE_S)
        store.complete_task(task.id, owner=owner, token=token, result="ok")
        done += 1
    store.close()
    out.put((done, time.time()))


def keel_jobs(url: str, jobs: int, processes: int) -> dict[str, Any]:
    store = open_store(url)
    for i in range(jobs):
        store.create_task(f"job {i}", actor="bench")
    store.close()
    ready, go, out = Ctx.Queue(), Ctx.Event(), Ctx.Queue()
    procs = [
        Ctx.Process(target=_keel_drain, args=(url, f"w{i}", ready, go, out))
        for i in range(processes)
    ]
    _start_together(procs, ready, go)
    started = time.time()
    results = [out.get(timeout=600) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    elapsed = max(r[1] for r in results) - started
    done = sum(r[0] for r in results)
    return {"queue": "keel", "jobs": done, "per_s": round(done / elapsed, 1)}


def _procrastinate_app(url: str) -> Any:
    import procrastinate  # noqa: PLC0415 - the bench extra

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=url))

    @app.task(name="noop", queue="bench")
    def noop(i: int) -> None:
        return None

    return app


def _procrastinate_worker(url: str, ready: Any, go: Any, out: Any) -> None:
    app = _procrastinate_app(url)

    async def work() -> None:
        async with app.open_async():
            ready.put("procrastinate")
            await asyncio.get_running_loop().run_in_executor(None, go.wait)
            await app.run_worker_async(
                queues=["bench"], concurrency=1, wait=False, install_signal_handlers=False
            )

    asyncio.run(work())
    out.put(time.time())


def procrastinate_jobs(url: str, jobs: int, processes: int) -> dict[str, Any]:
    app = _procrastinate_app(url)
    with app.open():
        app.schema_manager.apply_schema()
        noop = app.tasks["noop"]
        for start in range(0, jobs, 500):
            noop.batch_defer(*({"i": i} for i in range(start, min(start + 500, jobs))))
    ready, go, out = Ctx.Queue(), Ctx.Event(), Ctx.Queue()
    procs = [
        Ctx.Process(target=_procrastinate_worker, args=(url, ready, go, out))
        for _ in range(processes)
    ]
    _start_together(procs, ready, go)
    started = time.time()
    ends = [out.get(timeout=600) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'"
        ).fetchone()
    done = int(row[0]) if row else 0
    return {"queue": "procrastinate", "jobs": done, "per_s": round(done / (max(ends) - started), 1)}


def _pgqueuer_worker(url: str, ready: Any, go: Any, out: Any) -> None:
    from pgqueuer import QueueManager  # noqa: PLC0415 - the bench extra
    from pgqueuer.db import PsycopgDriver  # noqa: PLC0415
    from pgqueuer.queries import Queries  # noqa: PLC0415
    from pgqueuer.types import QueueExecutionMode  # noqa: PLC0415

    async def work() -> None:
        conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
        qm = QueueManager(Queries(PsycopgDriver(conn)))

        @qm.entrypoint("noop")
        async def noop(job: Any) -> None:
            return None

        ready.put("pgqueuer")
        await asyncio.get_running_loop().run_in_executor(None, go.wait)
        await qm.run(batch_size=1, mode=QueueExecutionMode.drain)
        await conn.close()

    asyncio.run(work())
    out.put(time.time())


def pgqueuer_jobs(url: str, jobs: int, processes: int) -> dict[str, Any]:
    from pgqueuer.db import PsycopgDriver  # noqa: PLC0415 - the bench extra
    from pgqueuer.queries import Queries  # noqa: PLC0415

    async def setup() -> None:
        conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
        queries = Queries(PsycopgDriver(conn))
        await queries.install()
        for start in range(0, jobs, 500):
            n = min(500, jobs - start)
            await queries.enqueue(["noop"] * n, [None] * n, [0] * n)
        await conn.close()

    asyncio.run(setup())
    ready, go, out = Ctx.Queue(), Ctx.Event(), Ctx.Queue()
    procs = [
        Ctx.Process(target=_pgqueuer_worker, args=(url, ready, go, out)) for _ in range(processes)
    ]
    _start_together(procs, ready, go)
    started = time.time()
    ends = [out.get(timeout=600) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pgqueuer_log WHERE status = 'successful'"
        ).fetchone()
    done = int(row[0]) if row else 0
    return {"queue": "pgqueuer", "jobs": done, "per_s": round(done / (max(ends) - started), 1)}


# --- 4. the full size: 16 processes, 10,000 tasks, each completed once ----------


def exactly_once(url: str, tasks: int, processes: int) -> dict[str, Any]:
    """Drain ``tasks`` with ``processes`` workers, then check every history: one
    completion per task and no two leases of a task overlapping in time."""
    from keel.testing.tasks import lease_intervals  # noqa: PLC0415 - only this check

    drained = keel_jobs(url, tasks, processes)
    store = open_store(url)
    completions = overlaps = 0
    for task in store.list_tasks():
        events = store.task_events(task.id)
        completions += sum(e.type == "task_completed" for e in events)
        leases = lease_intervals(events)
        overlaps += sum(a[2] > b[1] for a, b in pairwise(leases))
    store.close()
    return {
        "tasks": tasks,
        "processes": processes,
        "per_s": drained["per_s"],
        "completions": completions,
        "each_completed_once": completions == tasks == drained["jobs"],
        "overlapping_leases": overlaps,
    }


# --- main ------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--processes", default="1,4,16")
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--latency-tasks", type=int, default=200)
    parser.add_argument("--exactly-once", type=int, default=10_000, help="0 skips it")
    parser.add_argument("--poll", type=float, default=0.5)
    parser.add_argument("--synchronous-commit", default="on", choices=["on", "off"])
    parser.add_argument(
        "--url",
        default=os.environ.get(
            "KEEL_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
        ),
    )
    args = parser.parse_args()
    counts = [int(n) for n in args.processes.split(",")]
    keel_query = "" if args.synchronous_commit == "on" else "synchronous_commit=off"
    report: dict[str, Any] = {
        "benchmark": "Keel workers on PostgreSQL and SQLite vs procrastinate and pgqueuer",
        "cpus": os.cpu_count(),
        "load_average_at_start": os.getloadavg(),
        "keel_postgres_synchronous_commit": args.synchronous_commit,
        "seconds_per_point": args.seconds,
    }
    rows: dict[str, list[dict[str, Any]]] = {"postgres": [], "sqlite": []}
    for n in counts:
        with scratch(args.url) as url:
            result = lifecycles(with_query(url, keel_query), n, args.seconds)
            rows["postgres"].append(progress("postgres lifecycles", result))
        with tempfile.TemporaryDirectory() as tmp:
            result = lifecycles(f"sqlite:///{Path(tmp) / 'b.db'}", n, args.seconds)
            rows["sqlite"].append(progress("sqlite lifecycles", result))
    report["lifecycles_per_s"] = rows
    report["enqueue_to_claim"] = []
    for mode in ("notify", "poll"):
        with scratch(args.url) as url:
            result = latency(
                with_query(url, keel_query),
                mode,
                tasks=args.latency_tasks,
                workers=4,
                poll=args.poll,
            )
            report["enqueue_to_claim"].append(progress("latency", result))
    same: list[dict[str, Any]] = []
    with scratch(args.url) as url:
        same.append(progress("same jobs", keel_jobs(with_query(url, keel_query), args.jobs, 4)))
    with scratch(args.url) as url:
        same.append(progress("same jobs", procrastinate_jobs(url, args.jobs, 4)))
    with scratch(args.url) as url:
        same.append(progress("same jobs", pgqueuer_jobs(url, args.jobs, 4)))
    report["same_jobs_4_processes"] = same
    if args.exactly_once:
        with scratch(args.url) as url:
            result = exactly_once(with_query(url, keel_query), args.exactly_once, 16)
            report["exactly_once_16_processes"] = progress("exactly once", result)
    keel4 = next((r["per_s"] for r in rows["postgres"] if r["processes"] == 4), None)
    by_queue = {r["queue"]: r["per_s"] for r in same}
    notify = report["enqueue_to_claim"][0]
    report["targets"] = {
        "keel_lifecycles_4_vs_pgqueuer": [keel4, by_queue["pgqueuer"]],
        "keel_lifecycles_4_vs_1.5x_procrastinate": [keel4, 1.5 * by_queue["procrastinate"]],
        "met_vs_pgqueuer": keel4 is not None and keel4 >= by_queue["pgqueuer"],
        "met_vs_procrastinate": keel4 is not None and keel4 >= 1.5 * by_queue["procrastinate"],
        "notify_p99_ms": notify["p99_ms"],
        "met_notify_p99_le_50ms": notify["p99_ms"] <= 50,
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
