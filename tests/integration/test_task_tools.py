"""Agents use the task graph through tools; the owner is the run, never the model."""

from __future__ import annotations

import json
from pathlib import Path

from keel.core.events import EventType
from keel.core.status import RunStatus
from keel.core.tasks import TaskStatus
from keel.runtime.harness import Harness
from keel.store.sqlite.store import SQLiteStore
from keel.testing import ScriptedModel


def _call(name: str, **arguments: object) -> dict[str, object]:
    return {"tool_calls": [{"name": name, "arguments": arguments}]}


def _tool_results(harness: Harness, run_id: str) -> list[dict[str, object]]:
    return [
        e.data
        for e in harness.events(run_id)
        if e.type in (EventType.TOOL_FINISHED, EventType.TOOL_FAILED)
    ]


def test_agent_claims_and_completes_as_its_run_and_learns_what_became_ready(
    tmp_path: Path,
) -> None:
    store = SQLiteStore(tmp_path / "keel.db")
    database = store.create_task("create database", actor="lead")
    api = store.create_task("write API", actor="lead", blocked_by=[database.id])
    turns = [
        _call("claim_task", task_id=api.id),  # blocked: the model is told by what
        _call("claim_task"),  # the oldest ready task: the database
        _call("complete_task", task_id=database.id, result="schema created"),
        {"content": "database done"},
    ]
    harness = Harness(store=store, model=ScriptedModel(turns))
    outcome = harness.run("work the graph", cwd=tmp_path)

    assert outcome.status is RunStatus.COMPLETED
    results = _tool_results(harness, outcome.id)
    assert results[0]["error_kind"] == "tool_error"
    assert database.id in str(results[0]["message"])
    claimed = json.loads(str(results[1]["output"]))["claimed"]
    assert claimed["id"] == database.id
    assert claimed["owner"] == f"run:{outcome.id}"
    now_ready = json.loads(str(results[2]["output"]))["now_ready"]
    assert [t["id"] for t in now_ready] == [api.id]
    done = store.get_task(database.id)
    assert done.status is TaskStatus.COMPLETED
    assert done.owner == f"run:{outcome.id}"
    store.close()


def test_model_cannot_forge_an_owner_or_complete_someone_elses_task(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "keel.db")
    task = store.create_task("write docs", actor="lead")
    held = store.claim_task(owner="alice@host", lease_seconds=600, task_id=task.id)
    assert held is not None
    turns = [
        _call("complete_task", task_id=task.id, owner="alice@host"),
        _call("complete_task", task_id=task.id),
        {"content": "tried"},
    ]
    harness = Harness(store=store, model=ScriptedModel(turns))
    outcome = harness.run("finish the docs", cwd=tmp_path)

    forged, refused = _tool_results(harness, outcome.id)[:2]
    assert forged["error_kind"] == "invalid_arguments"
    assert "owner" in str(forged["message"])
    assert refused["error_kind"] == "tool_error"
    assert "alice@host" in str(refused["message"])
    assert store.get_task(task.id).status is TaskStatus.IN_PROGRESS
    store.close()


def test_cycle_from_the_model_is_a_tool_error_naming_the_path(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "keel.db")
    a = store.create_task("a", actor="lead")
    b = store.create_task("b", actor="lead", blocked_by=[a.id])
    turns = [_call("add_dependency", task_id=a.id, blocked_by=[b.id]), {"content": "ok"}]
    harness = Harness(store=store, model=ScriptedModel(turns))
    outcome = harness.run("wire the graph", cwd=tmp_path)

    failure = _tool_results(harness, outcome.id)[0]
    assert failure["error_kind"] == "tool_error"
    assert f"{a.id} -> {b.id} -> {a.id}" in str(failure["message"])
    assert store.get_task(a.id).blocked_by == ()
    store.close()
