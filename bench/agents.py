"""Delegation benchmarks: parallel background children, spawn overhead, and the isolated
workspace round trip.

    .venv/bin/python bench/agents.py [--children 8] [--steps 20] [--turn-ms 100]
        [--slots 4] [--spawns 40] [--runs 20] [--files 10000]
        [--scratch DIR] [--skip-children] [--skip-workspace]

Prints one JSON object:

- ``parallel``: ``--children`` background children of one parent, each ``--steps``
  model turns (``--steps - 1`` read_file calls of distinct files, then
  request_completion) against a loopback FakeProvider (``openai:fake-model``,
  ``OPENAI_BASE_URL`` pointing at it; in a process of its own, as a provider is) that
  takes ``--turn-ms`` per turn. Executed by
  the parent process's own child slots (``Harness(child_slots=N)``): ``--slots`` slots
  against one slot (the same children, one after another). The parent's model waits
  until every child has ended before it calls ``agent_wait``, so the slots are the
  only executors (``agent_wait`` would otherwise run a still-queued child on the
  parent's own thread: the ``with_agent_wait`` figure, reported beside, is that natural
  flow, the parent joining in). Wall time is the parent run's, spawn to completion;
  target: speedup >= 3.5x with 4 slots.
- ``spawn_overhead``: ``--spawns`` spawns one at a time (each collected before the
  next), background (on a free child slot) and foreground (inline): from the
  ``subagent_spawned`` event's ``recorded_at`` (committed on the parent's log) to the
  provider's receipt of the child's first model request (the provider process's wall
  clock as it reads the request; one machine, one clock). p50/p99 (the first spawn, which
  resolves the children's model for the first time in the process, is reported apart
  as ``first_ms``); target: p99 <= 50 ms.
- ``isolated_workspace`` (``git_worktree`` / ``copy``): an isolated workspace's
  create, a small change, ``patch()``, ``remove()`` for a parent of ``--files`` files
  in nested directories: a git repository with a few uncommitted edits (staged and
  not) and untracked files, and a plain directory (copy mode), ``--runs`` times;
  target: a git-worktree round trip within 1 s at the p50.
  ``plain_git_worktree_add_remove`` is the floor this machine's file system sets: a
  bare ``git worktree add`` + ``remove`` of the same repository.

Parents and children run in this process against a SQLite store in a temporary
directory; only the provider has a process of its own. ``--scratch DIR`` puts every
store, workspace and repository in DIR (e.g. ``/dev/shm``, to take a slow disk's
fsyncs and file creation out of the figures); the default is TMPDIR.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from keel.core.budget import Budget
from keel.core.events import EventType
from keel.core.status import RunStatus
from keel.models.base import ModelRequest, ModelTurn
from keel.runtime.harness import Harness
from keel.runtime.worktrees import create
from keel.store.base import Store, iter_all_events
from keel.testing.agents import RelayModel, write_agent
from keel.testing.provider import FakeProvider

TARGET_P50_MS = 1000.0
TARGET_SPEEDUP = 3.5
TARGET_SPAWN_P99_MS = 50.0
CHILD_TASK = re.compile(r"## Your task\s+(child \d+)")


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


def plain_worktrees(repository: Path, root: Path, runs: int) -> dict[str, float]:
    """The floor this machine sets: ``git worktree add --detach HEAD`` and ``git worktree
    remove --force`` of the same repository, nothing else (no snapshot, no patch)."""
    git = ["git", "-C", str(repository)]
    totals: list[float] = []
    for number in range(runs + 1):
        path = root / f"plain{number}"
        t0 = time.perf_counter()
        subprocess.run([*git, "worktree", "add", "-q", "--detach", str(path)], check=True)
        subprocess.run([*git, "worktree", "remove", "--force", str(path)], check=True)
        if number:
            totals.append(time.perf_counter() - t0)
    return percentiles(totals)


# --- children against a loopback provider ----------------------------------------------------


class ChildTurns:
    """FakeProvider answers for children: by the length of each child's conversation,
    ``steps - 1`` read_file calls (a different note each turn, as a model that makes
    progress would) then request_completion, each after ``delay`` seconds.
    Records (wall clock) when each child's first request arrived."""

    def __init__(self, provider: FakeProvider, *, steps: int, delay: float) -> None:
        self.provider = provider
        self.steps = steps
        self.delay = delay
        self.first_request: dict[str, float] = {}
        self.requests: dict[str, int] = {}
        provider.respond_with(self.respond)

    def respond(self, body: dict[str, Any]) -> None:
        now = time.time()  # called as the request is read, under the provider's lock
        messages = body.get("messages") or []
        user = next((str(m.get("content")) for m in messages if m.get("role") == "user"), "")
        found = CHILD_TASK.search(user)
        name = found.group(1) if found else "?"
        self.first_request.setdefault(name, now)
        self.requests[name] = self.requests.get(name, 0) + 1
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        if turn < self.steps - 1:
            call: tuple[str, dict[str, Any]] = ("read_file", {"path": f"notes/{turn}.txt"})
        else:
            call = ("request_completion", {"summary": f"{name}: read {turn} notes"})
        self.provider.reply(tool_calls=[call], usage=(50, 10), delay=self.delay)


class PatientParent:
    """The parent's scripted model (a RelayModel); before turn ``gate_step`` it waits
    until every child of its run has ended, as a model busy elsewhere would. ``{last}``
    in a turn stands for the task id of the latest spawn the model can see (the
    RelayModel's ``{taskN}`` counts spawns in the model's view, which holds only the
    last messages of a long run)."""

    def __init__(self, turns: list[dict[str, Any]], gate_step: int | None) -> None:
        self.turns = turns
        self.spec = RelayModel(turns).spec
        self.gate_step = gate_step
        self.store: Store | None = None

    def complete(self, request: ModelRequest) -> ModelTurn:
        if request.step == self.gate_step and self.store is not None:
            while True:
                children = [r for r in self.store.list_runs() if r.parent_id is not None]
                if children and all(c.status.terminal for c in children):
                    break
                time.sleep(0.02)
        last = "(none yet)"
        for message in request.messages:
            if message.role == "tool" and message.content and '"started"' in message.content:
                last = str(json.loads(message.content).get("task_id"))
        turns = json.loads(json.dumps(self.turns).replace("{last}", last))
        return RelayModel(turns, spec=self.spec).complete(request)


class ProviderProcess:
    """ChildTurns on a FakeProvider in a process of its own (``--serve-provider``), as a
    provider is: its HTTP handling never competes with the harness for this
    interpreter. ``counts()`` asks it what it has seen so far."""

    def __init__(self, steps: int, delay: float) -> None:
        command = [sys.executable, __file__, "--serve-provider", "--steps", str(steps)]
        self.proc = subprocess.Popen(
            [*command, "--turn-ms", str(delay * 1000)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None and self.proc.stdin is not None
        self._in, self._out = self.proc.stdin, self.proc.stdout
        self.base_url = self._out.readline().strip()
        if not self.base_url.startswith("http://"):
            raise SystemExit(f"the provider process did not start: {self.base_url!r}")

    def counts(self) -> tuple[dict[str, float], dict[str, int]]:
        """(wall-clock time of each child's first request, requests per child)."""
        self._in.write("stats\n")
        self._in.flush()
        seen = json.loads(self._out.readline())
        return seen["first_request"], seen["requests"]

    def close(self) -> None:
        self._in.write("exit\n")
        self._in.flush()
        if self.proc.wait(timeout=30) != 0:
            raise SystemExit("the provider process saw requests a strict server would refuse")


def serve_provider(steps: int, delay: float) -> None:
    """The ``--serve-provider`` process: prints the base URL, then answers ``stats``
    lines on stdin with a JSON line until ``exit``."""
    with FakeProvider() as provider:
        answers = ChildTurns(provider, steps=steps, delay=delay)
        print(provider.base_url, flush=True)
        for line in sys.stdin:
            if line.strip() == "exit":
                break
            print(
                json.dumps({"first_request": answers.first_request, "requests": answers.requests}),
                flush=True,
            )


@contextmanager
def delegation_scratch(steps: int, delay: float) -> Iterator[tuple[Path, str, ProviderProcess]]:
    """A workspace with a ``worker`` agent spec (the provider's model, read-only), a
    SQLite store URL and the provider (in its own process); the environment points
    the ``openai`` provider at it while inside."""
    provider = ProviderProcess(steps, delay)
    try:
        with tempfile.TemporaryDirectory(prefix="keel-bench-") as folder:
            root = Path(folder).resolve()
            ws = root / "ws"
            ws.mkdir()
            (ws / "notes").mkdir()
            for number in range(steps):
                (ws / "notes" / f"{number}.txt").write_text(f"note {number}\n")
            write_agent(
                ws,
                "worker",
                model="openai:fake-model",
                tools=["read_file"],
                workspace_kind="shared-readonly",
                budget={"steps": steps + 5},
            )
            names = ("OPENAI_API_KEY", "OPENAI_BASE_URL", "XDG_CACHE_HOME")
            saved = {name: os.environ.get(name) for name in names}
            os.environ.update(
                OPENAI_API_KEY="sk-bench",
                OPENAI_BASE_URL=provider.base_url,
                XDG_CACHE_HOME=str(root / "cache"),
            )
            try:
                yield ws, f"sqlite:///{root / 'keel.db'}", provider
            finally:
                for key, value in saved.items():
                    if value is None:
                        os.environ.pop(key, None)
                    else:
                        os.environ[key] = value
    finally:
        provider.close()


def spawn_call(task: str, *, background: bool) -> dict[str, Any]:
    return {
        "name": "agent_spawn",
        "arguments": {"agent": "worker", "task": task, "background": background},
    }


COMPLETE = {"tool_calls": [{"name": "request_completion", "arguments": {"summary": "done"}}]}


def parallel_children(
    children: int, steps: int, turn_s: float, slots: int, *, gated: bool
) -> dict[str, Any]:
    """One parent spawning ``children`` background children on ``slots`` child slots."""
    turns: list[dict[str, Any]] = [
        {"tool_calls": [spawn_call(f"child {i}", background=True) for i in range(children)]},
        {
            "tool_calls": [
                {
                    "name": "agent_wait",
                    "arguments": {
                        "ids": [f"{{task{i}}}" for i in range(children)],
                        "timeout_seconds": 3600,
                    },
                }
            ]
        },
        COMPLETE,
    ]
    with delegation_scratch(steps, turn_s) as (ws, url, provider):
        (ws / ".keel" / "config.toml").write_text(f"[agents]\nmax_live_children = {children}\n")
        parent = PatientParent(turns, gate_step=1 if gated else None)
        with Harness(store=url, model=parent, child_slots=slots) as harness:
            parent.store = harness.store
            t0 = time.perf_counter()
            out = harness.run("read the notes", cwd=ws, budget=Budget(max_steps=50))
            wall = time.perf_counter() - t0
            done = [c for c in harness.store.child_runs(out.id) if c.status is RunStatus.COMPLETED]
            steps_done = sorted({c.usage.steps for c in done})
        _, requests = provider.counts()
    if out.status is not RunStatus.COMPLETED or len(done) != children:
        raise SystemExit(f"parallel run did not complete: {out.status} {out.stop_reason}")
    if sorted(requests.values()) != [steps] * children:
        raise SystemExit(f"children did not take {steps} turns each: {requests}")
    return {"slots": slots, "wall_s": round(wall, 3), "child_steps": steps_done}


def spawn_overhead(spawns: int, *, background: bool) -> dict[str, Any]:
    """``spawns`` one-turn children spawned one at a time (each collected before the
    next): spawn committed -> the child's first model request at the provider, in ms.
    One more spawn goes first and is reported apart (``first_ms``): it pays for this
    process's first resolution of the children's model (its HTTP client, price table)."""
    total = spawns + 1
    turns: list[dict[str, Any]] = []
    for i in range(total):
        turns.append({"tool_calls": [spawn_call(f"child {i}", background=background)]})
        if background:
            turns.append({"tool_calls": [{"name": "agent_wait", "arguments": {"ids": ["{last}"]}}]})
    turns.append(COMPLETE)
    with delegation_scratch(1, 0.0) as (ws, url, provider):
        parent = PatientParent(turns, gate_step=None)
        with Harness(store=url, model=parent, child_slots=4) as harness:
            out = harness.run("spawn", cwd=ws, budget=Budget(max_steps=len(turns) + 5))
            log = list(iter_all_events(harness.store, out.id))
            spawned = [e for e in log if e.type is EventType.SUBAGENT_SPAWNED]
            failed = [e.data["message"] for e in log if e.type is EventType.TOOL_FAILED]
            ended = {c.status for c in harness.store.child_runs(out.id)}
        first_request, _ = provider.counts()
    if out.status is not RunStatus.COMPLETED or len(spawned) != total or failed:
        raise SystemExit(f"spawn run went wrong: {out.status} {out.stop_reason} {failed[:1]}")
    if ended != {RunStatus.COMPLETED}:
        raise SystemExit(f"not every child completed: {ended}")
    delays = [first_request[str(e.data["task"])] - e.recorded_at.timestamp() for e in spawned]
    result: dict[str, Any] = {"spawns": spawns, **percentiles(delays[1:])}
    result["max_ms"] = round(max(delays[1:]) * 1000, 1)
    result["first_ms"] = round(delays[0] * 1000, 1)
    return result


def children_report(args: argparse.Namespace) -> dict[str, Any]:
    turn_s = args.turn_ms / 1000
    parallel = parallel_children(args.children, args.steps, turn_s, args.slots, gated=True)
    serial = parallel_children(args.children, args.steps, turn_s, 1, gated=True)
    natural = parallel_children(args.children, args.steps, turn_s, args.slots, gated=False)
    speedup = serial["wall_s"] / parallel["wall_s"]
    background = spawn_overhead(args.spawns, background=True)
    foreground = spawn_overhead(args.spawns, background=False)
    return {
        "parallel": {
            "children": args.children,
            "steps_each": args.steps,
            "turn_ms": args.turn_ms,
            "executor": "the parent process's child slots (Harness(child_slots=N))",
            "ideal_serial_s": round(args.children * args.steps * turn_s, 3),
            "with_slots": parallel,
            "one_slot": serial,
            "speedup": round(speedup, 2),
            "with_agent_wait": natural,
            "target_speedup": TARGET_SPEEDUP,
            "target_met": speedup >= TARGET_SPEEDUP,
        },
        "spawn_overhead": {
            "measured": "subagent_spawned recorded_at -> provider receipt of the child's "
            "first request",
            "background": background,
            "foreground": foreground,
            "target_p99_ms": TARGET_SPAWN_P99_MS,
            "target_met": max(background["p99_ms"], foreground["p99_ms"]) <= TARGET_SPAWN_P99_MS,
        },
    }


def workspace_report(args: argparse.Namespace) -> dict[str, Any]:
    workspace: dict[str, Any] = {"files": args.files, "runs": args.runs}
    with tempfile.TemporaryDirectory(prefix="keel-bench-") as folder:
        scratch = Path(folder).resolve()
        repository, plain = scratch / "repository", scratch / "plain"
        make_repository(repository, args.files)
        make_tree(plain, args.files)
        workspace["git_worktree"] = round_trips(repository, scratch / "children-git", args.runs)
        workspace["copy"] = round_trips(plain, scratch / "children-copy", args.runs)
        workspace["plain_git_worktree_add_remove"] = plain_worktrees(
            repository, scratch / "plain-worktrees", args.runs
        )
    workspace["target_p50_ms"] = TARGET_P50_MS
    workspace["target_met"] = workspace["git_worktree"]["round_trip"]["p50_ms"] <= TARGET_P50_MS
    return workspace


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--children", type=int, default=8)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--turn-ms", type=float, default=100.0)
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--spawns", type=int, default=40)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument(
        "--scratch", default=None, help="Where the workspaces go (default: TMPDIR)."
    )
    parser.add_argument("--skip-children", action="store_true")
    parser.add_argument("--skip-workspace", action="store_true")
    parser.add_argument("--serve-provider", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_provider:
        serve_provider(args.steps, args.turn_ms / 1000)
        return
    if args.scratch:
        tempfile.tempdir = args.scratch  # every store, workspace and repository goes there
    report: dict[str, Any] = {
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "scratch": tempfile.gettempdir(),
    }
    if not args.skip_children:
        report.update(children_report(args))
    if not args.skip_workspace:
        report["isolated_workspace"] = workspace_report(args)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
