"""A write's result travels with the next durable commit; what that must never cost.

A write's ``tool_started`` (with its intent: the file hashes it will leave) is committed
before the effect; its result is stored with the next step's first commit, so a write
step costs one commit. These tests hold the two guarantees that rest on it: a person
who cancels while the model is thinking about the next step still finds the write's
result in the log (and nothing new started), and a crash before the result is stored
is repaired from the workspace, never by writing again (test_crash_recovery covers the
SIGKILL at each point).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from keel.core.events import EventType
from keel.core.status import RunStatus
from keel.models.base import ModelRequest, ModelTurn
from keel.models.scripted import ScriptedModel
from keel.runtime.harness import Harness


def write(path: str) -> dict[str, Any]:
    arguments = {"path": path, "content": f"{path}\n"}
    return {"tool_calls": [{"name": "write_file", "arguments": arguments}]}


class CancelledWhileThinking:
    """Plays the script; while asked for turn ``at``, a person cancels the run."""

    spec = "scripted:cancelled-while-thinking"

    def __init__(self, turns: list[dict[str, Any]], at: int) -> None:
        self.script = ScriptedModel(turns, spec=self.spec)
        self.at = at
        self.harness: Harness | None = None
        self.run_id = ""

    def complete(self, request: ModelRequest) -> ModelTurn:
        if request.step == self.at and self.harness is not None:
            self.harness.cancel(self.run_id, "the person changed their mind")
        return self.script.complete(request)


def test_a_cancel_while_the_model_thinks_keeps_the_write_result_and_starts_nothing(
    tmp_path: Path,
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    model = CancelledWhileThinking([write("one.txt"), write("two.txt")], at=1)
    with Harness(store=f"sqlite:///{tmp_path}/keel.db", model=model) as h:
        model.harness = h
        state = h.create("write two files", cwd=ws)
        model.run_id = state.run_id
        final = h.execute(state.run_id)
        events = list(h.events(state.run_id))

    assert final.status is RunStatus.CANCELLED
    started = [e.data["arguments"]["path"] for e in events if e.type is EventType.TOOL_STARTED]
    finished = [e.data for e in events if e.type is EventType.TOOL_FINISHED]
    assert started == ["one.txt"]  # the second write never started
    assert [f["arguments"]["path"] for f in finished] == ["one.txt"]  # the first is on record
    assert list(finished[0]["changed_files"]) == ["one.txt"]
    assert final.state.changed_files.keys() == {"one.txt"} and final.state.mutation_revision == 1
    assert not (ws / "two.txt").exists()
    # The cancel came after the write's result in time but is recorded before it: the log
    # is what the store accepted, and a started call's outcome stays recordable.
    kinds = [e.type for e in events]
    assert kinds.index(EventType.STATUS_CHANGED, kinds.index(EventType.TOOL_STARTED)) < (
        kinds.index(EventType.TOOL_FINISHED)
    )


def test_the_next_request_shows_the_write_result_not_yet_stored(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    seen_stored: list[bool] = []

    class Looking(ScriptedModel):
        def complete(self, request: ModelRequest) -> ModelTurn:
            if request.step == 1:  # the turn after the write: is its result in the log?
                assert harness is not None
                stored = list(harness.events(run_id))
                seen_stored.append(any(e.type is EventType.TOOL_FINISHED for e in stored))
            return super().complete(request)

    done = {"tool_calls": [{"name": "request_completion", "arguments": {"summary": "ok"}}]}
    model = Looking([write("one.txt"), done], spec="scripted:looking")
    harness: Harness | None = None
    with Harness(store=f"sqlite:///{tmp_path}/keel.db", model=model) as h:
        harness = h
        run_id = h.create("write a file", cwd=ws).run_id
        final = h.execute(run_id)
    assert final.status is RunStatus.COMPLETED
    assert seen_stored == [False]  # the write's result waits for the next commit ...
    shown = [m for m in model.requests[1].messages if m.role == "tool"]
    assert len(shown) == 1 and "one.txt" in (shown[0].content or "")  # ... yet the model sees it


def test_a_message_racing_a_deferred_result_is_shown_once_after_it(tmp_path: Path) -> None:
    # A person writes to the run while the model thinks after a write: the driver's commit
    # loses the race, catches up, and the next request shows the write's result and the
    # message, each once, in that order.
    ws = tmp_path / "ws"
    ws.mkdir()
    done = {"tool_calls": [{"name": "request_completion", "arguments": {"summary": "ok"}}]}

    class Messaged(ScriptedModel):
        def complete(self, request: ModelRequest) -> ModelTurn:
            if request.step == 1:
                assert harness is not None
                harness.message(run_id, "also add a changelog line")
            return super().complete(request)

    model = Messaged([write("one.txt"), write("two.txt"), done], spec="scripted:messaged")
    harness: Harness | None = None
    with Harness(store=f"sqlite:///{tmp_path}/keel.db", model=model) as h:
        harness = h
        run_id = h.create("write files", cwd=ws).run_id
        final = h.execute(run_id)
    assert final.status is RunStatus.COMPLETED
    after = [(m.role, m.content or "") for m in model.requests[2].messages[2:]]
    tools = [text for role, text in after if role == "tool"]
    users = [text for role, text in after if role == "user"]
    assert len(tools) == 2 and "one.txt" in tools[0] and "two.txt" in tools[1]
    assert sum("also add a changelog line" in text for text in users) == 1
    assert (ws / "one.txt").exists() and (ws / "two.txt").exists()
