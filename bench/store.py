"""Benchmark of the SQLite run store; prints one JSON object.

- durable step append: one step = 3 events of ~300 bytes (model response, tool
  start, tool finish) in one transaction, for runs of 1k, 10k and 100k steps;
  mean per-step cost overall and over the last 1,000 steps, and the flatness ratio
  (per-step cost at the largest size / at the smallest);
- load time of runs with 10k and 100k events: ``load_run`` from a cold store
  (snapshot read) and a full rebuild (read every event and fold them);
- bytes per event on disk (after a checkpoint) and peak memory (max RSS).

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
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from keel.core.events import EventType, NewEvent
from keel.core.state import RunOptions, RunState
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
    for events in (10_000, 100_000):
        path = folder / f"load-{events}.db"
        path.unlink(missing_ok=True)
        with SQLiteStore(path) as store:
            run_id = append_run(store, (events - 1) // 3)["run_id"]
        loads[f"{events}_events"] = load_times(path, run_id, repeats=5 if events <= 10_000 else 2)

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
        "peak_max_rss_mb": round(max_rss_mb(), 1),
        "targets": {
            "per_step_us_at_most": 100,
            "flatness_ratio_at_most": 1.5,
            "load_10k_events_ms_at_most": 50,
        },
    }
    report["targets_met"] = {
        "per_step": all(a["per_step_us"] <= 100 for a in appends),
        "flat": report["flatness_ratio"] <= 1.5,
        "load_10k": loads["10000_events"]["load_run_ms"] <= 50,
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
