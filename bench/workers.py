"""Many worker processes on one store: Keel on PostgreSQL and SQLite, procrastinate, pgqueuer.

Measures, in one run on one PostgreSQL server:

1. full Keel task lifecycles per second (create -> claim -> complete, each a store call
   with its event) with 1, 4 and 16 processes, on PostgreSQL and on SQLite — Keel
   alone: the peers are not measured this way, so no ratio is printed for it;
2. enqueue-to-claim latency p50/p99 (database clock: the claim event's time minus
   the task's creation time) with idle workers woken by NOTIFY, and polling only;
3. like for like: ``--jobs`` (5,000) no-op jobs, created before the clock starts,
   drained by 4 processes claiming one at a time — Keel (claim, complete), procrastinate
   (fetch, finish; concurrency 1) and pgqueuer (dequeue, log; batch size 1, so each
   completion is logged on its own). Every queue gets the same untimed warm-up drain
   and ``--repeat`` timed drains, alternated round by round (who goes first rotating),
   each in its own scratch database. ``per_s``: completions per second between the
   first and the last completion by the database clock (each queue's own record of
   when a job finished), so each worker's start-up and exit count for none; also
   ``wall_per_s``, from go to the last worker's exit. Median and best of each, and
   Keel's ratio to each peer (``per_s``);
4. 16 processes over ``--exactly-once`` (10,000) tasks: every task completed exactly
   once and no two leases of a task overlapping (the test suite runs 2,000).

Durability: one ``synchronous_commit`` for all three, on every PostgreSQL measurement:
``server`` (the default) is what the server has; ``on`` or ``off`` override it. It is
set on each scratch database (``ALTER DATABASE ... SET``: procrastinate's and pgqueuer's
connections take it) and passed to Keel as ``?synchronous_commit=`` (Keel sets the
session value itself, ``on`` unless told), then read back and reported. Keel on SQLite
runs WAL with synchronous=NORMAL (its default).

    .venv/bin/python bench/workers.py [--seconds 4] [--processes 1,4,16] [--jobs 5000]
        [--repeat 3] [--exactly-once 10000] [--synchronous-commit server|on|off]
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
from _common import ratio, rotated, summary

from keel.store.url import open_store

LEASE_S = 30.0
RATES = ("per_s", "wall_per_s")  # see drained()
WARMUP_JOBS = 200  # the untimed drain every queue gets before the timed ones
Ctx = mp.get_context("spawn")
SYNCHRONOUS_COMMIT = {"value": "on"}  # main() sets it: every scratch database gets it


@contextmanager
def scratch(admin_url: str) -> Iterator[str]:
    name = "keel_bench_" + uuid.uuid4().hex[:10]
    mode = SYNCHRONOUS_COMMIT["value"]
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
        admin.execute(f'ALTER DATABASE "{name}" SET synchronous_commit = {mode}')
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


def keel_url(url: str) -> str:
    """The scratch database's URL for Keel, with the same synchronous_commit as the peers."""
    return with_query(url, f"synchronous_commit={SYNCHRONOUS_COMMIT['value']}")


def synchronous_commit_of(url: str, *, keel: bool = False) -> str:
    """What a new session on ``url`` gets: a plain one (the peers'), or one opened with
    Keel's session settings for ``keel_url(url)``."""
    from keel.store.postgres.connection import connect  # noqa: PLC0415 - PostgreSQL only

    with connect(keel_url(url)) if keel else psycopg.connect(url) as conn:
        row = conn.execute("SHOW synchronous_commit").fetchone()
    return str(row[0]) if row else "?"


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


# --- 1. full lifecycles (Keel alone) -----------------------------------------------------


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
    assert sum(r[0] for r in results) == jobs
    return drained("keel", url, KEEL_COMPLETIONS, elapsed)


# Each queue's completions with the database's time of each (its transaction's now()).
KEEL_COMPLETIONS = (
    "SELECT count(*), min(recorded_at), max(recorded_at) FROM task_events"
    " WHERE type = 'task_completed'"
)
PROCRASTINATE_COMPLETIONS = (
    "SELECT count(*), min(at), max(at) FROM procrastinate_events WHERE type = 'succeeded'"
)
PGQUEUER_COMPLETIONS = (
    "SELECT count(*), min(created), max(created) FROM pgqueuer_log WHERE status = 'successful'"
)


def drained(queue: str, url: str, completions: str, elapsed: float) -> dict[str, Any]:
    """A drain's figures: the completions the database holds; ``per_s``, their rate
    between the first and the last completion by the database clock (each worker's
    start and exit left out alike); ``wall_per_s``, from go to the last worker's exit."""
    from keel.store.postgres.connection import connect  # noqa: PLC0415 - PostgreSQL only

    with connect(url) as conn:  # Keel's session settings taken out of its URL
        row = conn.execute(completions).fetchone()
    assert row is not None
    done, first, last = int(row[0]), row[1], row[2]
    span = (last - first).total_seconds() if done > 1 else 0.0
    return {
        "queue": queue,
        "jobs": done,
        "per_s": round((done - 1) / span, 1) if span else float("nan"),
        "wall_per_s": round(done / elapsed, 1),
    }


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
    return drained("procrastinate", url, PROCRASTINATE_COMPLETIONS, max(ends) - started)


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
    return drained("pgqueuer", url, PGQUEUER_COMPLETIONS, max(ends) - started)


def same_jobs(admin_url: str, jobs: int, processes: int, repeat: int) -> dict[str, Any]:
    """Each queue drains pre-filled jobs: one warm-up, then ``repeat`` rounds alternated."""
    queues = {
        "keel": lambda url, n: keel_jobs(keel_url(url), n, processes),
        "procrastinate": lambda url, n: procrastinate_jobs(url, n, processes),
        "pgqueuer": lambda url, n: pgqueuer_jobs(url, n, processes),
    }
    names = list(queues)
    for name in names:  # the same untimed warm-up drain for every queue
        with scratch(admin_url) as url:
            queues[name](url, min(WARMUP_JOBS, jobs))
    rates: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    for i in range(repeat):
        for name in rotated(names, i):
            with scratch(admin_url) as url:
                result = progress("same jobs", queues[name](url, jobs))
            assert result["jobs"] == jobs, result
            rates[name].append(result)
    out: dict[str, Any] = {
        "jobs": jobs,
        "processes": processes,
        "repetitions": repeat,
        "per_job": {
            "keel": "claim_task, complete_task (each its own transaction and event)",
            "procrastinate": "fetch_job, finish_job (worker concurrency 1)",
            "pgqueuer": "dequeue, completion log (batch_size 1: flushed per job)",
        },
    }
    for name in names:  # best: the highest rate
        out[name] = {k: summary([r[k] for r in rates[name]], 1, best=max) for k in RATES}
    keel = out["keel"]["per_s"]
    out["keel_over"] = {
        name: {
            "median": ratio(keel["median"], out[name]["per_s"]["median"]),
            "best": ratio(keel["best"], out[name]["per_s"]["best"]),
        }
        for name in names[1:]
    }
    return out


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
    parser.add_argument("--repeat", type=int, default=3, help="timed drains per queue")
    parser.add_argument(
        "--synchronous-commit",
        default="server",
        choices=["server", "on", "off"],
        help="for all three queues (server: what the server has)",
    )
    parser.add_argument(
        "--url",
        default=os.environ.get(
            "KEEL_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
        ),
    )
    args = parser.parse_args()
    counts = [int(n) for n in args.processes.split(",")]
    mode = args.synchronous_commit
    SYNCHRONOUS_COMMIT["value"] = synchronous_commit_of(args.url) if mode == "server" else mode
    with scratch(args.url) as url:
        applied = {
            "peers": synchronous_commit_of(url),
            "keel": synchronous_commit_of(url, keel=True),
        }
    report: dict[str, Any] = {
        "benchmark": "Keel workers on PostgreSQL and SQLite vs procrastinate and pgqueuer",
        "cpus": os.cpu_count(),
        "load_average_at_start": os.getloadavg(),
        "durability": {
            "postgres_synchronous_commit": {"asked": mode, "applied": applied},
            "keel_sqlite": "WAL, synchronous=NORMAL",
        },
        "seconds_per_point": args.seconds,
    }
    rows: dict[str, list[dict[str, Any]]] = {"postgres": [], "sqlite": []}
    for n in counts:
        with scratch(args.url) as url:
            result = lifecycles(keel_url(url), n, args.seconds)
            rows["postgres"].append(progress("postgres lifecycles", result))
        with tempfile.TemporaryDirectory() as tmp:
            result = lifecycles(f"sqlite:///{Path(tmp) / 'b.db'}", n, args.seconds)
            rows["sqlite"].append(progress("sqlite lifecycles", result))
    report["keel_lifecycles_per_s"] = rows
    report["enqueue_to_claim"] = []
    for wake in ("notify", "poll"):
        with scratch(args.url) as url:
            result = latency(
                keel_url(url), wake, tasks=args.latency_tasks, workers=4, poll=args.poll
            )
            report["enqueue_to_claim"].append(progress("latency", result))
    report["same_jobs_4_processes"] = same_jobs(args.url, args.jobs, 4, args.repeat)
    if args.exactly_once:
        with scratch(args.url) as url:
            result = exactly_once(keel_url(url), args.exactly_once, 16)
            report["exactly_once_16_processes"] = progress("exactly once", result)
    same = report["same_jobs_4_processes"]
    keel, pgq, proc = (same[q]["per_s"]["median"] for q in ("keel", "pgqueuer", "procrastinate"))
    notify = report["enqueue_to_claim"][0]
    report["targets"] = {
        "keel_drain_4_vs_pgqueuer_median": [keel, pgq],
        "keel_drain_4_vs_1.5x_procrastinate_median": [keel, round(1.5 * proc, 1)],
        "met_vs_pgqueuer": keel >= pgq,
        "met_vs_procrastinate": keel >= 1.5 * proc,
        "notify_p99_ms": notify["p99_ms"],
        "met_notify_p99_le_50ms": notify["p99_ms"] <= 50,
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
