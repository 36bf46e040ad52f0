"""A write that cannot work as asked is a tool error for the model, never a crash."""

from __future__ import annotations

from pathlib import Path

from keel.core.events import EventType
from keel.core.status import RunStatus
from keel.runtime.harness import Harness
from keel.store.sqlite.store import SQLiteStore
from keel.testing import ScriptedModel


def test_ambiguous_edit_is_reported_to_the_model_and_the_run_goes_on(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "a.txt").write_text("hello hello\n")
    turns = [
        {
            "tool_calls": [
                {
                    "name": "edit_file",
                    "arguments": {"path": "a.txt", "old_text": "hello", "new_text": "bye"},
                }
            ]
        },
        {"content": "gave up"},
    ]
    store = SQLiteStore(tmp_path / "keel.db")
    model = ScriptedModel(turns)
    outcome = Harness(store=store, model=model).run("edit", cwd=workspace)

    assert outcome.status is RunStatus.COMPLETED
    events = list(store.read_events(outcome.id))
    failed = [e.data for e in events if e.type is EventType.TOOL_FAILED]
    assert len(failed) == 1
    assert "2 times" in failed[0]["message"]
    assert not [e for e in events if e.type is EventType.TOOL_STARTED]
    assert (workspace / "a.txt").read_text() == "hello hello\n"
    told = [m for m in model.requests[1].messages if m.role == "tool"]
    assert "2 times" in (told[-1].content or "")
    store.close()
