"""Each step is in the store before the next model call; reads are batched, not lost."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from keel.core.events import EventType
from keel.core.status import RunStatus
from keel.models.base import ModelRequest, ModelTurn
from keel.runtime.decisions import cancel_run
from keel.runtime.harness import Harness
from keel.store.base import Store
from keel.store.sqlite.store import SQLiteStore
from keel.testing import ScriptedModel
from keel.tools import Effect, Recovery, ToolContext, ToolResult, default_registry, tool


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


def test_a_write_calls_turn_and_start_are_one_commit_before_the_effect(tmp_path: Path) -> None:
    """The model's turn is stored in the same transaction as its write's ``tool_started``
    — both before the effect — and the result in the next: two commits for the step."""

    store = SQLiteStore(tmp_path / "keel.db")
    seen: list[list[str]] = []

    @tool(effect=Effect.WRITE, recovery=Recovery.MANUAL)
    def stamp(ctx: ToolContext, text: str) -> ToolResult:
        """Write a stamp.

        Args:
            text: what to stamp
        """
        seen.append([e.type.value for e in store.read_events(ctx.run_id)])
        return ToolResult(output=f"stamped {text}")

    registry = default_registry()
    registry.register(stamp)
    appended: list[list[str]] = []
    real_append = store.append_folded

    def counting_append(run_id: str, step: Any, **kw: Any) -> Any:
        appended.append([e.type.value for e in step.events])
        return real_append(run_id, step, **kw)

    store.append_folded = counting_append  # type: ignore[method-assign]
    model = ScriptedModel(
        [{"tool_calls": [{"name": "stamp", "arguments": {"text": "a"}}]}, {"content": "done"}]
    )
    outcome = Harness(store=store, model=model, tools=registry).run("stamp", cwd=tmp_path)

    assert outcome.status is RunStatus.COMPLETED
    assert seen[0][-3:] == ["model_requested", "model_responded", "tool_started"]
    step = [kinds for kinds in appended if {"tool_started", "tool_finished"} & set(kinds)]
    assert len(step) == 2
    assert step[0][-3:] == ["model_requested", "model_responded", "tool_started"]
    assert step[1] == ["tool_finished"]
    store.close()


def test_file_writes_are_fsynced_only_when_the_store_fsyncs_its_commits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    real = os.fsync

    def counting(fd: int) -> None:
        calls.append(fd)
        real(fd)

    write = {"tool_calls": [{"name": "write_file", "arguments": {"path": "a.txt", "content": "x"}}]}
    counts = {}
    for mode in ("normal", "full"):
        (tmp_path / mode).mkdir()
        model = ScriptedModel([write, {"content": "done"}])
        url = f"sqlite:///{tmp_path / mode / 'keel.db'}?synchronous={mode}"
        with Harness(store=url, model=model) as harness:
            assert harness.store.fsyncs_commits is (mode == "full")
            monkeypatch.setattr(os, "fsync", counting)
            outcome = harness.run("write", cwd=tmp_path / mode)
            monkeypatch.setattr(os, "fsync", real)
        assert outcome.status is RunStatus.COMPLETED
        counts[mode] = len(calls)
        calls.clear()
    # FULL: the file and its directory (SQLite's own fsyncs do not go through os.fsync).
    assert counts == {"normal": 0, "full": 2}
