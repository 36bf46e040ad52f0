"""Benchmark of the SQLite run store; prints one JSON object.

- durable step append: one step = 3 events of ~300 bytes (model response, tool
  start, tool finish) in one transaction, for runs of 1k, 10k and 100k steps;
  mean per-step cost overall and over the last 1,000 steps, and the flatness ratio
  (per-step cost at the largest size / at the smallest);
- load time of runs with 10k and 100k events: ``load_run`` from a cold store
  (snapshot read) and a full rebuild (read every event and fold them);
- bytes per event on disk (after a checkpoint) and peak memory (max RSS);
- the tamper-evident log's cost: per-step append with the hash chain against the
  same appends with the chain computation switched off (interleaved blocks on one
  store, medians), the database's gapless/hash trigger against the same store with
  it dropped, and the chain's share of ``fold_step`` alone; then ``keel verify`` of
  the 100,000-event run, in process (``Store.verify_log``, cold store) and as the
  command (a subprocess, start-up included).

Usage: python bench/store.py [--steps 1000,10000,100000] [--dir PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from keel.core.chain import chain_time, plain, plain_event_hash
from keel.core.events import EventType, NewEvent
from keel.core.records import RunOptions
from keel.core.state import RunState
from keel.store import step as step_module
from keel.store.sqlite.store import SQLiteStore

PAD = "lorem ipsum dolor sit amet " * 9  # ~240 characters of payload per event
TAIL = 1000


def step_events(i: int) -> list[NewEvent]:
    call = f"call_{i}"
    return [
        NewEvent(
            type=EventType.MODEL_RESPONDED,
            data={
                "content": PAD,
                "tool_calls": [{"id": call, "name": "read_file", "arguments": {"path": "a.py"}}],
                "usage": {"input_tokens": 1200, "output_tokens": 80},
                "cost": 0.0001,
            },
        ),
        NewEvent(
            type=EventType.TOOL_STARTED,
            data={
                "call_id": call,
                "key": f"key-{i}",
                "tool": "read_file",
                "arguments": {"path": f"src/module_{i % 50}.py", "note": PAD[:200]},
            },
        ),
        NewEvent(
            type=EventType.TOOL_FINISHED,
            data={
                "call_id": call,
                "tool": "read_file",
                "arguments": {"path": f"src/module_{i % 50}.py"},
                "result": PAD,
            },
        ),
    ]


def event_bytes() -> float:
    return statistics.mean(len(json.dumps(e.data, separators=(",", ":"))) for e in step_events(7))


def max_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def append_run(store: SQLiteStore, steps: int) -> dict[str, Any]:
    state = store.create_run(goal="bench", workspace="/tmp", options=RunOptions())
    run_id = state.run_id
    steps_events = [step_events(i) for i in range(64)]  # built outside the timed loop
    timings: list[float] = []
    clock = time.perf_counter
    cpu_start = time.process_time()
    start = clock()
    for i in range(steps):
        t0 = clock()
        state, _ = store.append_events(run_id, steps_events[i % 64], expected_seq=state.last_seq)
        timings.append(clock() - t0)
    total = clock() - start
    cpu = time.process_time() - cpu_start
    tail = timings[-TAIL:]
    return {
        "steps": steps,
        "events": state.last_seq,
        "per_step_us": round(total / steps * 1e6, 1),
        "per_step_us_last_1000": round(statistics.mean(tail) * 1e6, 1),
        "median_step_us": round(statistics.median(timings) * 1e6, 1),
        "cpu_per_step_us": round(cpu / steps * 1e6, 1),
        "p99_step_us_last_1000": round(sorted(tail)[int(len(tail) * 0.99) - 1] * 1e6, 1),
        "total_s": round(total, 2),
        "max_rss_mb": round(max_rss_mb(), 1),
        "run_id": run_id,
    }


def load_times(path: Path, run_id: str, repeats: int = 5) -> dict[str, Any]:
    snapshot_ms, rebuild_ms = [], []
    events = 0
    for _ in range(repeats):
        with SQLiteStore(path) as store:  # a cold store: nothing cached in memory
            t0 = time.perf_counter()
            state = store.load_run(run_id)
            snapshot_ms.append((time.perf_counter() - t0) * 1e3)
            t0 = time.perf_counter()
            log = store.read_events(run_id)
            rebuilt = RunState.from_events(log)
            rebuild_ms.append((time.perf_counter() - t0) * 1e3)
            assert rebuilt == state
            events = len(log)
    return {
        "events": events,
        "load_run_ms": round(statistics.median(snapshot_ms), 3),
        "rebuild_from_events_ms": round(statistics.median(rebuild_ms), 1),
    }


def file_bytes(path: Path) -> int:
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return path.stat().st_size


@contextmanager
def chain_switched_off() -> Iterator[None]:
    """Appends with every event's hash replaced by the previous one (no sha256 computed):
    the same rows, columns, triggers and head check, only the chain's computation gone."""
    original = step_module.event_hash, step_module.plain_event_hash
    step_module.event_hash = step_module.plain_event_hash = lambda prev, *_rest: prev
    try:
        yield
    finally:
        step_module.event_hash, step_module.plain_event_hash = original


def timed_steps(store: SQLiteStore, state: RunState, steps: int) -> tuple[RunState, list[float]]:
    batches = [step_events(i) for i in range(64)]
    clock = time.perf_counter
    timings = []
    for i in range(steps):
        t0 = clock()
        state, _ = store.append_events(state.run_id, batches[i % 64], expected_seq=state.last_seq)
        timings.append(clock() - t0)
    return state, timings


def chain_cost(folder: Path, blocks: int = 8, steps: int = 1500) -> dict[str, Any]:
    """Per-step append with and without the chain, in alternating blocks on two stores
    (one run each: two runs in one file would not both append at the b-tree's end)."""
    stores = {}
    for name in ("on", "off"):
        path = folder / f"chain-{name}.db"
        path.unlink(missing_ok=True)
        stores[name] = SQLiteStore(path)
    chained = stores["on"].create_run(goal="chain on", workspace="/tmp", options=RunOptions())
    plain = stores["off"].create_run(goal="chain off", workspace="/tmp", options=RunOptions())
    on: list[float] = []
    off: list[float] = []
    try:
        for block in range(blocks):
            for chain in (True, False) if block % 2 else (False, True):
                if chain:
                    chained, timings = timed_steps(stores["on"], chained, steps)
                    on += timings
                else:
                    with chain_switched_off():
                        plain, timings = timed_steps(stores["off"], plain, steps)
                    off += timings
        assert stores["on"].verify_log(chained.run_id).intact
    finally:
        for store in stores.values():
            store.close()
    triggers = trigger_cost(folder, blocks=blocks, steps=steps)
    fold = fold_share()
    added = statistics.median(on) - statistics.median(off)
    return {
        "steps_each": len(on),
        "append_median_step_us_with_chain": round(statistics.median(on) * 1e6, 1),
        "append_median_step_us_chain_off": round(statistics.median(off) * 1e6, 1),
        "append_mean_step_us_with_chain": round(statistics.mean(on) * 1e6, 1),
        "append_mean_step_us_chain_off": round(statistics.mean(off) * 1e6, 1),
        "chain_added_us_per_step": round(added * 1e6, 1),
        **fold,
        **triggers,
    }


def trigger_cost(folder: Path, blocks: int, steps: int) -> dict[str, Any]:
    """Median step with the database's gapless and hash triggers, and on a second store
    with them dropped, in alternating blocks."""
    stores, states, timings = {}, {}, {}
    for name in ("with_triggers", "triggers_dropped"):
        path = folder / f"triggers-{name}.db"
        path.unlink(missing_ok=True)
        stores[name] = SQLiteStore(path)
        states[name] = stores[name].create_run(goal=name, workspace="/tmp", options=RunOptions())
        timings[name] = []
    conn = sqlite3.connect(folder / "triggers-triggers_dropped.db")
    conn.execute("DROP TRIGGER events_gapless")
    conn.commit()
    conn.close()
    try:
        for block in range(blocks):
            order = ("with_triggers", "triggers_dropped")
            for name in order if block % 2 else order[::-1]:
                states[name], more = timed_steps(stores[name], states[name], steps)
                timings[name] += more
    finally:
        for store in stores.values():
            store.close()
    medians = {name: statistics.median(t) * 1e6 for name, t in timings.items()}
    return {
        "append_median_step_us_db_triggers": round(medians["with_triggers"], 1),
        "append_median_step_us_db_triggers_dropped": round(medians["triggers_dropped"], 1),
        "db_triggers_added_us_per_step": round(
            medians["with_triggers"] - medians["triggers_dropped"], 1
        ),
    }


def fold_share(repeats: int = 2000, rounds: int = 9) -> dict[str, float]:
    """What the chain adds to folding one 3-event step, in µs (best of ``rounds``):
    the hashing alone (the exact work ``fold_step`` adds: one sha256 per event), and
    ``fold_step`` whole with the chain and without, measured in alternation."""
    state = RunState(run_id="run_0123456789ab")
    created = step_module.first_event(
        state.run_id, {"status": "running"}, "{}", now=datetime.now(UTC)
    )
    state = state.apply(created)
    events = step_events(3)
    now = datetime.now(UTC)
    stamp = chain_time(now)
    texts = [(e.type.value, step_module.dump_json(e.data)) for e in events]
    event_id = step_module.new_event_id()

    def hashing() -> None:
        prev = state.last_hash
        plain(state.run_id)
        for seq, (kind, text) in enumerate(texts, start=2):
            prev = plain_event_hash(prev, state.run_id, seq, event_id, kind, stamp, text)

    def fold() -> None:
        step_module.fold_step(state, events, now=now)

    def best(action: Callable[[], None]) -> float:
        t0 = time.perf_counter()
        for _ in range(repeats):
            action()
        return (time.perf_counter() - t0) / repeats * 1e6

    on, off, hashes = [], [], []
    for _ in range(rounds):
        on.append(best(fold))
        with chain_switched_off():
            off.append(best(fold))
        hashes.append(best(hashing))
    return {
        "chain_hashing_us_per_step": round(min(hashes), 2),
        "fold_step_us_with_chain": round(min(on), 1),
        "fold_step_us_chain_off": round(min(off), 1),
    }


def verify_times(path: Path, run_id: str) -> dict[str, Any]:
    """``keel verify`` of one run: in process on a cold store, and as the command."""
    in_process = []
    events = 0
    for _ in range(3):
        with SQLiteStore(path) as store:
            t0 = time.perf_counter()
            check = store.verify_log(run_id)
            in_process.append(time.perf_counter() - t0)
            assert check.intact, check.damage
            events = check.events
    keel = str(Path(sys.executable).with_name("keel"))
    command = []
    for _ in range(3):
        t0 = time.perf_counter()
        done = subprocess.run(
            [keel, "verify", run_id, "--store", f"sqlite:///{path}"],
            capture_output=True,
            text=True,
            check=False,
        )
        command.append(time.perf_counter() - t0)
        assert done.returncode == 0, done.stderr
    t0 = time.perf_counter()
    startup = subprocess.run([keel, "--help"], capture_output=True, check=False)
    startup_s = time.perf_counter() - t0
    assert startup.returncode == 0
    return {
        "events": events,
        "verify_log_s": round(statistics.median(in_process), 3),
        "keel_verify_command_s": round(statistics.median(command), 3),
        "keel_start_up_s": round(startup_s, 3),
    }


def machine() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "sqlite": sqlite3.sqlite_version,
        "platform": platform.platform(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", default="1000,10000,100000")
    parser.add_argument("--dir", default=None, help="where to put the scratch databases")
    args = parser.parse_args()
    sizes = [int(s) for s in args.steps.split(",")]
    folder = Path(args.dir or tempfile.mkdtemp(prefix="keel-bench-"))
    folder.mkdir(parents=True, exist_ok=True)

    appends = []
    for steps in sizes:
        path = folder / f"append-{steps}.db"
        path.unlink(missing_ok=True)
        with SQLiteStore(path) as store:
            result = append_run(store, steps)
        result["bytes_per_event_on_disk"] = round(file_bytes(path) / result["events"], 1)
        appends.append(result)
    full = folder / "append-full.db"
    full.unlink(missing_ok=True)
    with SQLiteStore(full, synchronous="full") as store:
        fsync_step = append_run(store, 300)

    loads = {}
    verify: dict[str, Any] = {}
    for events in (10_000, 100_000):
        path = folder / f"load-{events}.db"
        path.unlink(missing_ok=True)
        with SQLiteStore(path) as store:
            run_id = append_run(store, (events - 1) // 3)["run_id"]
        loads[f"{events}_events"] = load_times(path, run_id, repeats=5 if events <= 10_000 else 2)
        if events == 100_000:
            verify = verify_times(path, run_id)
    chain = chain_cost(folder)

    small, large = appends[0], appends[-1]
    report = {
        "machine": machine(),
        "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
        "synchronous": "normal (WAL): committed steps survive a process crash or SIGKILL",
        "event_payload_bytes": round(event_bytes(), 1),
        "append": [{k: v for k, v in a.items() if k != "run_id"} for a in appends],
        "flatness_ratio": round(large["per_step_us"] / small["per_step_us"], 2),
        "flatness_ratio_last_1000": round(
            large["per_step_us_last_1000"] / small["per_step_us_last_1000"], 2
        ),
        "append_synchronous_full_300_steps_us": fsync_step["per_step_us"],
        "load": loads,
        "chain": chain,
        "verify_100k_events": verify,
        "peak_max_rss_mb": round(max_rss_mb(), 1),
        "targets": {
            "per_step_us_at_most": 100,
            "flatness_ratio_at_most": 1.5,
            "load_10k_events_ms_at_most": 50,
            "chain_added_us_per_step_at_most": 10,
            "keel_verify_100k_events_s_at_most": 2,
        },
    }
    report["targets_met"] = {
        "per_step": all(a["per_step_us"] <= 100 for a in appends),
        "flat": report["flatness_ratio"] <= 1.5,
        "load_10k": loads["10000_events"]["load_run_ms"] <= 50,
        "chain_per_step": chain["chain_added_us_per_step"] <= 10,
        "verify_100k": verify["keel_verify_command_s"] <= 2,
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
