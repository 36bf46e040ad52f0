"""Leaving plan mode: the follow-on mode and the todos seeded from the approved plan."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest

from keel.core.events import Event, EventType, NewEvent
from keel.core.state import RunOptions, RunState, Todo
from keel.policy import Mode, Policy, plan_approved_events, todos_from_plan

PLAN = """# Plan
1. Read the failing test
2. Fix the parser
   - handle empty input
   - handle tabs
3. Run pytest
- [x] Reproduce the bug
"""


def planning_run(plan_then: str | None, plan: str | None = PLAN) -> RunState:
    options = RunOptions(mode="plan", plan_then=plan_then).to_dict()
    events = [NewEvent(type=EventType.RUN_CREATED, data={"goal": "fix", "options": options})]
    if plan is not None:
        events.append(NewEvent(type=EventType.PLAN_WRITTEN, data={"content": plan}))
    return apply(RunState(run_id="run_p"), events)


def apply(state: RunState, events: list[NewEvent]) -> RunState:
    for new in events:
        state = state.apply(
            Event(
                run_id=state.run_id,
                seq=state.last_seq + 1,
                event_id=str(uuid.uuid4()),
                type=new.type,
                recorded_at=datetime(2025, 3, 1, tzinfo=UTC),
                data=new.data,
            )
        )
    return state


def test_todos_are_the_outermost_items_of_the_plan() -> None:
    assert todos_from_plan(PLAN) == (
        Todo(content="Read the failing test", status="pending"),
        Todo(content="Fix the parser", status="pending"),
        Todo(content="Run pytest", status="pending"),
        Todo(content="Reproduce the bug", status="completed"),
    )


def test_plan_without_a_list_seeds_no_todos() -> None:
    assert todos_from_plan("Just fix it.\nThen test.") == ()


@pytest.mark.parametrize(("plan_then", "mode"), [(None, "edit"), ("auto", "auto")])
def test_approved_plan_switches_to_the_follow_on_mode_and_seeds_todos(
    plan_then: str | None, mode: str
) -> None:
    state = planning_run(plan_then)
    assert state.mode == "plan"

    after = apply(state, plan_approved_events(state))

    assert after.mode == mode
    assert [t.content for t in after.todos] == [
        "Read the failing test",
        "Fix the parser",
        "Run pytest",
        "Reproduce the bug",
    ]


def test_after_approval_the_same_write_is_allowed() -> None:
    state = planning_run("edit")
    arguments = {"path": "parser.py", "content": "x"}
    workspace = Path("/w")

    before = Policy().decide(
        "write_file", "write", arguments, mode=Mode(state.mode), workspace=workspace
    )
    after = apply(state, plan_approved_events(state))
    then = Policy().decide(
        "write_file", "write", arguments, mode=Mode(after.mode), workspace=workspace
    )

    assert (before.action, then.action) == ("deny", "allow")


def test_approval_without_a_written_plan_switches_mode_and_keeps_todos() -> None:
    state = planning_run("edit", plan=None)

    events = plan_approved_events(state)

    assert [e.type for e in events] == [EventType.MODE_CHANGED]
    assert events[0].data == {"from": "plan", "to": "edit"}
