"""LangGraph's side of bench/loop.py: the same workloads in a StateGraph with SqliteSaver.

A two-node graph (model -> tool -> model ...) compiled with ``SqliteSaver`` and invoked
with ``durability="sync"``, so each step is persisted before the next (Keel's
guarantee). Two message channels: the default ``operator.add`` list and, when the
installed langgraph has it, ``DeltaChannel``. The model node makes the same scripted
turns as Keel's ``StepModel``; the tool node does what Keel's tool does:

- read: returns ``ok {i}`` (Keel's no-op read tool);
- write: writes the same small file with the same function Keel's ``write_file`` uses
  (``keel.tools.workspace.replace_in_workspace``: a temporary file created next to the
  target and renamed over it), with the fsync choice Keel makes (the data and the
  directory fsynced only when the store fsyncs its commits: ``wal_full``), so both
  sides make the same system calls.

The saver's connection gets the durability of the pair being measured (bench/_common.py
``PAIRS``): WAL, and synchronous NORMAL or FULL.
"""

from __future__ import annotations

import gc
import json
import operator
import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, TypedDict

from _common import db_bytes, flatness

from keel.core.guard import PathGuard
from keel.tools.workspace import replace_in_workspace

try:  # the peer: pip install -e '.[bench]'
    from langgraph.checkpoint.sqlite import SqliteSaver
    from langgraph.graph import END, START, StateGraph
except ImportError:  # pragma: no cover
    StateGraph = None
try:  # DeltaChannel arrived in later langgraph releases
    from langgraph.channels import DeltaChannel
except ImportError:  # pragma: no cover
    DeltaChannel = None

GUARD = PathGuard()


def write_arguments(step: int) -> dict[str, str]:
    """The write workload's call at ``step``: a new small file (about 60 bytes)."""
    return {"path": f"notes/{step}.txt", "content": f"step {step}: a small note the agent keeps.\n"}


def variants() -> list[str]:
    """The LangGraph systems this install can run."""
    if StateGraph is None:
        return []
    return ["langgraph_default", *(["langgraph_delta"] if DeltaChannel is not None else [])]


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


def langgraph_graph(
    steps: int,
    delta: bool,
    saver: Any,
    *,
    workload: str = "read",
    workspace: Path | None = None,
    marks: list[float] | None = None,
    fsync: bool = True,
) -> Any:
    def model(state: dict[str, Any]) -> dict[str, Any]:
        if marks is not None:
            marks.append(time.perf_counter())
        step = state["step"]
        if step >= steps:
            return {"messages": [{"kind": "assistant", "content": "done"}], "step": step + 1}
        if workload == "write":
            call = {"id": f"call_{step}", "name": "write_file"}
            call["arguments"] = json.dumps(write_arguments(step))
        else:
            call = {"id": f"call_{step}", "name": "noop", "arguments": json.dumps({"i": step})}
        message = {"kind": "assistant", "content": None, "calls": [call]}
        return {"messages": [message], "step": step + 1}

    def run_tool(state: dict[str, Any]) -> dict[str, Any]:
        call = state["messages"][-1]["calls"][0]
        arguments = json.loads(call["arguments"])
        if call["name"] == "write_file":
            assert workspace is not None
            data = arguments["content"].encode()
            where = arguments["path"]
            rel, existed = replace_in_workspace(workspace, where, data, GUARD, fsync=fsync)
            output = f"{'overwrote' if existed else 'created'} {rel} ({len(data)} bytes)"
        else:
            output = f"ok {arguments['i']}"
        return {"messages": [{"kind": "tool", "call_id": call["id"], "content": output}]}

    def route(state: dict[str, Any]) -> str:
        return END if state["step"] > steps else "tool"

    builder = StateGraph(DeltaState if delta else DefaultState)
    builder.add_node("model", model)
    builder.add_node("tool", run_tool)
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", route, ["tool", END])
    builder.add_edge("tool", "model")
    return builder.compile(checkpointer=saver)


def files_fsynced(synchronous: str) -> bool:
    """As Keel's write_file does: fsync a written file when the store fsyncs commits."""
    return synchronous == "FULL"


def langgraph_saver(path: Path, synchronous: str) -> tuple[Any, sqlite3.Connection]:
    """The saver on a connection in WAL with ``synchronous`` (NORMAL or FULL), set up."""
    conn = sqlite3.connect(path, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={synchronous}")
    saver = SqliteSaver(conn)
    saver.setup()
    return saver, conn


def as_shipped(path: Path) -> sqlite3.Connection:
    """A connection as ``SqliteSaver.from_conn_string`` opens it, after the saver's setup."""
    conn = sqlite3.connect(path, check_same_thread=False)
    SqliteSaver(conn).setup()
    return conn


def langgraph_run(
    steps: int,
    folder: Path,
    *,
    delta: bool,
    synchronous: str,
    workload: str = "read",
    counter: Any = None,
) -> dict[str, Any]:
    """One timed run on a fresh file in ``folder``; with ``counter`` (a ``SqlCommits``
    watching), the commits and the saver's checkpoint writes are counted instead."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"langgraph-{steps}.db"
    saver, conn = langgraph_saver(path, synchronous)
    puts = {"put": 0, "put_writes": 0}
    if counter is not None:
        for name in puts:
            original = getattr(saver, name)

            def counted(*args: Any, _name: str = name, _f: Any = original, **kw: Any) -> Any:
                puts[_name] += 1
                return _f(*args, **kw)

            setattr(saver, name, counted)
    marks: list[float] = []
    graph = langgraph_graph(
        steps,
        delta,
        saver,
        workload=workload,
        workspace=folder,
        marks=marks,
        fsync=files_fsynced(synchronous),
    )
    config = {"configurable": {"thread_id": "bench"}, "recursion_limit": 2 * steps + 10}
    empty = db_bytes(path)
    commits = counter.commits if counter is not None else 0
    gc.collect()
    started, cpu = time.perf_counter(), time.process_time()
    final = graph.invoke({"messages": [], "step": 0}, config, durability="sync")
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    assert len(final["messages"]) == 2 * steps + 1, len(final["messages"])
    if workload == "write":
        assert len(list((folder / "notes").iterdir())) == steps
    conn.close()
    if counter is not None:
        return {
            "commits_per_step": round((counter.commits - commits) / steps, 2),
            "checkpoint_puts_per_step": round(puts["put"] / steps, 2),
            "put_writes_per_step": round(puts["put_writes"] / steps, 2),
        }
    return {
        "ms_per_step": elapsed / steps * 1000,
        "cpu_ms_per_step": cpu / steps * 1000,
        **flatness(marks),
        "bytes_per_step": (db_bytes(path) - empty) / steps,
    }


def langgraph_rebuild_child(db: str, steps: int, variant: str) -> dict[str, float]:
    """In a fresh process: open the saver on the file and rebuild the state the next
    node reads (``get_state``: the latest checkpoint's channel values, every message)."""
    t0 = time.perf_counter()
    saver, conn = langgraph_saver(Path(db), "NORMAL")
    opened = time.perf_counter()
    graph = langgraph_graph(steps, variant.endswith("delta"), saver)  # apart: not rebuilding
    compiled = time.perf_counter()
    snapshot = graph.get_state({"configurable": {"thread_id": "bench"}})
    loaded = time.perf_counter()
    assert len(snapshot.values["messages"]) == 2 * steps + 1
    conn.close()
    return {
        "rebuild_ms": round((opened - t0 + loaded - compiled) * 1000, 3),
        "open_ms": round((opened - t0) * 1000, 3),
        "load_ms": round((loaded - compiled) * 1000, 3),
        "compile_graph_ms": round((compiled - opened) * 1000, 3),
    }
