"""Instructions per durable step, counted by valgrind: a figure a noisy machine cannot move.

On a shared virtual machine the wall clock (and even CPU time) of a 1 ms step varies run
to run by more than the differences worth measuring (tracing's 50 us target, a write
step's tenth of a millisecond). Instruction counts do not: this script runs each
workload under ``valgrind --tool=cachegrind --cache-sim=no`` at two run lengths in fresh
processes and reports the slope, instructions per step (what a step costs once start-up,
imports and the warm-up are paid — they cancel out). To turn instructions into time,
the report also gives this machine's instructions per microsecond on the same untraced
read workload timed without valgrind.

Workloads (bench/loop.py's scripted model and tools, SQLite WAL/NORMAL):

- ``read``: model turn -> noop read tool -> result;
- ``read_traced``: the same, traced over OTLP/HTTP to a receiver process on loopback
  (bench/loop_tracing.py); the exporter's one-second schedule is switched off so that,
  50x slower under valgrind, it still sends 512 spans a request as a real run does;
- ``write``: model turn -> write_file of a new file -> result.

    .venv/bin/python bench/step_instructions.py [--short 100] [--long 400]

It needs valgrind (``apt-get install valgrind``); each workload takes a few minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
WORKLOADS = ("read", "read_traced", "write")

CHILD = r"""
import sys, tempfile
from pathlib import Path
sys.path.insert(0, sys.argv[1])
workload, steps = sys.argv[2], int(sys.argv[3])
endpoint = sys.argv[4] if len(sys.argv) > 4 else None
from keel.runtime import otlp_export
otlp_export.SCHEDULE_S = 1e9  # batches of 512 only: valgrind makes every second 50x shorter
import loop, loop_tracing
with tempfile.TemporaryDirectory() as tmp:
    root = Path(tmp)
    if workload == "read_traced":
        loop_tracing.timed_run(20, root / "warm", endpoint)
        loop_tracing.timed_run(steps, root / "run", endpoint)
    else:
        loop.keel_run(20, root / "warm", workload=workload)
        loop.keel_run(steps, root / "run", workload=workload)
"""


def instructions(workload: str, steps: int, endpoint: str) -> int:
    """Instructions the whole child process ran (valgrind's ``I refs``)."""
    with tempfile.TemporaryDirectory(prefix="keel-bench-ir-") as tmp:
        out = Path(tmp) / "cachegrind.out"
        args = [
            "valgrind",
            "--tool=cachegrind",
            "--cache-sim=no",
            f"--cachegrind-out-file={out}",
            sys.executable,
            "-c",
            CHILD,
            str(HERE),
            workload,
            str(steps),
            endpoint,
        ]
        done = subprocess.run(args, capture_output=True, text=True, check=False)
        found = re.search(r"I\s+refs:\s+([\d,]+)", done.stderr)
        if done.returncode != 0 or found is None:
            raise SystemExit(f"{workload} x {steps} failed under valgrind:\n{done.stderr[-3000:]}")
        return int(found.group(1).replace(",", ""))


def instructions_per_us() -> float:
    """This machine's instructions per microsecond on the untraced read workload
    (valgrind's count over the wall clock of the same work timed natively, best of 3)."""
    sys.path.insert(0, str(HERE))
    import loop  # noqa: PLC0415 - bench/loop.py, beside this script

    steps = 400
    with tempfile.TemporaryDirectory(prefix="keel-bench-ir-") as tmp:
        loop.keel_run(20, Path(tmp) / "warm")
        best = min(loop.keel_run(steps, Path(tmp) / f"run-{i}")[0]["ms_per_step"] for i in range(3))
    return best * 1000  # us per step: divided into instructions per step below


def measure(short: int, long: int) -> dict[str, Any]:
    from loop_tracing import loopback_receiver  # noqa: PLC0415

    report: dict[str, Any] = {
        "method": (
            f"valgrind cachegrind instruction counts of fresh processes running {short} "
            f"and {long} steps (after a 20-step warm-up); per step = the difference / "
            f"{long - short}"
        ),
        "workloads": {},
    }
    with loopback_receiver() as endpoint:
        for workload in WORKLOADS:
            started = time.perf_counter()
            counts = {n: instructions(workload, n, endpoint) for n in (short, long)}
            per_step = (counts[long] - counts[short]) / (long - short)
            report["workloads"][workload] = {
                "instructions_per_step": round(per_step),
                "minutes": round((time.perf_counter() - started) / 60, 1),
            }
    figures = report["workloads"]
    traced = figures["read_traced"]["instructions_per_step"]
    untraced = figures["read"]["instructions_per_step"]
    read_us = instructions_per_us()
    rate = untraced / read_us
    report["instructions_per_us_here"] = round(rate)
    report["tracing_added"] = {
        "instructions_per_step": traced - untraced,
        "percent_of_a_read_step": round(100 * (traced - untraced) / untraced, 1),
        "us_per_step_at_this_machines_rate": round((traced - untraced) / rate, 1),
    }
    for figure in figures.values():
        figure["us_per_step_at_this_machines_rate"] = round(
            figure["instructions_per_step"] / rate, 1
        )
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--short", type=int, default=100)
    parser.add_argument("--long", type=int, default=400)
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        print("valgrind is not installed (apt-get install valgrind): nothing measured")
        return
    os.environ.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    print(json.dumps(measure(args.short, args.long), indent=2))


if __name__ == "__main__":
    main()
