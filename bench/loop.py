"""The agent loop's cost per durable step: Keel on SQLite next to LangGraph's SQLite checkpointer.

One workload for both: N steps of (model turn -> one tool call -> its result), then a
final answer. The model is scripted (deterministic turns, no network) and the tool is a
no-op read, so what is measured is the harness: deciding, recording, persisting.

- Keel: ``Harness`` on a SQLite file (WAL, synchronous=NORMAL, the default store); each
  step's events are committed before the next step starts.
  ``synchronous_full`` repeats it with ``?synchronous=full`` (an fsync per commit).
- LangGraph: a two-node StateGraph (model -> tool -> model ...) compiled with
  ``SqliteSaver``, invoked with ``durability="sync"`` so each step is persisted before
  the next (Keel's guarantee); with the default ``operator.add`` message channel and,
  if the installed version has it, with ``DeltaChannel``. Plain variants use the
  connection as ``SqliteSaver.from_conn_string`` opens it (rollback journal, fsync per
  commit); ``_wal`` variants put it in Keel's WAL/NORMAL mode, so only the harness differs.

Per N (50, 200, 1000): ms per step (total / N; Keel: best of ``--repeat`` runs), CPU ms
per step (the machine may be shared), the mean of the first and last 50 steps (Keel),
bytes stored per step (database file growth after a WAL checkpoint, / N), and
Keel's peak traced memory. Resume: in a fresh process, the time to rebuild the N=1000
run from its store (Keel: open store, load state, rebuild the model's transcript;
LangGraph: open saver, ``get_state``), and for Keel the whole resume of a run waiting
for an answer (lease, rebuild, one more step to completion) — interpreter start and
imports excluded.

Context build (``context_build``): for a Keel run of ``--context-events`` events (10,000)
in a small context (``context_tokens`` 4,000, so it holds many ``context_compacted``
events), the median over ``CONTEXT_REPEAT`` repetitions of what a resumed process does
before its first request — rebuild the transcript from the log back to the latest
compaction (``recent_transcript``), build the request's messages (``build_messages``) and
check whether it must compact (``plan_compaction``) — and of what a running driver does
before every request (the last two only). Target: at most 10 ms.

    .venv/bin/python bench/loop.py [--sizes 50,200,1000] [--no-langgraph] [--context-events N]
    .venv/bin/python bench/loop.py --context-only   # the context build alone
    .venv/bin/python bench/loop.py --middleware-only   # 5 no-op middleware against none

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import gc
import json
import operator
import sqlite3
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any, TypedDict

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
from keel.tools.registry import ToolRegistry

try:  # the peer: pip install -e '.[bench]'
    from langgraph.checkpoint.sqlite import SqliteSaver
    from langgraph.graph import END, START, StateGraph
except ImportError:  # pragma: no cover
    StateGraph = None
try:  # DeltaChannel arrived in later langgraph releases
    from langgraph.channels import DeltaChannel
except ImportError:  # pragma: no cover
    DeltaChannel = None

WINDOW = 50  # steps averaged at the start and the end of a run
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
    """Scripted turns made on demand: step i calls noop(i); step N finishes (or asks)."""

    def __init__(self, steps: int, *, ask_at_end: bool = False) -> None:
        self.spec = f"scripted:bench-{steps}"
        self.steps = steps
        self.ask_at_end = ask_at_end

    def complete(self, request: ModelRequest) -> ModelTurn:
        step = request.step
        if step < self.steps:
            call = ToolCall(id=f"call_{step}", name="noop", arguments=json.dumps({"i": step}))
            return self._turn(None, (call,))
        if step == self.steps and self.ask_at_end:
            question = json.dumps({"question": "carry on?"})
            return self._turn(None, (ToolCall(id="ask", name="ask_user", arguments=question),))
        return self._turn("done", ())

    def _turn(self, content: str | None, calls: tuple[ToolCall, ...]) -> ModelTurn:
        return ModelTurn(content=content, tool_calls=calls, usage=NO_USAGE, cost=0.0, model="b")


def bench_registry() -> ToolRegistry:
    return ToolRegistry([noop, ask_user])


def db_bytes(path: Path) -> int:
    """The database file's size once its WAL is folded in."""
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    return path.stat().st_size


# --- Keel ----------------------------------------------------------------------------------


def keel_run(
    steps: int, folder: Path, *, ask_at_end: bool = False, query: str = ""
) -> tuple[dict[str, Any], str]:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"keel-{steps}.db"
    marks: list[float] = []

    def on_event(event: Event, state: RunState) -> None:
        if event.type is EventType.MODEL_RESPONDED:
            marks.append(time.perf_counter())

    harness = Harness(
        store=f"sqlite:///{path}{query}",
        model=StepModel(steps, ask_at_end=ask_at_end),
        tools=bench_registry(),
        on_event=on_event,
    )
    with harness:
        empty = db_bytes(path)
        budget = Budget(max_steps=2 * steps + 10, max_tool_calls=2 * steps + 10)
        gc.collect()
        started, cpu = time.perf_counter(), time.process_time()
        outcome = harness.run("benchmark", cwd=folder, budget=budget)
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
        expected = "waiting" if ask_at_end else "completed"
        assert outcome.status.value == expected, (outcome.status, outcome.stop_reason)
        assert outcome.state.usage.tool_calls == steps
    stored = db_bytes(path) - empty
    result = {
        "ms_per_step": round(elapsed / steps * 1000, 4),
        "cpu_ms_per_step": round(cpu / steps * 1000, 4),
        "first_steps_ms": _window_ms(marks[: WINDOW + 1]),
        "last_steps_ms": _window_ms(marks[-(WINDOW + 1) :]),
        "bytes_per_step": round(stored / steps),
    }
    return result, outcome.id


def _window_ms(marks: Sequence[float]) -> float:
    return round((marks[-1] - marks[0]) / (len(marks) - 1) * 1000, 4)


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


def keel_resume_child(db: str, run_id: str, steps: int) -> dict[str, float]:
    """In a fresh process: rebuild the run, then resume it to completion (timed apart)."""
    t0 = time.perf_counter()
    store = open_store(f"sqlite:///{db}")
    opened = time.perf_counter()
    state = store.load_run(run_id)
    transcript = recent_transcript(store, state)
    rebuilt = time.perf_counter()
    assert state.status.value == "waiting" and transcript.messages
    store.close()

    harness = Harness(
        store=f"sqlite:///{db}", model=StepModel(steps, ask_at_end=True), tools=bench_registry()
    )
    harness.answer(run_id, "yes")
    t1 = time.perf_counter()
    outcome = harness.resume(run_id)
    resumed = time.perf_counter()
    assert outcome.status.value == "completed", outcome.stop_reason
    harness.close()
    return {
        "rebuild_ms": round((rebuilt - t0) * 1000, 2),
        "open_store_ms": round((opened - t0) * 1000, 2),
        "resume_to_completion_ms": round((resumed - t1) * 1000, 2),
    }


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


# --- LangGraph -----------------------------------------------------------------------------


def _concat(state: list[Any], writes: Sequence[list[Any]]) -> list[Any]:
    """Batching-invariant reducer for DeltaChannel: append every written message."""
    return [*state, *(m for batch in writes for m in batch)]


class DefaultState(TypedDict):
    messages: Annotated[list[Any], operator.add]
    step: int


if DeltaChannel is not None:

    class DeltaState(TypedDict):
        messages: Annotated[list[Any], DeltaChannel(_concat)]
        step: int


def langgraph_graph(steps: int, delta: bool, saver: Any) -> Any:
    def model(state: dict[str, Any]) -> dict[str, Any]:
        step = state["step"]
        if step >= steps:
            return {"messages": [{"kind": "assistant", "content": "done"}], "step": step + 1}
        call = {"id": f"call_{step}", "name": "noop", "arguments": json.dumps({"i": step})}
        message = {"kind": "assistant", "content": None, "calls": [call]}
        return {"messages": [message], "step": step + 1}

    def run_tool(state: dict[str, Any]) -> dict[str, Any]:
        call = state["messages"][-1]["calls"][0]
        i = json.loads(call["arguments"])["i"]
        return {"messages": [{"kind": "tool", "call_id": call["id"], "content": f"ok {i}"}]}

    def route(state: dict[str, Any]) -> str:
        return END if state["step"] > steps else "tool"

    builder = StateGraph(DeltaState if delta else DefaultState)
    builder.add_node("model", model)
    builder.add_node("tool", run_tool)
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", route, ["tool", END])
    builder.add_edge("tool", "model")
    return builder.compile(checkpointer=saver)


def langgraph_saver(path: Path, wal: bool) -> tuple[Any, sqlite3.Connection]:
    """The saver as ``SqliteSaver.from_conn_string`` makes it, or on Keel's WAL/NORMAL."""
    conn = sqlite3.connect(path, check_same_thread=False)
    if wal:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
    saver = SqliteSaver(conn)
    saver.setup()
    return saver, conn


def langgraph_run(steps: int, folder: Path, *, delta: bool, wal: bool) -> dict[str, Any]:
    path = (
        folder / f"langgraph-{'delta' if delta else 'default'}-{'wal' if wal else 'db'}-{steps}.db"
    )
    saver, conn = langgraph_saver(path, wal)
    graph = langgraph_graph(steps, delta, saver)
    config = {"configurable": {"thread_id": "bench"}, "recursion_limit": 2 * steps + 10}
    empty = db_bytes(path)
    gc.collect()
    started, cpu = time.perf_counter(), time.process_time()
    final = graph.invoke({"messages": [], "step": 0}, config, durability="sync")
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    assert len(final["messages"]) == 2 * steps + 1, len(final["messages"])
    conn.close()
    return {
        "ms_per_step": round(elapsed / steps * 1000, 4),
        "cpu_ms_per_step": round(cpu / steps * 1000, 4),
        "bytes_per_step": round((db_bytes(path) - empty) / steps),
        "db": str(path),
    }


def langgraph_resume_child(db: str, steps: int, delta: bool, wal: bool) -> dict[str, float]:
    t0 = time.perf_counter()
    saver, conn = langgraph_saver(Path(db), wal)
    graph = langgraph_graph(steps, delta, saver)
    snapshot = graph.get_state({"configurable": {"thread_id": "bench"}})
    rebuilt = time.perf_counter()
    assert len(snapshot.values["messages"]) == 2 * steps + 1
    conn.close()
    return {"rebuild_ms": round((rebuilt - t0) * 1000, 2)}


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


def ratio(a: float, b: float) -> float:
    return round(a / b, 1) if b else float("inf")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="50,200,1000")
    parser.add_argument("--no-langgraph", action="store_true")
    parser.add_argument("--repeat", type=int, default=3, help="Keel runs per N (best is kept)")
    parser.add_argument("--context-events", type=int, default=10_000)
    parser.add_argument("--context-only", action="store_true", help="only the context build")
    parser.add_argument(
        "--middleware-only", action="store_true", help="only 5 no-op middleware against none"
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
    sizes = [int(s) for s in args.sizes.split(",")]
    largest = max(sizes)
    report: dict[str, Any] = {"workload": "N x (model turn -> noop read tool -> result)"}
    with tempfile.TemporaryDirectory(prefix="keel-bench-loop-") as tmp:
        folder = Path(tmp)
        keel_run(20, folder)  # warm up imports and caches
        keel: dict[str, Any] = {}
        for n in sizes:
            tries = [keel_run(n, folder / f"try-{i}")[0] for i in range(args.repeat)]
            result = min(tries, key=lambda r: r["ms_per_step"])
            result["peak_memory_kib"] = keel_peak_memory_kib(n, folder)
            keel[str(n)] = result
        _, waiting_id = keel_run(largest, folder, ask_at_end=True)
        keel["resume"] = {
            "steps": largest,
            **in_fresh_process(
                "keel", str(folder / f"keel-{largest}.db"), waiting_id, str(largest)
            ),
        }
        keel["middleware"] = middleware_overhead()
        keel["synchronous_full"] = {
            str(n): keel_run(n, folder / "full", query="?synchronous=full")[0]["ms_per_step"]
            for n in sizes
        }
        small, big = keel[str(min(sizes))], keel[str(largest)]
        keel["growth_largest_vs_smallest"] = round(big["ms_per_step"] / small["ms_per_step"], 2)
        keel["context_build"] = keel_context_build(args.context_events, folder / "context")
        report["keel"] = keel

        if not args.no_langgraph and StateGraph is None:
            report["langgraph"] = "not installed: pip install -e '.[bench]'"
        elif not args.no_langgraph:
            variants = ["default", "default_wal"]
            variants += ["delta", "delta_wal"] if DeltaChannel is not None else []
            for variant in variants:
                lg: dict[str, Any] = {}
                for n in sizes:
                    lg[str(n)] = langgraph_run(
                        n, folder, delta=variant.startswith("delta"), wal=variant.endswith("_wal")
                    )
                db = lg[str(largest)]["db"]
                for n in sizes:
                    del lg[str(n)]["db"]
                lg["resume"] = {
                    "steps": largest,
                    **in_fresh_process("langgraph", db, str(largest), variant),
                }
                lg["keel_speedup_per_step"] = {
                    str(n): ratio(lg[str(n)]["ms_per_step"], keel[str(n)]["ms_per_step"])
                    for n in sizes
                }
                report[f"langgraph_{variant}"] = lg
            if DeltaChannel is None:
                report["langgraph_delta"] = "DeltaChannel not in the installed langgraph"
    print(json.dumps(report, indent=2))


CHILDREN: dict[str, Callable[..., dict[str, Any]]] = {
    "keel": lambda db, run_id, steps: keel_resume_child(db, run_id, int(steps)),
    "langgraph": lambda db, steps, variant: langgraph_resume_child(
        db, int(steps), variant.startswith("delta"), variant.endswith("_wal")
    ),
}


if __name__ == "__main__":
    main()
