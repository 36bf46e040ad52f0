"""Plans as data: the follow-on mode, the todos and paths a plan names, and its digest.

``plan_exit`` is decided ``ask`` in plan mode (see ``modes``), so the plan is
approved through the ordinary approval flow; its approval digest covers the plan's
sha256, so a grant approves exactly the plan the reviewer read. When the granted
``plan_exit`` runs, the loop appends ``plan_approved_events(state)``: a
``plan_approved`` event recording the digest and the paths the plan names, then
the mode change and the todos. On a denial the run stays in plan mode and the
model sees the reviewer's reason.

Once a plan is approved it is the plan: ``plan_write`` with other content needs
a new approval (``plan_change_decision`` asks), and when that approval is used
a new ``plan_approved`` records the new digest and paths. Other write tools may
not rewrite ``plans/PLAN.md`` at all (the plan is changed with ``plan_write``).

**Paths.** A plan may name the files it will change, in a section that starts
with a line ``Paths:`` (or a heading ``## Paths``) followed by list items::

    Paths:
    - src/parser.py
    - `tests/test_parser.py`
    - docs/*

Each item is one glob from the workspace root (``*`` also matches ``/``; a
directory such as ``src/`` covers everything below it); in an item with
backticks each backticked span is one path, otherwise its first word is. Entries
may instead follow the colon, separated by commas (``Paths: src/, README.md``),
and then no list follows. A list section ends at the first line that is neither
blank nor a list item; its items are paths, not todos. With an approved plan that
names paths, completion reports every changed file outside them (``plans/PLAN.md``
aside) as a verification gap (``RunState.changes_outside_plan``); a section with no
entries means the plan changes no files. A plan without a ``Paths`` section does not
limit what may change.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from keel.core.events import EventType, NewEvent
from keel.core.guard import PLAN_FILE
from keel.core.records import Todo
from keel.core.state import RunState
from keel.policy.modes import DEFAULT_MODE, PLAN_WRITE, Decision, Mode, parse_mode
from keel.policy.rules import workspace_relative

_ITEM = re.compile(
    r"^(?P<indent>\s*)(?:[-*+]|\d+[.)])\s+(?:\[(?P<mark>[ xX])\]\s+)?(?P<text>\S.*)$"
)
_PATHS_START = re.compile(
    r"^\s*(?:#{1,6}\s+)?[*_]{0,2}paths[*_]{0,2}(?P<colon>:)?[*_]{0,2}\s*(?P<rest>.*)$",
    re.IGNORECASE,
)
_BACKTICKED = re.compile(r"`([^`]+)`")


def plan_digest(plan: str) -> str:
    """sha256 hex of the plan's UTF-8 text: what an approval of the plan is bound to."""
    return hashlib.sha256(plan.encode("utf-8", "surrogatepass")).hexdigest()


def follow_on_mode(state: RunState) -> Mode:
    """The mode after an approved plan: ``--plan-then``, else the default (edit)."""
    mode = parse_mode(state.options.plan_then) if state.options.plan_then else DEFAULT_MODE
    return DEFAULT_MODE if mode is Mode.PLAN else mode


def _paths_start(line: str) -> list[str] | None:
    """The inline entries of a line opening a Paths section, or None if it opens none."""
    match = _PATHS_START.match(line)
    if match is None:
        return None
    rest = match.group("rest").strip()
    if match.group("colon") is None and rest:
        return None  # "Paths are tricky": prose, not a section
    return [path for part in rest.split(",") for path in _item_paths(part)]


def _item_paths(text: str) -> list[str]:
    """The paths of one entry: each backticked span, else its first word."""
    ticked = _BACKTICKED.findall(text)
    raw = ticked if ticked else text.split()[:1]
    paths = (r.strip().rstrip(",;:").removeprefix("./").lstrip("/") for r in raw)
    return [p for p in paths if p]


def _sections(plan: str) -> tuple[list[str] | None, list[str]]:
    """(the paths the plan names or None, the plan's lines outside its Paths sections)."""
    paths: list[str] | None = None
    rest: list[str] = []
    inside = False
    for line in plan.splitlines():
        item = _ITEM.match(line)
        opened = _paths_start(line) if item is None else None
        if opened is not None:
            paths = (paths or []) + opened
            inside = not opened  # inline entries close the section on the same line
            continue
        if inside and (item is not None or not line.strip()):
            if item is not None:
                paths = (paths or []) + _item_paths(item.group("text"))
            continue
        inside = False
        rest.append(line)
    return paths, rest


def plan_paths(plan: str) -> tuple[str, ...] | None:
    """The paths a plan names in its ``Paths`` section(s), in order, without repeats;
    None when it has no such section (then it does not limit what may change)."""
    paths, _ = _sections(plan)
    return None if paths is None else tuple(dict.fromkeys(paths))


def todos_from_plan(plan: str) -> tuple[Todo, ...]:
    """One todo per outermost list item of a markdown plan (``- x``, ``1. x``, ``- [ ] x``).

    Checked items (``- [x]``) are completed, the rest pending; a plan without a
    list gives no todos. Nested items stay details of their parent, and the items
    of a ``Paths`` section are paths, not todos.
    """
    _, lines = _sections(plan)
    items = [m for m in map(_ITEM.match, lines) if m]
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


def plan_approved_event(plan: str, *, call_id: str) -> NewEvent:
    """``plan_approved``: the digest of the plan a person approved and the paths it names."""
    paths = plan_paths(plan)
    return NewEvent(
        type=EventType.PLAN_APPROVED,
        data={
            "call_id": call_id,
            "plan_sha256": plan_digest(plan),
            "paths": None if paths is None else list(paths),
        },
    )


def plan_approved_events(state: RunState, *, call_id: str = "") -> list[NewEvent]:
    """``plan_approved`` (when there is a plan), ``mode_changed`` to the follow-on mode,
    then ``todo_updated`` seeded from the plan."""
    events = []
    if state.plan is not None:
        events.append(plan_approved_event(state.plan, call_id=call_id))
    events.append(
        NewEvent(
            type=EventType.MODE_CHANGED,
            data={"from": state.mode, "to": follow_on_mode(state).value},
        )
    )
    todos = todos_from_plan(state.plan or "")
    if todos:
        events.append(
            NewEvent(type=EventType.TODO_UPDATED, data={"todos": [t.to_dict() for t in todos]})
        )
    return events


def plan_change(state: RunState, tool: str, arguments: Mapping[str, Any]) -> str | None:
    """The digest of the new plan when ``tool`` would replace the approved plan, else None."""
    if state.approved_plan_sha256 is None or tool != PLAN_WRITE:
        return None
    content = arguments.get("content")
    if not isinstance(content, str):
        return None
    digest = plan_digest(content)
    return None if digest == state.approved_plan_sha256 else digest


def plan_change_decision(
    state: RunState,
    tool: str,
    effect: str,
    arguments: Mapping[str, Any],
    *,
    workspace: Path,
) -> Decision | None:
    """What an approved plan adds to the policy's decision on one call (None: nothing).

    ``plan_write`` with content other than the approved plan asks (a person approves
    the new plan); another tool writing ``plans/PLAN.md`` is refused, since the plan
    is changed with ``plan_write`` only.
    """
    approved = state.approved_plan_sha256
    if approved is None:
        return None
    if plan_change(state, tool, arguments) is not None:
        return Decision(
            action="ask",
            rule="plan",
            reason=f"the approved plan (sha256 {approved[:12]}) would be replaced; changing "
            "an approved plan needs a new approval",
        )
    path = arguments.get("path")
    if (
        tool != PLAN_WRITE
        and effect == "write"
        and isinstance(path, str)
        and workspace_relative(path, workspace) == PLAN_FILE
    ):
        return Decision(
            action="deny",
            rule="plan",
            reason=f"{PLAN_FILE} holds the approved plan: change it with plan_write, "
            "which asks for a new approval",
        )
    return None


__all__ = [
    "follow_on_mode",
    "plan_approved_event",
    "plan_approved_events",
    "plan_change",
    "plan_change_decision",
    "plan_digest",
    "plan_paths",
    "todos_from_plan",
]
