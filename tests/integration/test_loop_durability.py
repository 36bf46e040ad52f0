"""Each step is in the store before the next model call; reads are batched, not lost."""

from __future__ import annotations

from pathlib import Path

from keel.core.events import EventType
from keel.core.status import RunStatus
from keel.models.base import ModelRequest, ModelTurn
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
