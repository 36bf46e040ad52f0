"""The agent loop's cost per durable step: Keel on SQLite next to LangGraph's SQLite checkpointer.

Two workloads, each on every system: N steps of (model turn -> one tool call -> its
result), then a final answer. The model is scripted (deterministic turns, no network).

- read: a no-op read tool (``noop``), so what is measured is the harness: deciding,
  recording, persisting;
- write: Keel's built-in ``write_file`` writing a new small file per step (tool_started
  committed before the effect, the effect, the result); in LangGraph's tool node the
  same write by the same function, with the same fsync of the file (only where the
  store fsyncs its commits, as Keel does: bench/loop_langgraph.py).

Systems: Keel (``Harness`` on a SQLite file); LangGraph (bench/loop_langgraph.py: a
two-node StateGraph with ``SqliteSaver``, ``durability="sync"``), with the default
``operator.add`` message channel and, if the installed version has it, ``DeltaChannel``.

Fairness. Every system gets the same warm-up (one untimed run of ``WARMUP_STEPS`` per
workload) and the same ``--repeat`` timed runs per N, alternated run by run (ABC, BCA,
CAB ...), each on a fresh file; each figure is reported as median and best. Ratios are
printed only between equal durability settings (bench/_common.py ``PAIRS``), read back
from the connections and reported under ``durability``:

- ``wal_normal``: WAL, synchronous=NORMAL on both sides (Keel's default store; the
  saver's connection put in WAL/NORMAL);
- ``wal_full``: WAL, synchronous=FULL (an fsync of the WAL at every commit) on both
  sides (Keel ``?synchronous=full``; SqliteSaver as it ships: its setup() switches to
  WAL and SQLite's default is FULL).

Per pair, workload and N (``--sizes`` 50, 200, 1000): ms per step (total / N), CPU ms
per step (the machine may be shared), the mean ms per step of the first and of the last
50 steps (flatness), bytes stored per step (file growth after a WAL checkpoint, / N),
and ``keel_speedup`` (LangGraph / Keel, median against median and best against best).
For the write workload also ``effect_ms``, the effect alone (the same N new files written
by the same function with the same fsync, in a fresh folder beside each run's: creating a
file on this disk costs from 10 us to 300 us by where its folder lies), and
``harness_ms``, each run's ms per step less its effect: the system's own cost.
``writes_per_step``: commits per step on both sides, counted the same way in separate
untimed runs (every COMMIT SQLite runs on the system's connections: bench/_common.py
``SqlCommits``), and for LangGraph the saver's checkpoint writes (``put``, ``put_writes``).

Resume (``resume``): in a fresh process, interpreter start and imports excluded, the
same work on both sides for the largest N of the read workload (WAL/NORMAL): open the
store and rebuild the state the next step needs. Keel: ``open_store``, ``load_run``
(the folded state) and ``recent_transcript`` (the messages the next request is built
from); LangGraph: connect, ``SqliteSaver`` and its setup, then ``get_state`` (the latest
checkpoint's channel values, every message); compiling the graph is timed apart and
not counted. Also Keel's whole resume of a run waiting for an answer (lease, rebuild,
one more step to completion), Keel alone. Keel's peak traced memory (read workload).

Context build (``context_build``): for a Keel run of ``--context-events`` events (10,000)
in a small context (``context_tokens`` 4,000, so it holds many ``context_compacted``
events), the median over ``CONTEXT_REPEAT`` repetitions of what a resumed process does
before its first request — rebuild the transcript from the log back to the latest
compaction (``recent_transcript``), build the request's messages (``build_messages``) and
check whether it must compact (``plan_compaction``) — and of what a running driver does
before every request (the last two only). Target: at most 10 ms.

    .venv/bin/python bench/loop.py [--sizes 50,200,1000] [--repeat 5] [--no-langgraph]
        [--context-events N]
    .venv/bin/python bench/loop.py --context-only   # the context build alone
    .venv/bin/python bench/loop.py --middleware-only   # 5 no-op middleware against none
    .venv/bin/python bench/loop.py --tracing-only   # OTLP tracing on against off

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from _common import PAIRS, SqlCommits, db_bytes, durability_of, flatness, ratio, rotated, summary
from loop_langgraph import (
    GUARD,
    as_shipped,
    files_fsynced,
    langgraph_rebuild_child,
    langgraph_run,
    langgraph_saver,
    variants,
    write_arguments,
)

from keel.core.budget import Budget
from keel.core.events import Event, EventType
from keel.core.state import RunState
from keel.loop.catalog import offered_specs
from keel.loop.context import ContextBudget, plan_compaction
from keel.loop.prepare import build_messages, system_prompt
from keel.loop.token_estimate import specs_tokens
from keel.loop.transcript import recent_transcript
from keel.models.base import ModelRequest, ModelTurn, TokenUsage, ToolCall
from keel.runtime.harness import Harness
from keel.store.url import open_store
from keel.tools.base import Effect, ToolContext, ToolResult, tool
from keel.tools.control import ask_user
from keel.tools.files import write_file
from keel.tools.registry import ToolRegistry
from keel.tools.workspace import replace_in_workspace

WORKLOADS = {
    "read": "N x (model turn -> noop read tool -> result)",
    "write": "N x (model turn -> write_file of a new ~60-byte file -> result)",
}
WARMUP_STEPS = 50  # one untimed run per system and workload before any timed run
CONTEXT_TOKENS = 4_000  # the context of the context-build run: it compacts often
CONTEXT_REPEAT = 101  # repetitions of the context build (the median is reported)
NO_USAGE = TokenUsage(input_tokens=0, output_tokens=0)


@tool(effect=Effect.READ)
def noop(ctx: ToolContext, i: int) -> ToolResult:
    """Do nothing and say so (the benchmark's read tool).

    Args:
        i: The step number, so no two calls are the same.
    """
    return ToolResult(output=f"ok {i}")


class StepModel:
    """Scripted turns made on demand: step i calls noop(i) (the write workload:
    write_file of notes/i.txt); step N finishes (or asks). Each request must end with the
    result of the previous step's call, as a real model would need it."""

    def __init__(self, steps: int, *, ask_at_end: bool = False, workload: str = "read") -> None:
        self.spec = f"scripted:bench-{steps}"
        self.steps = steps
        self.ask_at_end = ask_at_end
        self.workload = workload

    def complete(self, request: ModelRequest) -> ModelTurn:
        step = request.step
        if step:
            last, asked = request.messages[-1], self.ask_at_end and step > self.steps
            expected = "ask" if asked else f"call_{step - 1}"
            assert last.role == "tool" and last.tool_call_id == expected, last
        if step < self.steps and self.workload == "write":
            arguments = json.dumps(write_arguments(step))
            return self._turn(
                None, (ToolCall(id=f"call_{step}", name="write_file", arguments=arguments),)
            )
        if step < self.steps:
            call = ToolCall(id=f"call_{step}", name="noop", arguments=json.dumps({"i": step}))
            return self._turn(None, (call,))
        if step == self.steps and self.ask_at_end:
            question = json.dumps({"question": "carry on?"})
            return self._turn(None, (ToolCall(id="ask", name="ask_user", arguments=question),))
        return self._turn("done", ())

    def _turn(self, content: str | None, calls: tuple[ToolCall, ...]) -> ModelTurn:
        return ModelTurn(content=content, tool_calls=calls, usage=NO_USAGE, cost=0.0, model="b")


def bench_registry(*, write: bool = False) -> ToolRegistry:
    """The read workload's tools; ``write``: with the built-in ``write_file`` as well."""
    return ToolRegistry([noop, ask_user, *([write_file] if write else [])])


# --- Keel ----------------------------------------------------------------------------------


def keel_run(
    steps: int,
    folder: Path,
    *,
    ask_at_end: bool = False,
    query: str = "",
    workload: str = "read",
    counter: SqlCommits | None = None,
) -> tuple[dict[str, Any], str]:
    """One timed run on a fresh file in ``folder``; with ``counter`` (a ``SqlCommits``
    watching since before the store opened), the run's commits are counted instead."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"keel-{steps}.db"
    marks: list[float] = []

    def on_event(event: Event, state: RunState) -> None:
        if event.type is EventType.MODEL_RESPONDED:
            marks.append(time.perf_counter())

    harness = Harness(
        store=f"sqlite:///{path}{query}",
        model=StepModel(steps, ask_at_end=ask_at_end, workload=workload),
        tools=bench_registry(write=workload == "write"),
        on_event=on_event,
    )
    with harness:
        empty = db_bytes(path)
        budget = Budget(max_steps=2 * steps + 10, max_tool_calls=2 * steps + 10)
        commits = counter.commits if counter is not None else 0
        gc.collect()
        started, cpu = time.perf_counter(), time.process_time()
        outcome = harness.run("benchmark", cwd=folder, budget=budget)
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
        commits = counter.commits - commits if counter is not None else 0
        expected = "waiting" if ask_at_end else "completed"
        assert outcome.status.value == expected, (outcome.status, outcome.stop_reason)
        assert outcome.state.usage.tool_calls == steps
    if workload == "write":
        assert len(list((folder / "notes").iterdir())) == steps
    if counter is not None:
        return {"commits_per_step": round(commits / steps, 2)}, outcome.id
    stored = db_bytes(path) - empty
    result = {
        "ms_per_step": round(elapsed / steps * 1000, 4),
        "cpu_ms_per_step": round(cpu / steps * 1000, 4),
        **flatness(marks),
        "bytes_per_step": round(stored / steps),
    }
    return result, outcome.id


def keel_peak_memory_kib(steps: int, folder: Path) -> float:
    """Peak Python allocations while a run of ``steps`` is driven (traced separately)."""
    harness = Harness(
        store=f"sqlite:///{folder / f'keel-mem-{steps}.db'}",
        model=StepModel(steps),
        tools=bench_registry(),
    )
    with harness:
        budget = Budget(max_steps=2 * steps + 10, max_tool_calls=2 * steps + 10)
        gc.collect()
        tracemalloc.start()
        harness.run("benchmark", cwd=folder, budget=budget)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return round(peak / 1024, 1)


def keel_rebuild_child(db: str, run_id: str) -> dict[str, float]:
    """In a fresh process: open the store and rebuild the state the next step needs (the
    folded state, and the transcript the next model request is built from)."""
    t0 = time.perf_counter()
    store = open_store(f"sqlite:///{db}")
    opened = time.perf_counter()
    state = store.load_run(run_id)
    transcript = recent_transcript(store, state)
    loaded = time.perf_counter()
    assert state.status.value == "waiting" and transcript.messages
    store.close()
    return {
        "rebuild_ms": round((loaded - t0) * 1000, 3),
        "open_ms": round((opened - t0) * 1000, 3),
        "load_ms": round((loaded - opened) * 1000, 3),
    }


def keel_resume_child(db: str, run_id: str, steps: int) -> dict[str, float]:
    """In a fresh process: answer the waiting run and resume it to completion."""
    harness = Harness(
        store=f"sqlite:///{db}", model=StepModel(steps, ask_at_end=True), tools=bench_registry()
    )
    harness.answer(run_id, "yes")
    t1 = time.perf_counter()
    outcome = harness.resume(run_id)
    resumed = time.perf_counter()
    assert outcome.status.value == "completed", outcome.stop_reason
    harness.close()
    return {"resume_to_completion_ms": round((resumed - t1) * 1000, 3)}


def keel_context_build(events: int, folder: Path) -> dict[str, Any]:
    """Median ms to build the next request's context for a run of ``events`` events."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "keel-context.db"
    per_step = 3  # model_requested, model_responded, tool_finished (a read: no tool_started)
    steps = events // per_step
    registry = bench_registry()
    with Harness(store=f"sqlite:///{path}", model=StepModel(steps), tools=registry) as harness:
        budget = Budget(max_steps=2 * steps + 10, max_tool_calls=2 * steps + 10)
        outcome = harness.run("benchmark", cwd=folder, budget=budget, context_tokens=CONTEXT_TOKENS)
        assert outcome.status.value == "completed", outcome.stop_reason
        run_id = outcome.id
    store = open_store(f"sqlite:///{path}")
    try:
        state = store.load_run(run_id)
        assert state.last_seq >= events, state.last_seq
        compactions = sum(
            1 for e in store.read_events(run_id) if e.type is EventType.CONTEXT_COMPACTED
        )
        tools = specs_tokens(offered_specs(registry))
        context = ContextBudget.of(state.options)

        def build(transcript: Any) -> None:
            system = system_prompt(state)
            build_messages(state, transcript, system=system)
            plan_compaction(state, transcript, system=system, specs_tokens=tools, budget=context)

        rebuild: list[float] = []
        live: list[float] = []
        for _ in range(CONTEXT_REPEAT):
            t0 = time.perf_counter()
            transcript = recent_transcript(store, state)
            build(transcript)
            t1 = time.perf_counter()
            build(transcript)
            t2 = time.perf_counter()
            rebuild.append(t1 - t0)
            live.append(t2 - t1)
    finally:
        store.close()
    return {
        "events": state.last_seq,
        "compactions": compactions,
        "context_tokens": CONTEXT_TOKENS,
        "rebuild_and_build_ms": round(_median(rebuild) * 1000, 3),
        "build_per_step_ms": round(_median(live) * 1000, 3),
        "target_ms": 10,
    }


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


# --- the comparison ------------------------------------------------------------------------


def run_system(
    system: str,
    steps: int,
    folder: Path,
    pair: str,
    workload: str,
    counter: SqlCommits | None = None,
) -> dict[str, Any]:
    """One run of ``system`` (keel, langgraph_default, langgraph_delta) at durability ``pair``.

    A timed write run also times the bare effect beside it (``effect_ms``, ``bare_writes``)
    and the step without it (``harness_ms``): what the file system charged that run.
    """
    synchronous = PAIRS[pair]["synchronous"]
    if system == "keel":
        query = PAIRS[pair]["keel_query"]
        result = keel_run(steps, folder, query=query, workload=workload, counter=counter)[0]
    else:
        result = langgraph_run(
            steps,
            folder,
            delta=system.endswith("delta"),
            synchronous=synchronous,
            workload=workload,
            counter=counter,
        )
    if workload == "write" and counter is None:
        effect = bare_writes(steps, folder.with_name(folder.name + "-bare"), synchronous)
        result["effect_ms"] = effect
        result["harness_ms"] = round(result["ms_per_step"] - effect, 4)
    return result


def bare_writes(steps: int, folder: Path, synchronous: str) -> float:
    """Ms per call of the write workload's effect alone: ``steps`` new files written by
    the function both systems' write tools call, with the same arguments and fsync, in a
    fresh folder next to the run's (new files cost what the folder's place on the disk
    makes them cost, which differs from folder to folder by several times on this disk)."""
    folder.mkdir(parents=True)
    fsync = files_fsynced(synchronous)
    started = time.perf_counter()
    for step in range(1, steps + 1):
        arguments = write_arguments(step)
        data = arguments["content"].encode()
        replace_in_workspace(folder, arguments["path"], data, GUARD, fsync=fsync)
    return round((time.perf_counter() - started) / steps * 1000, 4)


def run_folder(root: Path, pair: str, workload: str, system: str, n: int, i: int) -> Path:
    return root / pair / workload / system / f"{n}-{i}"


def durability(folder: Path, names: Sequence[str]) -> dict[str, Any]:
    """Each pair's settings as the connections of both sides report them."""
    report: dict[str, Any] = {}
    for pair, setting in PAIRS.items():
        path = folder / pair / "keel.db"
        with SqlCommits().watching() as watch:
            store = open_store(f"sqlite:///{path}{setting['keel_query']}")
            conn = next(c for c in watch.connections if _main_file(c) == str(path))
            fsynced = getattr(store, "fsyncs_commits", True)  # write_file's fsync follows it
            report[pair] = {"keel": {**durability_of(conn), "files_fsynced": fsynced}}
            store.close()
        if len(names) > 1:
            _, conn = langgraph_saver(folder / pair / "langgraph.db", setting["synchronous"])
            fsynced = files_fsynced(setting["synchronous"])
            report[pair]["langgraph"] = {**durability_of(conn), "files_fsynced": fsynced}
            conn.close()
    if len(names) > 1:
        conn = as_shipped(folder / "as-shipped.db")
        report["langgraph_as_shipped"] = durability_of(conn)
        conn.close()
    return report


def _main_file(conn: Any) -> str:
    return next(row[2] for row in conn.execute("PRAGMA database_list") if row[1] == "main")


def compare(names: Sequence[str], sizes: Sequence[int], repeat: int, root: Path) -> dict[str, Any]:
    """Every pair x workload x N: ``repeat`` runs of each system, alternated run by run."""
    for workload in WORKLOADS:  # the same warm-up for every system
        for system in names:
            run_system(
                system, WARMUP_STEPS, root / "warm-up" / workload / system, "wal_normal", workload
            )
    report: dict[str, Any] = {}
    for pair in PAIRS:
        report[pair] = {}
        for workload in WORKLOADS:
            report[pair][workload] = {}
            for n in sizes:
                runs: dict[str, list[dict[str, Any]]] = {s: [] for s in names}
                for i in range(repeat):
                    for system in rotated(names, i):
                        folder = run_folder(root, pair, workload, system, n, i)
                        runs[system].append(run_system(system, n, folder, pair, workload))
                report[pair][workload][str(n)] = figures(runs)
    return report


def figures(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Median and best per system; LangGraph against Keel (only ever within one pair)."""
    out: dict[str, Any] = {}
    for system, tries in runs.items():
        timed = ("ms_per_step", "cpu_ms_per_step", "first_steps_ms", "last_steps_ms")
        timed += ("effect_ms", "harness_ms") if "effect_ms" in tries[0] else ()
        out[system] = {key: summary([t[key] for t in tries]) for key in timed}
        out[system]["last_over_first"] = ratio(
            out[system]["last_steps_ms"]["median"], out[system]["first_steps_ms"]["median"]
        )
        out[system]["bytes_per_step"] = round(statistics.median(t["bytes_per_step"] for t in tries))
    out["keel_speedup"] = _speedup(out, "ms_per_step")
    return out


def _speedup(out: dict[str, Any], key: str) -> dict[str, Any]:
    keel = out["keel"][key]
    return {
        system: {
            "median": ratio(f[key]["median"], keel["median"]),
            "best": ratio(f[key]["best"], keel["best"]),
        }
        for system, f in out.items()
        if system.startswith("langgraph")
    }


def writes_per_step(names: Sequence[str], sizes: Sequence[int], root: Path) -> dict[str, Any]:
    """Commits per step (and LangGraph's checkpoint writes), counted in untimed runs."""
    report: dict[str, Any] = {}
    for workload in WORKLOADS:
        report[workload] = {system: {} for system in names}
        for n in sizes:
            for system in names:
                with SqlCommits().watching() as counter:
                    folder = run_folder(root, "counted", workload, system, n, 0)
                    figure = run_system(system, n, folder, "wal_normal", workload, counter)
                report[workload][system][str(n)] = figure
    return report


def resume(
    names: Sequence[str], steps: int, repeat: int, root: Path, timed: Path
) -> dict[str, Any]:
    """Rebuild in a fresh process, the same work on both sides (module docstring)."""
    _, run_id = keel_run(steps, root, ask_at_end=True)
    keel_db = root / f"keel-{steps}.db"
    peers = {
        s: run_folder(timed, "wal_normal", "read", s, steps, 0) / f"langgraph-{steps}.db"
        for s in names[1:]
    }

    def rebuild(system: str) -> dict[str, Any]:
        if system == "keel":
            return in_fresh_process("keel_rebuild", str(keel_db), run_id)
        return in_fresh_process("langgraph_rebuild", str(peers[system]), str(steps), system)

    for system in names:  # the same warm-up: one untimed rebuild each
        rebuild(system)
    tries: dict[str, list[dict[str, Any]]] = {s: [] for s in names}
    for i in range(repeat):
        for system in rotated(names, i):
            tries[system].append(rebuild(system))
    out: dict[str, Any] = {"steps": steps, "workload": "read", "durability": "wal_normal"}
    for system, runs in tries.items():
        out[system] = {key: summary([r[key] for r in runs], 3) for key in runs[0]}
    out["keel_speedup"] = _speedup(out, "rebuild_ms")
    completions = []
    db_bytes(keel_db)  # fold the WAL in: each repetition resumes its own copy
    for i in range(repeat):
        shutil.copyfile(keel_db, root / f"resume-{i}.db")
        completions.append(
            in_fresh_process("keel_resume", str(root / f"resume-{i}.db"), run_id, str(steps))
        )
    out["keel_resume_to_completion_ms"] = summary(
        [c["resume_to_completion_ms"] for c in completions], 3
    )
    return out


# --- driver --------------------------------------------------------------------------------


def in_fresh_process(*args: str) -> dict[str, Any]:
    """Run this script's ``--child`` mode in a new interpreter; its JSON answer."""
    proc = subprocess.run(
        [sys.executable, __file__, "--child", *args],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    answer: dict[str, Any] = json.loads(proc.stdout)
    return answer


def middleware_overhead() -> dict[str, Any]:
    """5 no-op middleware against none (bench/loop_middleware.py, beside this file)."""
    from loop_middleware import measure  # noqa: PLC0415 - it imports this module

    return measure()


def tracing_overhead() -> dict[str, Any]:
    """Tracing on (OTLP/HTTP to a loopback receiver) against off (bench/loop_tracing.py)."""
    from loop_tracing import measure  # noqa: PLC0415 - it imports this module

    return measure()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="50,200,1000")
    parser.add_argument("--no-langgraph", action="store_true")
    parser.add_argument(
        "--repeat",
        type=int,
        default=5,
        help="timed runs per system, workload, durability and N, alternated (median and best)",
    )
    parser.add_argument("--context-events", type=int, default=10_000)
    parser.add_argument("--context-only", action="store_true", help="only the context build")
    parser.add_argument(
        "--middleware-only", action="store_true", help="only 5 no-op middleware against none"
    )
    parser.add_argument(
        "--tracing-only", action="store_true", help="only OTLP tracing on against off"
    )
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(CHILDREN[args.child[0]](*args.child[1:])))
        return
    if args.context_only:
        with tempfile.TemporaryDirectory(prefix="keel-bench-context-") as tmp:
            figure = keel_context_build(args.context_events, Path(tmp))
        print(json.dumps({"keel": {"context_build": figure}}, indent=2))
        return
    if args.middleware_only:
        print(json.dumps({"keel": {"middleware": middleware_overhead()}}, indent=2))
        return
    if args.tracing_only:
        print(json.dumps({"keel": {"tracing": tracing_overhead()}}, indent=2))
        return
    sizes = [int(s) for s in args.sizes.split(",")]
    largest = max(sizes)
    names = ["keel", *([] if args.no_langgraph else variants())]
    report: dict[str, Any] = {
        "workloads": WORKLOADS,
        "systems": names,
        "method": {
            "repetitions": args.repeat,
            "warm_up": f"one untimed {WARMUP_STEPS}-step run per system and workload",
            "order": "systems alternated run by run, who goes first rotating",
            "keel_speedup": "LangGraph / Keel, median vs median and best vs best, "
            "only within one durability pair",
        },
    }
    if not args.no_langgraph and len(names) == 1:
        report["langgraph"] = "not installed: pip install -e '.[bench]'"
    with tempfile.TemporaryDirectory(prefix="keel-bench-loop-") as tmp:
        folder = Path(tmp)
        report["durability"] = durability(folder / "durability", names)
        report.update(compare(names, sizes, args.repeat, folder / "timed"))
        report["writes_per_step"] = writes_per_step(names, sizes, folder / "counted")
        report["resume"] = resume(names, largest, args.repeat, folder / "resume", folder / "timed")
        keel: dict[str, Any] = {}
        keel["peak_memory_kib"] = {str(n): keel_peak_memory_kib(n, folder) for n in sizes}
        keel["middleware"] = middleware_overhead()
        keel["tracing"] = tracing_overhead()
        keel["context_build"] = keel_context_build(args.context_events, folder / "context")
        report["keel"] = keel
    print(json.dumps(report, indent=2))


CHILDREN: dict[str, Callable[..., dict[str, Any]]] = {
    "keel_rebuild": keel_rebuild_child,
    "keel_resume": lambda db, run_id, steps: keel_resume_child(db, run_id, int(steps)),
    "langgraph_rebuild": lambda db, steps, variant: langgraph_rebuild_child(
        db, int(steps), variant
    ),
}


if __name__ == "__main__":
    main()
