"""What the sandbox costs per program: wall time run directly vs through the sandbox.

Three programs — ``true``, ``python -c pass`` (this interpreter) and ``grep -r``
over a generated tree of 200 files — each run ``--runs`` times directly
(``subprocess.run``), through the unconfined sandbox (kind "none": scrubbed
environment, limits, cgroup, tree kill) and through bubblewrap. A sandboxed run is
the whole call: ``popen`` (mount plan, secret scan, cgroup), wait, ``finish``.

    .venv/bin/python bench/sandbox.py [--runs 200]

Prints one JSON object: per program and way, p50/p99 in ms, and the p50 bubblewrap
adds over the direct run (target: at most 10 ms).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from keel.sandbox.base import Confinement, Sandbox, SandboxSettings
from keel.sandbox.choose import open_sandbox

TARGET_ADDED_P50_MS = 10.0
FILES = 200


def make_tree(root: Path) -> None:
    for i in range(FILES):
        folder = root / "src" / f"pkg{i % 10}"
        folder.mkdir(parents=True, exist_ok=True)
        lines = [f"line {n} of module {i}: some ordinary text to search" for n in range(40)]
        if i % 17 == 0:
            lines.append("needle here")
        (folder / f"mod{i}.py").write_text("\n".join(lines) + "\n")


def percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {"p50_ms": round(statistics.median(ordered) * 1000, 2), "p99_ms": round(p99 * 1000, 2)}


def direct(argv: list[str], ws: Path) -> Callable[[], None]:
    def once() -> None:
        subprocess.run(
            argv, cwd=ws, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False
        )

    return once


def sandboxed(sandbox: Sandbox, argv: list[str], ws: Path) -> Callable[[], None]:
    confinement = Confinement(workspace=ws)

    def once() -> None:
        proc = sandbox.popen(
            argv, confinement, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            proc.wait()
        finally:
            sandbox.finish(proc)

    return once


def timed(runs: dict[str, Callable[[], None]], count: int) -> dict[str, list[float]]:
    """Each way ``count`` times, interleaved, so a busy moment of the machine hits all alike."""
    samples: dict[str, list[float]] = {way: [] for way in runs}
    for run in runs.values():
        run()  # warm caches once
    for _ in range(count):
        for way, run in runs.items():
            t0 = time.perf_counter()
            run()
            samples[way].append(time.perf_counter() - t0)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    args = parser.parse_args()
    ways: dict[str, Sandbox] = {"none": open_sandbox(SandboxSettings(mode="off"))}
    bubblewrap = open_sandbox(SandboxSettings(mode="auto"))
    if bubblewrap.kind == "bubblewrap":
        ways["bubblewrap"] = bubblewrap
    programs = {
        "true": ["true"],
        "python -c pass": [sys.executable, "-c", "pass"],
        f"grep -r ({FILES} files)": ["grep", "-r", "-c", "needle", "src"],
    }
    report: dict[str, Any] = {
        "runs": args.runs,
        "bubblewrap": bubblewrap.describe().get("version") or bubblewrap.describe()["reason"],
        "processes_enforced_by": bubblewrap.describe()["processes"]["enforced_by"],
        "target_added_p50_ms": TARGET_ADDED_P50_MS,
        "programs": {},
    }
    with tempfile.TemporaryDirectory(prefix="keel-bench-") as folder:
        ws = Path(folder).resolve()
        make_tree(ws)
        for name, argv in programs.items():
            runs = {"direct": direct(argv, ws)}
            runs.update({way: sandboxed(box, argv, ws) for way, box in ways.items()})
            result: dict[str, Any] = {
                way: percentiles(samples) for way, samples in timed(runs, args.runs).items()
            }
            if "bubblewrap" in result:
                added = result["bubblewrap"]["p50_ms"] - result["direct"]["p50_ms"]
                result["bubblewrap_added_p50_ms"] = round(added, 2)
            report["programs"][name] = result
    added_all = [
        r["bubblewrap_added_p50_ms"]
        for r in report["programs"].values()
        if "bubblewrap_added_p50_ms" in r
    ]
    report["target_met"] = bool(added_all) and max(added_all) <= TARGET_ADDED_P50_MS
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
