"""Each step is in the store before the next model call; reads are batched, not lost."""

from __future__ import annotations

from pathlib import Path

from keel.core.events import EventType
from keel.core.status import RunStatus
from keel.models.base import ModelRequest, ModelTurn
from keel.runtime.decisions import cancel_run
from keel.runtime.harness import Harness
from keel.store.base import Store
from keel.store.sqlite.store import SQLiteStore
from keel.testing import ScriptedModel


class LogCheckingModel:
    """Before each turn, asserts the store already holds every earlier step."""

    spec = "scripted:log-checking"

    def __init__(self, store: Store, turns: list[dict[str, object]]) -> None:
        self.store = store
        self.inner = ScriptedModel(turns)
        self.run_id = ""
        self.seen: list[list[str]] = []

    def complete(self, request: ModelRequest) -> ModelTurn:
        run = self.store.list_runs()[0]
        kinds = [e.type.value for e in self.store.read_events(run.run_id)]
        self.seen.append(kinds)
        assert kinds.count("model_responded") == request.step
        assert kinds.count("tool_finished") + kinds.count("tool_failed") == request.step
        return self.inner.complete(request)


def test_a_read_step_is_stored_before_the_next_model_call(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("alpha\n")
    store = SQLiteStore(tmp_path / "keel.db")
    model = LogCheckingModel(
        store,
        [
            {"tool_calls": [{"name": "read_file", "arguments": {"path": "a.txt"}}]},
            {"tool_calls": [{"name": "list_dir", "arguments": {}}]},
            {"content": "read both"},
        ],
    )
    outcome = Harness(store=store, model=model).run("look around", cwd=tmp_path)

    assert outcome.status is RunStatus.COMPLETED
    assert len(model.seen) == 3
    events = store.read_events(outcome.id)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert [e.type for e in events].count(EventType.TOOL_FINISHED) == 2
    assert store.load_run(outcome.id).to_dict() == outcome.state.to_dict()
    store.close()


class CancellingModel:
    """Cancels the run from a second store connection while it is being asked."""

    spec = "scripted:cancelling"

    def __init__(self, db: Path, turns: list[dict[str, object]]) -> None:
        self.db = db
        self.inner = ScriptedModel(turns)

    def complete(self, request: ModelRequest) -> ModelTurn:
        other = SQLiteStore(self.db)
        run = other.list_runs()[0]
        cancel_run(other, run.run_id, "stopped by a person")
        other.close()
        return self.inner.complete(request)


def test_a_run_cancelled_mid_step_stops_without_acting(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("alpha\n")
    store = SQLiteStore(tmp_path / "keel.db")
    turns: list[dict[str, object]] = [
        {
            "tool_calls": [
                {"name": "write_file", "arguments": {"path": "a.txt", "content": "beta\n"}}
            ]
        },
        {"content": "done"},
    ]
    model = CancellingModel(tmp_path / "keel.db", turns)
    outcome = Harness(store=store, model=model).run("edit", cwd=tmp_path)

    assert outcome.status is RunStatus.CANCELLED
    assert outcome.stop_reason == "stopped by a person"
    assert (tmp_path / "a.txt").read_text() == "alpha\n"
    events = store.read_events(outcome.id)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert not [e for e in events if e.type is EventType.TOOL_STARTED]
    store.close()
