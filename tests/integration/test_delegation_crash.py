"""A parent SIGKILLed in the middle of a spawn, resumed in a new process: exactly one child.

`keel run` is a real subprocess killed by an armed fault point (KEEL_FAULT) between the
spawn's commit and the child's creation, and between the child's creation and the
``subagent_spawned`` record; `keel resume` in a new process must re-attach to the child
the first process made (or make the one it had not made yet) — never a second child
for one spawn, never a child run twice.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from keel.core.events import EventType
from keel.core.status import RunStatus
from keel.store.url import open_store
from keel.testing.agents import write_agent, write_script

KEEL = str(Path(sys.executable).with_name("keel"))
TIMEOUT_S = 90

CHILD = [
    {"tool_calls": [{"name": "write_file", "arguments": {"path": "note.txt", "content": "x\n"}}]},
    {"tool_calls": [{"name": "request_completion", "arguments": {"summary": "wrote note"}}]},
]
PARENT = [
    {"tool_calls": [{"name": "agent_spawn", "arguments": {"agent": "scribe", "task": "write"}}]},
    {"tool_calls": [{"name": "request_completion", "arguments": {"summary": "delegated"}}]},
]


def keel(
    ws: Path, store: str, *args: str, fault: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KEEL_STORE": store, "KEEL_LEASE_TTL": "1", "KEEL_TASK_LEASE": "1"}
    env.pop("KEEL_FAULT", None)
    if fault:
        env["KEEL_FAULT"] = fault
    return subprocess.run(
        [KEEL, *args],
        cwd=ws,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,  # the test reads the exit code (a SIGKILL is -9)
    )


# The first two kill the parent mid-spawn; the third kills the process while the child it
# runs in the foreground is mid-write (its tool_started committed, the effect not yet made):
# the resumed parent re-attaches, and the child is recovered like any run.
@pytest.mark.parametrize(
    "fault", ["before_child_run:1", "before_spawn_recorded:1", "after_tool_started:1"]
)
def test_parent_killed_mid_spawn_resumes_to_exactly_one_child(tmp_path: Path, fault: str) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    write_agent(ws, "scribe", script=CHILD, tools=["write_file"], workspace_kind="shared")
    parent_model = write_script(tmp_path / "parent.json", PARENT)
    store = f"sqlite:///{tmp_path / 'keel.db'}"

    crashed = keel(ws, store, "run", "delegate a note", "--model", parent_model, fault=fault)
    assert crashed.returncode == -9, crashed.stderr  # SIGKILL, no cleanup
    run_id = crashed.stdout.split()[0]

    resumed = keel(ws, store, "resume", run_id)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr

    s = open_store(store)
    try:
        parent = s.load_run(run_id)
        assert parent.status is RunStatus.COMPLETED
        children = s.child_runs(run_id)
        assert len(children) == 1, [c.run_id for c in children]
        child = children[0]
        assert child.status is RunStatus.COMPLETED
        events = s.read_events(run_id)
        spawned = [e for e in events if e.type is EventType.SUBAGENT_SPAWNED]
        finished = [e for e in events if e.type is EventType.SUBAGENT_FINISHED]
        assert [e.data["child_run_id"] for e in spawned] == [child.run_id]
        assert [e.data["child_run_id"] for e in finished] == [child.run_id]
        # the child's one write happened once
        child_events = s.read_events(child.run_id)
        writes = [e for e in child_events if e.type is EventType.TOOL_STARTED]
        assert len(writes) == 1  # started once; a crash mid-write is reconciled, not re-run
        assert (ws / "note.txt").read_text() == "x\n"
        tasks = [t for t in s.list_tasks() if (t.options or {}).get("child_of") == run_id]
        assert len(tasks) == 1 and tasks[0].run_id == child.run_id
        assert (
            json.loads(next(e for e in events if e.type is EventType.TOOL_FINISHED).data["output"])[
                "status"
            ]
            == "completed"
        )
    finally:
        s.close()
