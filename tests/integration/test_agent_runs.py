"""A top-level run that follows an agent spec: the spec's contract, enforced in code.

Real SQLite file, real workspace files, the real ``keel`` command; only the model's
turns are scripted.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from keel.core.budget import Budget
from keel.core.errors import ConfigError
from keel.core.events import EventType
from keel.runtime.harness import Harness
from keel.store.url import open_store
from keel.testing import ScriptedModel
from keel.testing.cli import KeelWorkspace, call, expect, turn

SPEC = """---
description: Fixes one file and reports what it changed.
tools: [read_file, write_file]
mode: auto
workspace: shared
budget:
  steps: 7
verify: ["test -f fixed.txt"]
output:
  type: object
  required: [changed]
  properties:
    changed: {type: array, items: {type: string}}
---
You fix exactly one file. Never touch anything else.
"""


def workspace_with_spec(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    (ws / ".keel" / "agents").mkdir(parents=True)
    (ws / ".keel" / "agents" / "fixer.md").write_text(SPEC)
    return ws


def test_a_run_of_an_agent_spec_gets_its_instructions_tools_mode_budget_and_schema(
    tmp_path: Path,
) -> None:
    ws = workspace_with_spec(tmp_path)
    model = ScriptedModel(
        [
            turn(call("run_command", argv=["touch", "evil.txt"])),  # not the spec's tool
            turn(call("write_file", path="fixed.txt", content="ok\n")),
            turn(call("request_completion", summary="fixed", output={"changed": 3})),
            turn(call("request_completion", summary="fixed", output={"changed": ["fixed.txt"]})),
        ]
    )
    harness = Harness(store=f"sqlite:///{tmp_path / 'keel.db'}", model=model)
    try:
        outcome = harness.run("fix the config", cwd=ws, mode="edit", agent="fixer")
        state = outcome.state
        events = list(harness.events(state.run_id))
    finally:
        harness.close()

    assert state.status.value == "completed", state.reason
    offered = {tool.name for tool in model.requests[0].tools}
    assert offered == {"read_file", "write_file", "request_completion"}
    assert state.mode == "edit"  # the spec's auto is never wider than the mode asked for
    assert state.options.budget == Budget(max_steps=7, max_tool_calls=200)
    assert state.options.verify == ("test -f fixed.txt",)
    assert state.options.agent is not None
    assert state.options.agent["digest"] == hashlib.sha256(SPEC.encode()).hexdigest()
    assert state.goal.startswith("You fix exactly one file.") and "fix the config" in state.goal
    assert not (ws / "evil.txt").exists()
    failures = [e.data for e in events if e.type is EventType.TOOL_FAILED]
    assert [f["error_kind"] for f in failures] == ["unknown_tool", "invalid_output"]
    assert state.result is not None and state.result["output"] == {"changed": ["fixed.txt"]}


def test_an_unknown_or_broken_spec_is_refused_before_anything_is_stored(tmp_path: Path) -> None:
    ws = workspace_with_spec(tmp_path)
    (ws / ".keel" / "agents" / "broken.md").write_text("---\ndescription: x\nmode: yolo\n---\nhi\n")
    url = f"sqlite:///{tmp_path / 'keel.db'}"
    harness = Harness(store=url, model=ScriptedModel([]))
    try:
        with pytest.raises(ConfigError, match=r"no agent named 'nobody'.*fixer"):
            harness.create("x", cwd=ws, agent="nobody")
        with pytest.raises(ConfigError, match=r"broken\.md:3"):
            harness.create("x", cwd=ws, agent="broken")
        with pytest.raises(ConfigError, match="not allowed"):
            harness.create("x", cwd=ws, agent="../fixer")
    finally:
        harness.close()
    store = open_store(url)
    try:
        assert store.list_runs() == []
    finally:
        store.close()


def test_keel_run_agent_uses_the_specs_budget_unless_one_is_given(tmp_path: Path) -> None:
    ws = KeelWorkspace(tmp_path)
    (ws.root / ".keel" / "agents").mkdir(parents=True)
    (ws.root / ".keel" / "agents" / "fixer.md").write_text(SPEC)
    script = ws.script(turn(call("request_completion", summary="nothing", output={"changed": []})))

    spec_budget = json.loads(
        expect(ws.keel("run", "x", "--agent", "fixer", "--model", script, "--detach", "--json"), 0)
    )["run_id"]
    given = json.loads(
        expect(
            ws.keel(
                "run",
                "x",
                "--agent",
                "fixer",
                "--model",
                script,
                "--max-steps",
                "3",
                "--detach",
                "--json",
            ),
            0,
        )
    )["run_id"]
    refused = ws.keel("run", "x", "--agent", "nobody", "--model", script, "--detach")
    assert refused.returncode == 2 and "no agent named 'nobody'" in refused.stderr

    store = open_store(ws.url)
    try:
        assert store.load_run(spec_budget).options.budget.max_steps == 7
        assert store.load_run(given).options.budget.max_steps == 3
        assert len(store.list_runs()) == 2
    finally:
        store.close()


# --- a run's tool allowlist (keel run --tools) ----------------------------------------------


def test_a_tool_allowlist_limits_what_is_offered_and_what_may_be_called(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "notes.txt").write_text("hello\n")
    model = ScriptedModel(
        [
            turn(call("write_file", path="notes.txt", content="overwritten\n")),
            turn(call("read_file", path="notes.txt")),
            turn(call("request_completion", summary="read it")),
        ]
    )
    harness = Harness(store=f"sqlite:///{tmp_path / 'keel.db'}", model=model)
    try:
        outcome = harness.run("read the notes", cwd=ws, mode="auto", tools=["grep", "read_file"])
        events = list(harness.events(outcome.state.run_id))
    finally:
        harness.close()

    assert outcome.state.status.value == "completed", outcome.state.reason
    assert outcome.state.options.tools == ("read_file", "grep", "request_completion")
    for request in model.requests:
        assert {t.name for t in request.tools} == {"read_file", "grep", "request_completion"}
    [refused] = [e.data for e in events if e.type is EventType.TOOL_FAILED]
    assert refused["error_kind"] == "unknown_tool" and refused["tool"] == "write_file"
    assert (ws / "notes.txt").read_text() == "hello\n"  # the unlisted write never ran


def test_an_allowlist_narrows_an_agent_spec_and_bad_names_are_refused(tmp_path: Path) -> None:
    ws = workspace_with_spec(tmp_path)
    url = f"sqlite:///{tmp_path / 'keel.db'}"
    harness = Harness(store=url, model=ScriptedModel([]))
    try:
        both = harness.create("x", cwd=ws, agent="fixer", tools=["read_file", "grep"])
        assert both.options.tools == ("read_file", "request_completion")  # grep: not the spec's
        with pytest.raises(ConfigError, match=r"unknown tools 'nope', 'rm_rf' .*read_file"):
            harness.create("x", cwd=ws, tools=["read_file", "nope", "rm_rf"])
        with pytest.raises(ConfigError, match="allowlist is empty"):
            harness.create("x", cwd=ws, tools=[" ", ""])
    finally:
        harness.close()
    store = open_store(url)
    try:
        assert [run.run_id for run in store.list_runs()] == [both.run_id]
    finally:
        store.close()


def test_keel_run_tools_takes_a_comma_separated_list(tmp_path: Path) -> None:
    ws = KeelWorkspace(tmp_path)
    script = ws.script(turn(call("request_completion", summary="done")))
    listed = json.loads(
        expect(
            ws.keel("run", "x", "--tools", "grep,glob", "--model", script, "--detach", "--json"),
            0,
        )
    )["run_id"]
    assert ws.state(listed).options.tools == ("glob", "grep", "request_completion")
    refused = ws.keel("run", "x", "--tools", "grep,sudo", "--model", script, "--detach")
    assert refused.returncode == 2 and "unknown tool 'sudo'" in refused.stderr
