"""Budgets and no-progress detection through the whole loop, on a real SQLite file.

Every budget dimension ends the run ``failed`` with its own reason and the unfinished
todos; the model is warned at 80 %. Repeating the same call or error is detected, the
model is told to replan, and a run that still repeats is failed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from keel.core.budget import Budget
from keel.core.events import Event, EventType
from keel.core.status import RunStatus
from keel.models.base import ModelRequest
from keel.models.scripted import ScriptedModel
from keel.runtime.harness import Harness, RunOutcome

TODOS = {
    "todos": [
        {"content": "read the code", "status": "completed"},
        {"content": "fix the bug", "status": "in_progress"},
        {"content": "add a test", "status": "pending"},
    ]
}


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    for name in ("a.txt", "b.txt", "c.txt", "d.txt"):
        (ws / name).write_text(name, encoding="utf-8")
    return ws


def turn(*calls: tuple[str, dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"tool_calls": [{"name": n, "arguments": a} for n, a in calls], **extra}


def read(path: str) -> tuple[str, dict[str, Any]]:
    return ("read_file", {"path": path})


def drive(
    tmp_path: Path, workspace: Path, turns: list[dict[str, Any]], **options: Any
) -> tuple[RunOutcome, list[Event], ScriptedModel]:
    model = ScriptedModel(turns)
    with Harness(store=f"sqlite:///{tmp_path}/keel.db", model=model) as harness:
        outcome = harness.run("fix the bug", cwd=workspace, **options)
        events = list(harness.events(outcome.id))
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    return outcome, events, model


def notes_seen(request: ModelRequest) -> list[str]:
    return [m.content or "" for m in request.messages if (m.content or "").startswith("[harness]")]


BUDGETS = {
    "steps": (
        Budget(max_steps=3),
        [turn(("todo_write", TODOS)), turn(read("a.txt")), turn(read("b.txt")), turn(read("c"))],
    ),
    "tool_calls": (
        Budget(max_tool_calls=3),
        [turn(("todo_write", TODOS)), turn(read("a.txt"), read("b.txt"), read("c.txt"))],
    ),
    "tokens": (
        Budget(max_tokens=1000),
        [
            turn(("todo_write", TODOS), usage={"input_tokens": 300, "output_tokens": 50}),
            turn(read("a.txt"), usage={"input_tokens": 400, "output_tokens": 50}),
            turn(read("b.txt"), usage={"input_tokens": 500, "output_tokens": 50}),
        ],
    ),
    "cost": (
        Budget(max_cost=0.05),
        [
            turn(("todo_write", TODOS), cost=0.02),
            turn(read("a.txt"), cost=0.02),
            turn(read("b.txt"), cost=0.02),
            turn(read("c.txt"), cost=0.02),
        ],
    ),
    "wall_time": (
        Budget(max_wall_seconds=0.3),
        [
            turn(("todo_write", TODOS)),
            turn(("run_command", {"argv": ["sleep", "0.4"]})),
            turn(read("a.txt")),
        ],
    ),
}


@pytest.mark.parametrize(
    "dimension",
    # wall_time runs a command in auto mode: unasked only inside the sandbox
    [pytest.param(d, marks=pytest.mark.sandboxed) if d == "wall_time" else d for d in BUDGETS],
)
def test_each_budget_dimension_fails_the_run_with_its_reason_and_the_unfinished_todos(
    tmp_path: Path, workspace: Path, dimension: str
) -> None:
    budget, turns = BUDGETS[dimension]

    outcome, events, _ = drive(tmp_path, workspace, turns, budget=budget, mode="auto")

    assert outcome.status is RunStatus.FAILED
    assert outcome.stop_reason == f"budget_exhausted:{dimension}"
    assert outcome.state.result is not None
    assert outcome.state.result["unfinished"] == ["fix the bug", "add a test"]
    [exhausted] = [e for e in events if e.type is EventType.BUDGET_EXHAUSTED]
    assert exhausted.data["dimension"] == dimension
    assert exhausted.data["used"] >= exhausted.data["limit"]


def test_the_model_is_warned_at_80_percent_and_told_to_converge(
    tmp_path: Path, workspace: Path
) -> None:
    turns = [turn(read(f"{c}.txt")) for c in "abcd"] + [{"content": "done"}]

    outcome, events, model = drive(tmp_path, workspace, turns, budget=Budget(max_steps=5))

    assert outcome.status is RunStatus.COMPLETED  # the last step was still allowed
    [warning] = [e for e in events if e.type is EventType.BUDGET_WARNING]
    assert warning.data == {"dimension": "steps", "used": 4, "limit": 5}
    assert notes_seen(model.requests[3]) == []
    [note] = notes_seen(model.requests[4])
    assert "Budget warning: steps at or past 80 %" in note and "Converge now" in note
    assert "Budget left: steps 1" in (model.requests[4].messages[0].content or "")


# --- no progress ------------------------------------------------------------------------


def test_the_same_call_three_times_gets_a_replan_note_then_fails_the_run_if_it_goes_on(
    tmp_path: Path, workspace: Path
) -> None:
    turns = [turn(read("a.txt")) for _ in range(6)]

    outcome, events, model = drive(tmp_path, workspace, turns)

    assert (outcome.status, outcome.stop_reason) == (RunStatus.FAILED, "no_progress")
    [detected] = [e for e in events if e.type is EventType.NO_PROGRESS_DETECTED]
    assert "the same call read_file:" in detected.data["what"]
    assert '"path":"a.txt"' in detected.data["what"]
    assert detected.data["step"] == 3
    [note] = notes_seen(model.requests[3])
    assert note.startswith("[harness] No progress: the same call read_file")
    assert "todo_write" in note
    assert len(model.requests) == 5  # two more turns after the note, then stopped
    assert outcome.state.usage.steps == 5


def test_the_same_error_three_times_gets_a_replan_note_then_fails_the_run(
    tmp_path: Path, workspace: Path
) -> None:
    turns = [turn(("frobnicate", {"n": i})) for i in range(6)]

    outcome, events, model = drive(tmp_path, workspace, turns)

    assert (outcome.status, outcome.stop_reason) == (RunStatus.FAILED, "no_progress")
    [detected] = [e for e in events if e.type is EventType.NO_PROGRESS_DETECTED]
    assert "the same error 3 times running: unknown tool 'frobnicate'" in detected.data["what"]
    assert any("No progress" in n for n in notes_seen(model.requests[3]))
    assert outcome.state.failed_attempts == 5


def test_a_model_that_changes_course_after_the_replan_note_finishes_normally(
    tmp_path: Path, workspace: Path
) -> None:
    turns = [turn(read("a.txt")) for _ in range(3)]
    turns += [turn(read("b.txt")), turn(read("c.txt")), turn(read("d.txt")), {"content": "ok"}]

    outcome, events, _ = drive(tmp_path, workspace, turns)

    assert outcome.status is RunStatus.COMPLETED
    assert [e.type for e in events].count(EventType.NO_PROGRESS_DETECTED) == 1


def test_a_later_repetition_after_real_progress_gets_its_own_replan_note(
    tmp_path: Path, workspace: Path
) -> None:
    turns = [turn(read("a.txt")) for _ in range(3)]  # stuck: note
    turns += [turn(read("b.txt")), turn(read("c.txt")), turn(read("d.txt"))]  # progress
    turns += [turn(read("b.txt")) for _ in range(3)]  # stuck again: a fresh note
    turns += [{"content": "ok"}]

    outcome, events, model = drive(tmp_path, workspace, turns)

    assert outcome.status is RunStatus.COMPLETED
    assert [e.type for e in events].count(EventType.NO_PROGRESS_DETECTED) == 2
    assert any("No progress" in n for n in notes_seen(model.requests[9]))
