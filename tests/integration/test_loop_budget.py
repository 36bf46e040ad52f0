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
from keel.core.errors import ConfigError
from keel.core.events import Event, EventType
from keel.core.status import RunStatus
from keel.core.tasks import TaskStatus
from keel.models.base import ModelRequest
from keel.models.scripted import ScriptedModel
from keel.runtime.harness import Harness, RunOutcome
from keel.runtime.worker import Worker

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


# Each limit reached exactly: a limit of N allows N and not N + 1 (``used >= limit``).
# The scripts offer more work than the limit, so a check of ``>`` would let one more
# model turn or call through, and the counts below would be off by one.
EXACT = {
    "steps": (
        Budget(max_steps=3),
        [turn(read("a.txt")), turn(read("b.txt")), turn(read("c.txt")), turn(read("d.txt"))],
        {"steps": 3, "tool_calls": 3, "requests": 3, "used": 3, "limit": 3},
    ),
    "tool_calls": (
        Budget(max_tool_calls=3),
        [turn(read("a.txt")), turn(read("b.txt"), read("c.txt")), turn(read("d.txt"))],
        {"steps": 2, "tool_calls": 3, "requests": 2, "used": 3, "limit": 3},
    ),
    "tokens": (
        Budget(max_tokens=1000),
        [
            turn(read("a.txt"), usage={"input_tokens": 300, "output_tokens": 100}),
            turn(read("b.txt"), usage={"input_tokens": 400, "output_tokens": 200}),
            turn(read("c.txt"), usage={"input_tokens": 1, "output_tokens": 1}),
        ],
        {"steps": 2, "tool_calls": 2, "requests": 2, "used": 1000, "limit": 1000},
    ),
    "cost": (
        Budget(max_cost=1.0),
        [
            turn(read("a.txt"), cost=0.25),
            turn(read("b.txt"), cost=0.25),
            turn(read("c.txt"), cost=0.5),
            turn(read("d.txt"), cost=0.125),
        ],
        {"steps": 3, "tool_calls": 3, "requests": 3, "used": 1.0, "limit": 1.0},
    ),
}


@pytest.mark.parametrize("dimension", list(EXACT))
def test_each_budget_dimension_ends_the_run_at_exactly_its_limit(
    tmp_path: Path, workspace: Path, dimension: str
) -> None:
    budget, turns, expected = EXACT[dimension]

    outcome, events, model = drive(tmp_path, workspace, turns, budget=budget, mode="auto")

    assert outcome.stop_reason == f"budget_exhausted:{dimension}"
    usage = outcome.state.usage
    assert (usage.steps, usage.tool_calls, len(model.requests)) == (
        expected["steps"],
        expected["tool_calls"],
        expected["requests"],
    )
    [exhausted] = [e for e in events if e.type is EventType.BUDGET_EXHAUSTED]
    assert (exhausted.data["used"], exhausted.data["limit"]) == (
        expected["used"],
        expected["limit"],
    )
    finished = [e.data["arguments"]["path"] for e in events if e.type is EventType.TOOL_FINISHED]
    assert len(finished) == expected["tool_calls"]  # no call past the limit ran


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


# --- tokens by kind, and what a cost budget needs ---------------------------------------


def test_cached_and_reasoning_tokens_are_summed_by_kind_but_not_counted_twice(
    tmp_path: Path, workspace: Path
) -> None:
    usage = {
        "input_tokens": 400,
        "cached_input_tokens": 300,
        "output_tokens": 50,
        "reasoning_tokens": 40,
    }
    turns = [turn(read("a.txt"), usage=usage), {"content": "done", "usage": usage}]

    outcome, _, _ = drive(tmp_path, workspace, turns, budget=Budget(max_tokens=901))

    assert outcome.status is RunStatus.COMPLETED  # 900 tokens: input + output only
    used = outcome.state.usage
    assert used.tokens == 900
    assert (used.input_tokens, used.cached_input_tokens) == (800, 600)
    assert (used.output_tokens, used.reasoning_tokens) == (100, 80)
    assert used.cache_hit_ratio == 0.75


class UnpricedModel(ScriptedModel):
    """A model whose turns cost 0 for want of a price (as the HTTP adapter says of a spec
    missing from the price table)."""

    priced = False


def test_a_cost_budget_with_a_model_keel_cannot_price_is_refused_before_any_run_exists(
    tmp_path: Path, workspace: Path
) -> None:
    model = UnpricedModel([{"content": "done"}], spec="openai:house-model")
    with Harness(store=f"sqlite:///{tmp_path}/keel.db", model=model) as harness:
        with pytest.raises(ConfigError) as refused:
            harness.run("fix the bug", cwd=workspace, budget=Budget(max_cost=1.0))
        assert harness.store.list_runs() == []
        outcome = harness.run("fix the bug", cwd=workspace)  # no cost budget: it runs

    assert outcome.status is RunStatus.COMPLETED
    message = str(refused.value)
    assert 'add [prices."openai:house-model"]' in message and ".keel/config.toml" in message
    assert model.requests[0].step == 0 and len(model.requests) == 1


def test_resuming_a_cost_budgeted_run_with_an_unpriced_model_leaves_it_untouched(
    tmp_path: Path, workspace: Path
) -> None:
    url = f"sqlite:///{tmp_path}/keel.db"
    with Harness(store=url, model=ScriptedModel([{"content": "done"}])) as priced:
        state = priced.create("fix the bug", cwd=workspace, budget=Budget(max_cost=1.0))
    unpriced = UnpricedModel([{"content": "done"}], spec="openai:house-model")
    with Harness(store=url, model=unpriced) as harness:
        with pytest.raises(ConfigError, match=r'\[prices\."openai:house-model"\]'):
            harness.resume(state.run_id)
        after = harness.get(state.run_id)
        assert harness.store.current_run_lease(state.run_id) is None

    assert after == state  # not one event more, no lease left behind
    assert unpriced.requests == []


def test_a_worker_fails_a_task_whose_cost_budget_cannot_be_priced_instead_of_retrying_it(
    tmp_path: Path, workspace: Path
) -> None:
    model = UnpricedModel([{"content": "done"}], spec="openai:house-model")
    with Harness(store=f"sqlite:///{tmp_path}/keel.db", model=model) as harness:
        options: dict[str, object] = {"cwd": str(workspace), "budget": {"max_cost": 1.0}}
        task = harness.store.create_task("fix the bug", actor="lead", options=options)

        stats = Worker(harness, poll_interval=0.05).run(until_idle=True)

        failed = harness.store.get_task(task.id)
        assert harness.store.list_runs() == []

    assert failed.status is TaskStatus.FAILED
    assert failed.result is not None and 'add [prices."openai:house-model"]' in failed.result
    assert stats.tasks_failed == 1 and model.requests == []


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
