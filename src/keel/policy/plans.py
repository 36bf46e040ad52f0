"""Leaving plan mode as data: the follow-on mode and the todos seeded from the plan.

``plan_exit`` is decided ``ask`` in plan mode (see ``modes``), so the plan is
approved through the ordinary approval flow. When the granted ``plan_exit``
runs, the loop appends ``plan_approved_events(state)``; on a denial the run
simply stays in plan mode and the model sees the reviewer's reason.
"""

from __future__ import annotations

import re

from keel.core.events import EventType, NewEvent
from keel.core.state import RunState, Todo
from keel.policy.modes import DEFAULT_MODE, Mode, parse_mode

_ITEM = re.compile(
    r"^(?P<indent>\s*)(?:[-*+]|\d+[.)])\s+(?:\[(?P<mark>[ xX])\]\s+)?(?P<text>\S.*)$"
)


def follow_on_mode(state: RunState) -> Mode:
    """The mode after an approved plan: ``--plan-then``, else the default (edit)."""
    mode = parse_mode(state.options.plan_then) if state.options.plan_then else DEFAULT_MODE
    return DEFAULT_MODE if mode is Mode.PLAN else mode


def todos_from_plan(plan: str) -> tuple[Todo, ...]:
    """One todo per outermost list item of a markdown plan (``- x``, ``1. x``, ``- [ ] x``).

    Checked items (``- [x]``) are completed, the rest pending; a plan without a
    list gives no todos. Nested items stay details of their parent.
    """
    items = [m for m in map(_ITEM.match, plan.splitlines()) if m]
    if not items:
        return ()
    outer = min(len(m.group("indent")) for m in items)
    return tuple(
        Todo(
            content=m.group("text").strip(),
            status="completed" if (m.group("mark") or " ").lower() == "x" else "pending",
        )
        for m in items
        if len(m.group("indent")) == outer
    )


def plan_approved_events(state: RunState) -> list[NewEvent]:
    """``mode_changed`` to the follow-on mode, then ``todo_updated`` seeded from the plan."""
    events = [
        NewEvent(
            type=EventType.MODE_CHANGED,
            data={"from": state.mode, "to": follow_on_mode(state).value},
        )
    ]
    todos = todos_from_plan(state.plan or "")
    if todos:
        events.append(
            NewEvent(type=EventType.TODO_UPDATED, data={"todos": [t.to_dict() for t in todos]})
        )
    return events


__all__ = ["follow_on_mode", "plan_approved_events", "todos_from_plan"]
