"""A `keel run` SIGKILLed at each named fault point, resumed by `keel resume` in a new process.

Real subprocesses and a real SQLite file; only the model's decisions are scripted.
The crash is armed with KEEL_FAULT (no sleeps decide where it dies); KEEL_LEASE_TTL=1
lets the resume take over the dead process's lease a second later.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from keel.core.events import Event, EventType
from keel.core.state import RunState
from keel.core.status import RunStatus
from keel.runtime.harness import Harness
from keel.store.url import open_store
from keel.testing import ScriptedModel

KEEL = str(Path(sys.executable).with_name("keel"))
TIMEOUT_S = 60

WRITE_SCRIPT: list[dict[str, Any]] = [
    {
        "tool_calls": [
            {
                "name": "todo_write",
                "arguments": {"todos": [{"content": "say bye in a.txt", "status": "in_progress"}]},
            }
        ]
    },
    {"tool_calls": [{"name": "write_file", "arguments": {"path": "a.txt", "content": "bye\n"}}]},
    {"tool_calls": [{"name": "request_completion", "arguments": {"summary": "a.txt says bye"}}]},
]
WRITE_CALL = "call_1_0"

COMMAND_SCRIPT: list[dict[str, Any]] = [
    {
        "tool_calls": [
            {"name": "run_command", "arguments": {"argv": ["sh", "-c", "echo ran >> log.txt"]}}
        ]
    },
    {"tool_calls": [{"name": "request_completion", "arguments": {"summary": "logged"}}]},
]
COMMAND_CALL = "call_0_0"


@dataclass
class Workspace:
    root: Path
    store_url: str
    script: Path

    def keel(self, *args: str, fault: str | None = None, lease_ttl: str = "1") -> Any:
        env = {**os.environ, "KEEL_LEASE_TTL": lease_ttl}
        env.pop("KEEL_FAULT", None)
        if fault:
            env["KEEL_FAULT"] = fault
        return subprocess.run(
            [KEEL, *args, "--store", self.store_url],
            cwd=self.root,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            check=False,
        )

    def start(self, *, mode: str, verify: str, fault: str) -> str:
        """`keel run` armed to die at ``fault``; the run's id (it printed it first)."""
        proc = self.keel(
            "run",
            "say bye",
            "--model",
            f"scripted:{self.script}",
            "--mode",
            mode,
            "--verify",
            verify,
            "--json",
            fault=fault,
        )
        assert proc.returncode == -signal.SIGKILL, proc.stderr
        return str(json.loads(proc.stdout.splitlines()[0])["run_id"])

    def state(self, run_id: str) -> RunState:
        with open_store(self.store_url) as store:
            return store.load_run(run_id)

    def events(self, run_id: str) -> list[Event]:
        with open_store(self.store_url) as store:
            return store.read_events(run_id)

    def wait_lease_expired(self, run_id: str) -> None:
        deadline = time.monotonic() + 10
        with open_store(self.store_url) as store:
            while store.current_run_lease(run_id) is not None:
                assert time.monotonic() < deadline, "the dead process's lease never expired"
                time.sleep(0.05)


def make_workspace(tmp_path: Path, script: list[dict[str, Any]]) -> Workspace:
    root = tmp_path / "ws"
    root.mkdir()
    (root / "a.txt").write_text("hello\n")
    path = tmp_path / "script.json"
    path.write_text(json.dumps(script))
    return Workspace(root=root, store_url=f"sqlite:///{tmp_path / 'keel.db'}", script=path)


def assert_log_is_whole(ws: Workspace, run_id: str) -> list[Event]:
    """Gapless sequence, and the stored snapshot equals a fresh fold of the events."""
    events = ws.events(run_id)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert RunState.from_events(events).to_dict() == ws.state(run_id).to_dict()
    return events


def of_call(events: list[Event], kind: EventType, call_id: str) -> list[Event]:
    return [e for e in events if e.type is kind and e.data.get("call_id") == call_id]


# --- write_file: verify_then_continue ---------------------------------------------------


@pytest.mark.parametrize(
    ("fault", "effect_done_before_crash"),
    [
        ("after_tool_started:1", False),
        ("after_effect:2", True),  # the 1st effect point is todo_write's
        ("after_tool_finished:2", True),
        ("mid_model_step:2", False),  # the model asked for the write; the turn was lost
        # The turn after the write was lost, and with it the write's result (stored with
        # that turn): the resume finds the file as intended and records the call done.
        ("mid_model_step:3", True),
        ("during_verification:1", True),
    ],
)
def test_killed_write_run_resumes_to_completion_writing_the_file_once(
    tmp_path: Path, fault: str, effect_done_before_crash: bool
) -> None:
    ws = make_workspace(tmp_path, WRITE_SCRIPT)
    run_id = ws.start(mode="edit", verify="grep -q bye a.txt", fault=fault)
    crashed = ws.state(run_id)
    assert not crashed.status.terminal
    target = ws.root / "a.txt"
    assert (target.read_text() == "bye\n") is effect_done_before_crash
    before = target.stat()
    ws.wait_lease_expired(run_id)

    resumed = ws.keel("resume", run_id, "--json")

    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    final = ws.state(run_id)
    assert final.status is RunStatus.COMPLETED
    assert target.read_text() == "bye\n"
    after = target.stat()
    if effect_done_before_crash:  # not written again: same inode and mtime (writes rename)
        assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    events = assert_log_is_whole(ws, run_id)
    assert len(of_call(events, EventType.TOOL_FINISHED, WRITE_CALL)) == 1
    reruns = [
        e
        for e in of_call(events, EventType.CALL_RECONCILED, WRITE_CALL)
        if e.data["outcome"] == "rerun"
    ]
    assert len(reruns) == (1 if fault.startswith("after_tool_started") else 0)
    assert sum(e.type is EventType.RUN_RESUMED for e in events) == 1
    # Nothing was reset or double-counted by the crash and the resume.
    assert final.usage.steps == 3
    assert final.usage.tool_calls == 3
    assert final.mutation_revision == 1
    assert [t.content for t in final.todos] == ["say bye in a.txt"]
    assert [(v.command, v.passed, v.mutation_revision) for v in final.validations] == [
        ("grep -q bye a.txt", True, 1)
    ]
    assert final.result is not None and final.result["evidence"]


# --- run_command: manual ------------------------------------------------------------------


def log_lines(ws: Workspace) -> list[str]:
    log = ws.root / "log.txt"
    return log.read_text().splitlines() if log.exists() else []


@pytest.mark.sandboxed
@pytest.mark.parametrize(
    ("fault", "lines_after_crash"), [("after_tool_started:1", 0), ("after_effect:1", 1)]
)
def test_interrupted_command_is_asked_about_and_rerun_once_on_approval(
    tmp_path: Path, fault: str, lines_after_crash: int
) -> None:
    ws = make_workspace(tmp_path, COMMAND_SCRIPT)
    run_id = ws.start(mode="auto", verify="grep -q ran log.txt", fault=fault)
    assert len(log_lines(ws)) == lines_after_crash
    ws.wait_lease_expired(run_id)

    first = ws.keel("resume", run_id)
    assert first.returncode == 3, first.stdout + first.stderr
    waiting = ws.state(run_id)
    assert waiting.status is RunStatus.WAITING
    assert waiting.reason == f"unknown_outcome:{COMMAND_CALL}"
    assert waiting.pending is not None and waiting.pending.kind == "unknown_outcome"
    assert waiting.pending.arguments == {
        "argv": ["sh", "-c", "echo ran >> log.txt"],
        "timeout_seconds": None,
    }
    shown = ws.keel("show", run_id)
    assert COMMAND_CALL in shown.stdout and "run_command" in shown.stdout
    assert f"keel approve {run_id}" in shown.stdout
    listed = ws.keel("events", run_id, "--json")
    kinds = [json.loads(line)["type"] for line in listed.stdout.splitlines()]
    assert "approval_requested" in kinds

    again = ws.keel("resume", run_id)  # asking twice never runs it silently
    assert again.returncode == 3
    assert len(log_lines(ws)) == lines_after_crash

    approved = ws.keel("approve", run_id)
    assert approved.returncode == 0, approved.stderr
    done = ws.keel("resume", run_id)

    assert done.returncode == 0, done.stdout + done.stderr
    assert ws.state(run_id).status is RunStatus.COMPLETED
    assert len(log_lines(ws)) == lines_after_crash + 1  # re-run exactly once
    events = assert_log_is_whole(ws, run_id)
    assert len(of_call(events, EventType.TOOL_STARTED, COMMAND_CALL)) == 2
    assert len(of_call(events, EventType.TOOL_FINISHED, COMMAND_CALL)) == 1
    assert ws.state(run_id).usage.tool_calls == 2


@pytest.mark.sandboxed
def test_denied_interrupted_command_is_recorded_not_done_and_the_model_is_told(
    tmp_path: Path,
) -> None:
    ws = make_workspace(tmp_path, COMMAND_SCRIPT)
    run_id = ws.start(mode="auto", verify="grep -q ran log.txt", fault="after_effect:1")
    ws.wait_lease_expired(run_id)
    assert ws.keel("resume", run_id).returncode == 3

    denied = ws.keel("approve", run_id, "--deny", "--reason", "it already ran, I checked")
    assert denied.returncode == 0, denied.stderr
    model = ScriptedModel(COMMAND_SCRIPT)
    with Harness(store=ws.store_url, model=model) as harness:
        outcome = harness.resume(run_id)

    assert outcome.status is RunStatus.COMPLETED
    assert log_lines(ws) == ["ran"]  # never re-run
    events = assert_log_is_whole(ws, run_id)
    (reconciled,) = of_call(events, EventType.CALL_RECONCILED, COMMAND_CALL)
    assert reconciled.data["outcome"] == "not_done"
    told = [m.content or "" for m in model.requests[0].messages if m.role == "tool"]
    assert any("not done" in text and "it already ran, I checked" in text for text in told)


@pytest.mark.sandboxed
def test_command_finished_before_the_crash_is_not_asked_about(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path, COMMAND_SCRIPT)
    run_id = ws.start(mode="auto", verify="grep -q ran log.txt", fault="after_tool_finished:1")
    ws.wait_lease_expired(run_id)

    resumed = ws.keel("resume", run_id)

    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert log_lines(ws) == ["ran"]
    events = assert_log_is_whole(ws, run_id)
    assert not [e for e in events if e.type is EventType.APPROVAL_REQUESTED]
