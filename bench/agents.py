"""What a subagent's isolated workspace costs: create, a small change, patch(), remove().

Two parents of ``--files`` (10,000) files in nested directories: a git repository with
a few uncommitted edits (staged and not) and untracked files, and a plain directory
(copy mode). Each round trip is timed whole and by phase, ``--runs`` times:

    .venv/bin/python bench/agents.py [--runs 20] [--files 10000]

Prints one JSON object: per kind, p50/p99 in ms of the round trip and the p50 of each
phase; target: a git-worktree round trip within 1 s at the p50.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from keel.runtime.worktrees import create

TARGET_P50_MS = 1000.0


def make_tree(root: Path, files: int) -> None:
    for number in range(files):
        folder = root / "src" / f"pkg{number % 20}" / f"sub{number % 7}"
        folder.mkdir(parents=True, exist_ok=True)
        lines = [f"value_{n} = {number * n}  # module {number}" for n in range(12)]
        (folder / f"mod{number}.py").write_text("\n".join(lines) + "\n")


def make_repository(root: Path, files: int) -> None:
    make_tree(root, files)
    git = ["git", "-c", "user.name=b", "-c", "user.email=b@example.com", "-C", str(root)]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "bench"]):
        subprocess.run([*git, *args], check=True, capture_output=True)
    for number in range(3):
        (root / "src" / f"pkg{number}" / f"sub{number}" / f"mod{number}.py").write_text("edited\n")
    subprocess.run([*git, "add", "src/pkg0"], check=True, capture_output=True)  # one staged
    for number in range(3):
        (root / f"untracked{number}.txt").write_text(f"new {number}\n")


def percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {"p50_ms": round(statistics.median(ordered) * 1000, 1), "p99_ms": round(p99 * 1000, 1)}


def round_trips(parent: Path, root: Path, runs: int) -> dict[str, Any]:
    phases: dict[str, list[float]] = {"create": [], "change": [], "patch": [], "remove": []}
    totals: list[float] = []
    kind = ""
    patch_bytes = 0
    for number in range(runs + 1):  # the first warms the caches and is not counted
        t0 = time.perf_counter()
        child = create(parent, root=root, name=f"child{number}")
        t1 = time.perf_counter()
        target = child.path / "src" / "pkg5" / "sub5" / "mod5.py"
        target.write_text(target.read_text() + "added = True\n")
        (child.path / "NEW.md").write_text("written by the child\n")
        t2 = time.perf_counter()
        patch = child.patch()
        t3 = time.perf_counter()
        child.remove()
        t4 = time.perf_counter()
        if number == 0:
            kind, patch_bytes = child.kind, len(patch)
            continue
        for name, seconds in zip(phases, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
            phases[name].append(seconds)
        totals.append(t4 - t0)
    return {
        "kind": kind,
        "patch_bytes": patch_bytes,
        "round_trip": percentiles(totals),
        "phases_p50_ms": {
            name: round(statistics.median(samples) * 1000, 1) for name, samples in phases.items()
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--files", type=int, default=10_000)
    args = parser.parse_args()
    report: dict[str, Any] = {"files": args.files, "runs": args.runs}
    with tempfile.TemporaryDirectory(prefix="keel-bench-") as folder:
        scratch = Path(folder).resolve()
        repository, plain = scratch / "repository", scratch / "plain"
        make_repository(repository, args.files)
        make_tree(plain, args.files)
        report["git_worktree"] = round_trips(repository, scratch / "children-git", args.runs)
        report["copy"] = round_trips(plain, scratch / "children-copy", args.runs)
    report["target_p50_ms"] = TARGET_P50_MS
    report["target_met"] = report["git_worktree"]["round_trip"]["p50_ms"] <= TARGET_P50_MS
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
