"""`keel run` and `keel resume` never print a traceback, whatever the model or workspace holds.

Each command is the real ``keel`` in its own process (keel.testing.cli.KeelWorkspace)
with a scripted model whose JSON spells lone surrogates, in a workspace with file
names that are not UTF-8; the store is the default SQLite file.
"""

from __future__ import annotations

import os
from pathlib import Path

from keel.core.events import EventType
from keel.core.status import RunStatus
from keel.models.base import ModelRequest, ModelTurn
from keel.runtime.harness import Harness
from keel.testing.cli import KeelWorkspace, call, expect, turn


def hostile_workspace(tmp_path: Path) -> KeelWorkspace:
    root = tmp_path / "ws"
    root.mkdir()
    (root / "notes.txt").write_text("remember the milk\n")
    with open(os.path.join(os.fsencode(root), b"caf\xe9.txt"), "wb") as handle:
        handle.write(b"latin-1 \xe9\n")
    os.mkdir(os.path.join(os.fsencode(root), b"tab\there"))
    return KeelWorkspace(root)


def test_keel_run_survives_hostile_model_output_without_a_traceback(tmp_path: Path) -> None:
    ws = hostile_workspace(tmp_path)
    model = ws.script(
        {
            "content": "looking \ud800 around",
            "tool_calls": [
                call("list_dir"),
                call("glob", pattern="**/*"),
                call("grep", pattern="milk|latin"),
                call("read_file", path="x" * 300),
                call("read_\udcff", path="notes.txt"),
                {"name": "read_file", "arguments": '{"path": "\\ud800"}'},
            ],
        },
        turn(call("read_file", path="caf\\xe9.txt"), call("list_dir", path="tab\\x09here")),
        {"content": "done \ud800"},
    )
    run_id, result = ws.start("look around", "--model", model, "--sandbox", "off")
    expect(result, 0)
    assert "Traceback" not in result.stderr
    state = ws.state(run_id)
    assert state.status is RunStatus.COMPLETED
    events = ws.events(run_id)
    outputs = [e.data["output"] for e in events if e.type is EventType.TOOL_FINISHED]
    assert "caf\\xe9.txt  (10 bytes)" in outputs[0] and "tab\\x09here/" in outputs[0]
    assert "caf\\xe9.txt" in outputs[1].splitlines()
    assert outputs[-2] == "     1\tlatin-1 \ufffd"
    assert outputs[-1] == "tab\\x09here is empty"
    kinds = [e.data["error_kind"] for e in events if e.type is EventType.TOOL_FAILED]
    assert kinds == ["invalid_arguments", "unknown_tool", "tool_error"]
    responded = [e.data for e in events if e.type is EventType.MODEL_RESPONDED]
    assert responded[0]["content"] == "looking \ufffd around" and responded[0]["sanitized"]


def test_keel_resume_reports_a_run_an_internal_error_failed(tmp_path: Path) -> None:
    ws = hostile_workspace(tmp_path)

    class Broken:
        spec = "broken:adapter"

        def complete(self, request: ModelRequest) -> ModelTurn:
            raise AttributeError("'NoneType' object has no attribute 'choices'")

    with Harness(store=ws.url, model=Broken()) as harness:
        outcome = harness.run("trip", cwd=ws.root, sandbox="off")
    assert outcome.status is RunStatus.FAILED

    result = ws.keel("resume", outcome.id)
    out = expect(result, 1)
    assert "Traceback" not in result.stderr
    reason = "internal_error: AttributeError: 'NoneType' object has no attribute 'choices'"
    assert reason in " ".join(out.split())
    assert ws.state(outcome.id).reason == reason
