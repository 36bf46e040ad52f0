"""``keel stats`` over a store of 10,000 runs; prints one JSON object.

The store is filled fast but faithfully: each run's events are made and folded by the
store's own code (``keel.store.step.first_event`` and ``fold_step``: numbered, checked
against the transition table, hash-chained, folded into the snapshot; the figures rows
by ``keel.store.stats.figure_rows``), then written in bulk, many runs per transaction
(SQLite: the store's own ``insert_run`` / ``insert_event`` / ``insert_figures``
statements, executemany; PostgreSQL: COPY). The rows are exactly what ``create_run`` +
``append_events`` would have written, one step per transaction; a sample of runs is
checked with ``Store.verify_log`` to show it.

A run is realistic: 6 to 14 steps (each a model request and response with tokens,
cost and latency, and a tool call started and finished or failed, with its latency),
three models, six tools, outputs of a few hundred bytes; ~70% complete after one or two
verifications (one or two verifier commands), the rest fail (budget, model error),
are blocked, cancelled or wait for an approval. Created over the last 90 days.

Timed, as the median of ``--repeat`` runs: ``Store.run_stats()`` in process (the store
call: all runs; ``--since`` the last 30 days; ``--model`` one of three; one run as
``keel show`` asks), and ``keel stats --json`` / ``keel stats`` (the table) / ``keel show
RUN --json`` as subprocesses, beside ``keel --help`` (the start-up every command pays:
importing keel). Target: <= 1 s for the stats of 10,000 runs.

What the figures cost an append (SQLite): a step (model turn, tool call: 4 events)
appended with ``append_events``, with its figures rows and with ``figure_rows``
switched off, in interleaved blocks on one store; medians of the blocks.

Usage: python bench/stats.py [--runs 10000] [--repeat 5] [--url postgresql://…]
(PostgreSQL too when ``--url`` or KEEL_TEST_POSTGRES_URL is given: a scratch database
is created and dropped.)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from keel.core.budget import Budget
from keel.core.chain import chain_time
from keel.core.events import Event, EventType, NewEvent
from keel.core.records import RunOptions
from keel.core.state import RunState
from keel.store.base import Store
from keel.store.sql import load_queries
from keel.store.sqlite import runs as sqlite_runs
from keel.store.sqlite.store import SQLiteStore
from keel.store.stats import FIGURE_COLUMNS, FigureRow, figure_rows
from keel.store.step import dump_json, first_event, fold_step, new_run_id

MODELS = ("deepseek:deepseek-chat", "openai:gpt-4o-mini", "openai:qwen2.5-coder-32b")
TOOLS = {  # name: (median seconds, spread, share of calls)
    "read_file": (0.004, 0.6, 30),
    "grep": (0.03, 0.8, 15),
    "list_dir": (0.003, 0.5, 10),
    "edit_file": (0.006, 0.5, 20),
    "write_file": (0.005, 0.5, 10),
    "run_command": (1.2, 1.0, 15),
}
VERIFIERS = ("pytest -q", "ruff check .")
TEXT = (
    "The function reads the configuration once and caches it; the failing test expects "
    "the cache to be cleared between calls, so the fix belongs in the fixture. "
)
OUTPUT = "def load(path):\n    with open(path) as f:\n        return parse(f.read())\n" * 6
BATCH = 500  # runs per transaction
FIGURE_NAMES = (  # event_figures' columns after run_id, in keel.store.stats.FigureRow order
    "seq",
    "item",
    "kind",
    "name",
    "ok",
    "elapsed_s",
    "input_tokens",
    "cached_input_tokens",
    "output_tokens",
    "reasoning_tokens",
    "cost",
)
assert len(FIGURE_NAMES) == len(FIGURE_COLUMNS)


def make_run(rng: random.Random, now: datetime) -> tuple[RunState, list[Event], list[str]]:
    """One run's events, folded by the store's own code: its final state, the stored
    events and their JSON texts (seq 1 first)."""
    run_id = new_run_id()
    created = now - timedelta(seconds=rng.uniform(0, 90 * 86400))
    spec = rng.choice(MODELS)
    verify = VERIFIERS[: rng.choice((1, 1, 2))]
    options = RunOptions(model=spec, verify=verify, budget=Budget(max_steps=14))
    data = {
        "goal": "make the failing test in tests/test_config.py pass",
        "workspace": "/srv/work/project",
        "parent_id": None,
        "task_id": None,
        "options": options.to_dict(),
        "status": "running",
    }
    text = dump_json(data)
    first = first_event(run_id, json.loads(text), text, now=created)
    state = RunState(run_id=run_id).apply(first)
    events = _story(rng, spec, verify)
    step = fold_step(state, events, now=created + timedelta(seconds=rng.uniform(20, 600)))
    return step.state, [first, *step.events], [text, *step.texts]


def _story(rng: random.Random, spec: str, verify: tuple[str, ...]) -> list[NewEvent]:
    model = spec.split(":", 1)[1]
    steps = rng.randint(6, 14)
    ending = rng.choices(
        ("completed", "budget", "model_error", "blocked", "cancelled", "waiting"),
        weights=(70, 10, 5, 5, 5, 5),
    )[0]
    out: list[NewEvent] = []
    for k in range(1, steps + 1):
        out += _tool_step(rng, model, k)
    if ending == "completed":
        retries = rng.random() < 0.2  # the first verification fails, one more step fixes it
        for attempt in range(2 if retries else 1):
            out += _final_turn(rng, model, steps + attempt + 1)
            out.append(_moved("running", "verifying", "final answer given"))
            passed = not (retries and attempt == 0)
            out.append(NewEvent(type=EventType.VERIFICATION_STARTED, data={"commands": verify}))
            out.append(_verification(rng, verify, passed))
            if passed:
                out.append(_moved("verifying", "completed", "verified"))
            else:
                out.append(_moved("verifying", "running", None))
    elif ending == "budget":
        out.append(NewEvent(type=EventType.BUDGET_EXHAUSTED, data={"dimension": "steps"}))
        out.append(_moved("running", "failed", "budget_exhausted:steps"))
    elif ending == "model_error":
        out.append(_moved("running", "failed", "model_error: 503 upstream unavailable"))
    elif ending == "blocked":
        reason = "policy forbids run_command: network access (rule: no-network)"
        out.append(_moved("running", "blocked", reason))
    elif ending == "cancelled":
        out.append(_moved("running", "cancelled", "not needed any more"))
    else:
        call = f"call_w{steps}"
        out.append(
            NewEvent(
                type=EventType.APPROVAL_REQUESTED,
                data={"call_id": call, "tool": "write_file", "arguments": {"path": "a.py"}},
            )
        )
        out.append(_moved("running", "waiting", f"approval:{call} write_file"))
    return out


def _turn(rng: random.Random, model: str, k: int, calls: list[dict[str, Any]]) -> NewEvent:
    tokens_in = rng.randint(1500, 12000)
    cached = rng.randint(0, tokens_in // 2)
    tokens_out = rng.randint(40, 600)
    return NewEvent(
        type=EventType.MODEL_RESPONDED,
        data={
            "step": k,
            "model": model,
            "content": TEXT[: rng.randint(40, len(TEXT))],
            "reasoning": None,
            "tool_calls": calls,
            "usage": {
                "input_tokens": tokens_in,
                "output_tokens": tokens_out,
                "cached_input_tokens": cached,
                "reasoning_tokens": rng.randint(0, tokens_out // 2),
            },
            "cost": round(tokens_in * 2.7e-7 + tokens_out * 1.1e-6, 8),
            "finish_reason": "tool_calls" if calls else "stop",
            "elapsed_s": round(rng.lognormvariate(0.3, 0.6), 4),
        },
    )


def _tool_step(rng: random.Random, model: str, k: int) -> list[NewEvent]:
    tool = rng.choices(list(TOOLS), weights=[w for _, _, w in TOOLS.values()])[0]
    median, spread, _ = TOOLS[tool]
    call = f"call_{k}"
    args = {"path": f"src/pkg/module_{rng.randint(0, 40)}.py"}
    started = NewEvent(type=EventType.MODEL_REQUESTED, data={"step": k, "messages": 2 * k})
    elapsed = round(median * rng.lognormvariate(0, spread), 5)
    common = {"call_id": call, "tool": tool, "arguments": args, "changed_files": {}}
    if rng.random() < 0.05:
        ended = NewEvent(
            type=EventType.TOOL_FAILED,
            data={
                **common,
                "error_kind": "tool_error",
                "message": "no such file",
                "grant": None,
                "elapsed_s": elapsed,
            },
        )
    else:
        output = OUTPUT[: rng.randint(100, len(OUTPUT))]
        ended = NewEvent(
            type=EventType.TOOL_FINISHED,
            data={**common, "output": output, "grant": None, "elapsed_s": elapsed},
        )
    return [
        started,
        _turn(rng, model, k, [{"id": call, "name": tool, "arguments": args}]),
        NewEvent(
            type=EventType.TOOL_STARTED,
            data={
                "call_id": call,
                "key": f"{call}-key",
                "tool": tool,
                "arguments": args,
                "effect": "read",
                "recovery": "rerun",
                "intent": {},
                "grant": None,
            },
        ),
        ended,
    ]


def _final_turn(rng: random.Random, model: str, k: int) -> list[NewEvent]:
    requested = NewEvent(type=EventType.MODEL_REQUESTED, data={"step": k, "messages": 2 * k})
    return [requested, _turn(rng, model, k, [])]


def _moved(frm: str, to: str, reason: str | None) -> NewEvent:
    return NewEvent(type=EventType.STATUS_CHANGED, data={"from": frm, "to": to, "reason": reason})


def _verification(rng: random.Random, verify: tuple[str, ...], passed: bool) -> NewEvent:
    records = [
        {
            "command": command,
            "exit_code": 0 if passed else 1,
            "duration_s": round(rng.uniform(0.5, 20), 3),
            "artifact": None,
            "mutation_revision": 1,
            "file_hashes": {},
            "passed": passed or i > 0,
        }
        for i, command in enumerate(verify)
    ]
    kind = EventType.VERIFICATION_PASSED if passed else EventType.VERIFICATION_FAILED
    return NewEvent(type=kind, data={"records": records, "elapsed_s": 3.0})


def _run_row(state: RunState, created: datetime) -> tuple[Any, ...]:
    return (
        state.run_id,
        None,
        None,
        state.status.value,
        state.goal,
        state.workspace,
        None,
        dump_json(state.to_dict()),
        state.last_seq,
        state.last_hash,
        chain_time(created),
        state.updated_at or chain_time(created),
        None,
    )


def runs_made(count: int, seed: int) -> Iterator[tuple[RunState, list[Event], list[str]]]:
    rng = random.Random(seed)
    now = datetime.now(UTC)
    for _ in range(count):
        yield make_run(rng, now)


def fill_sqlite(path: Path, count: int, seed: int) -> dict[str, Any]:
    """Fill a new SQLite store with the store's own insert statements, BATCH runs per
    transaction; returns the counts and the time taken."""
    SQLiteStore(path).close()  # the schema, migrated as the store makes it
    q = load_queries("keel.store.sqlite", "runs.sql")
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=OFF")
    start = time.perf_counter()
    events = 0
    runs: list[tuple[Any, ...]] = []
    rows: list[tuple[Any, ...]] = []
    figures: list[FigureRow] = []

    def flush() -> None:
        conn.execute("BEGIN")
        conn.executemany(q["insert_run"], runs)
        conn.executemany(q["insert_event"], rows)
        conn.executemany(q["insert_figures"], figures)
        conn.execute("COMMIT")
        runs.clear()
        rows.clear()
        figures.clear()

    for state, stored, texts in runs_made(count, seed):
        runs.append(_run_row(state, stored[0].recorded_at))
        for e, text in zip(stored, texts, strict=True):
            rows.append(
                (e.run_id, e.seq, e.event_id, e.type.value, chain_time(e.recorded_at), text, e.hash)
            )
        figures += figure_rows(stored, state.options)
        events += len(stored)
        if len(runs) >= BATCH:
            flush()
    if runs:
        flush()
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return {"runs": count, "events": events, "fill_s": round(time.perf_counter() - start, 1)}


def fill_postgres(url: str, count: int, seed: int) -> dict[str, Any]:
    """Fill a PostgreSQL store with COPY, BATCH runs per transaction."""
    import psycopg  # noqa: PLC0415 - only when PostgreSQL is benchmarked

    from keel.store.postgres.store import PostgresStore  # noqa: PLC0415

    PostgresStore(url).close()
    start = time.perf_counter()
    events = 0
    batch: list[tuple[RunState, list[Event], list[str]]] = []
    with psycopg.connect(url) as conn:

        def flush() -> None:
            with conn.transaction(), conn.cursor() as cur:
                with cur.copy(
                    "COPY runs (id, parent_id, task_id, status, goal, workspace, "
                    "idempotency_key, snapshot, last_seq, last_hash, created_at, updated_at, "
                    "creator) FROM STDIN"
                ) as copy:
                    for state, stored, _ in batch:
                        copy.write_row(_run_row(state, stored[0].recorded_at))
                with cur.copy(
                    f"COPY event_figures (run_id, {', '.join(FIGURE_NAMES)}) FROM STDIN"
                ) as copy:
                    for state, stored, _ in batch:
                        for row in figure_rows(stored, state.options):
                            copy.write_row(row)
                with cur.copy(
                    "COPY events (run_id, seq, event_id, type, recorded_at, data, hash) FROM STDIN"
                ) as copy:
                    for _, stored, texts in batch:
                        for e, text in zip(stored, texts, strict=True):
                            copy.write_row(
                                (
                                    e.run_id,
                                    e.seq,
                                    e.event_id,
                                    e.type.value,
                                    chain_time(e.recorded_at),
                                    text,
                                    e.hash,
                                )
                            )
            batch.clear()

        for made in runs_made(count, seed):
            batch.append(made)
            events += len(made[1])
            if len(batch) >= BATCH:
                flush()
        if batch:
            flush()
        conn.execute("ANALYZE")
    return {"runs": count, "events": events, "fill_s": round(time.perf_counter() - start, 1)}


def median_s(action: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        action()
        times.append(time.perf_counter() - t0)
    return round(statistics.median(times), 4)


def keel_cli(*args: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "keel.cli.app", *args], check=False, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise SystemExit(f"keel {' '.join(args)} failed: {done.stderr}")


def timings(store: Store, repeat: int) -> dict[str, Any]:
    """The store calls and the commands, median seconds of ``repeat`` each."""
    figures = store.run_stats()
    one = store.list_runs(limit=1)[0].run_id
    month = datetime.now(UTC) - timedelta(days=30)
    checked = [
        store.verify_log(run_id) for run_id in store.run_ids()[:: max(1, figures.runs // 20)]
    ]
    assert all(check.intact for check in checked), "a bulk-written log does not check out"
    return {
        "runs": figures.runs,
        "steps": figures.steps,
        "tool_calls": figures.tool_calls,
        "logs_verified": len(checked),
        "store_stats_s": median_s(store.run_stats, repeat),
        "store_stats_since_30d_s": median_s(lambda: store.run_stats(since=month), repeat),
        "store_stats_one_model_s": median_s(lambda: store.run_stats(model=MODELS[0]), repeat),
        "store_stats_one_run_s": median_s(lambda: store.run_stats(run_id=one), repeat),
        "cli_stats_s": median_s(lambda: keel_cli("stats", "--json", "--store", store.url), repeat),
        "cli_stats_table_s": median_s(lambda: keel_cli("stats", "--store", store.url), repeat),
        "cli_startup_s": median_s(lambda: keel_cli("--help"), repeat),
        "cli_show_s": median_s(
            lambda: keel_cli("show", one, "--json", "--store", store.url), repeat
        ),
        "by_status": {k.value: v for k, v in figures.by_status.items() if v},
    }


def append_cost(folder: Path, blocks: int = 10, steps: int = 300) -> dict[str, Any]:
    """Per-step append on SQLite with the figures rows and with ``figure_rows`` switched
    off (interleaved blocks of ``steps`` on one store), microseconds."""
    rng = random.Random(7)
    made = [_tool_step(rng, "m", k) for k in range(64)]
    store = SQLiteStore(folder / "append-cost.db")
    state = store.create_run(goal="bench", workspace="/tmp", options=RunOptions(model="x:y"))
    real = sqlite_runs.figure_rows
    per_step: dict[bool, list[float]] = {True: [], False: []}
    try:
        for block in range(2 * blocks):
            on = block % 2 == 0
            sqlite_runs.figure_rows = real if on else (lambda _events, _options: [])
            t0 = time.perf_counter()
            for i in range(steps):
                state, _ = store.append_events(
                    state.run_id, made[i % 64], expected_seq=state.last_seq
                )
            per_step[on].append((time.perf_counter() - t0) / steps * 1e6)
    finally:
        sqlite_runs.figure_rows = real
        store.close()
    with_rows, without = (statistics.median(per_step[k]) for k in (True, False))
    return {
        "step_us_with_figures": round(with_rows, 1),
        "step_us_without": round(without, 1),
        "figures_us_per_step": round(with_rows - without, 1),
    }


@contextmanager
def scratch_postgres(admin_url: str) -> Iterator[str]:
    import psycopg  # noqa: PLC0415

    name = "keel_bench_" + uuid.uuid4().hex[:10]
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield urlunsplit(urlsplit(admin_url)._replace(path="/" + name))
    finally:
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--seed", type=int, default=16)
    parser.add_argument("--url", default=os.environ.get("KEEL_TEST_POSTGRES_URL"))
    parser.add_argument("--dir", type=Path, default=None, help="keep the SQLite file here")
    args = parser.parse_args()
    result: dict[str, Any] = {
        "python": platform.python_version(),
        "sqlite_version": sqlite3.sqlite_version,
        "cpus": os.cpu_count(),
        "target_s": 1.0,
    }
    with tempfile.TemporaryDirectory() as scratch:
        folder = args.dir or Path(scratch)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / "stats-bench.db"
        path.unlink(missing_ok=True)
        filled = fill_sqlite(path, args.runs, args.seed)
        filled["file_mb"] = round(path.stat().st_size / 1e6, 1)
        with SQLiteStore(path) as store:
            result["sqlite"] = {**filled, **timings(store, args.repeat)}
        result["sqlite"]["append"] = append_cost(folder)
    if args.url:
        from keel.store.postgres.store import PostgresStore  # noqa: PLC0415

        with scratch_postgres(args.url) as url:
            filled = fill_postgres(url, args.runs, args.seed)
            with PostgresStore(url) as store:
                result["postgres"] = {**filled, **timings(store, args.repeat)}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
