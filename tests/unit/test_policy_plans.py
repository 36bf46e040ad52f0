"""Leaving plan mode: the follow-on mode and the todos seeded from the approved plan."""

from __future__ import annotations

import hashlib
import json
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest

from keel.core.events import Event, EventType, NewEvent
from keel.core.records import RunOptions, Todo, in_plan_paths
from keel.core.state import RunState
from keel.policy import Mode, Policy, plan_approved_events, todos_from_plan
from keel.policy.modes import Decision
from keel.policy.plans import follow_on_mode, plan_change_decision, plan_digest, plan_paths

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


def test_approval_records_the_plans_digest_and_paths_before_the_mode_changes() -> None:
    state = planning_run("edit", plan=PLAN + "\nPaths:\n- src/parser.py\n")

    events = plan_approved_events(state, call_id="call_7")
    after = apply(state, events)

    assert [e.type for e in events][:2] == [EventType.PLAN_APPROVED, EventType.MODE_CHANGED]
    assert events[0].data == {
        "call_id": "call_7",
        "plan_sha256": plan_digest(state.plan or ""),
        "paths": ["src/parser.py"],
    }
    assert after.approved_plan_sha256 == plan_digest(state.plan or "")
    assert after.plan_paths == ("src/parser.py",)


def test_approval_without_a_written_plan_switches_mode_and_keeps_todos() -> None:
    state = planning_run("edit", plan=None)

    events = plan_approved_events(state)

    assert [e.type for e in events] == [EventType.MODE_CHANGED]
    assert events[0].data == {"from": "plan", "to": "edit"}


# --- the paths a plan names ---------------------------------------------------------------

PLAN_WITH_PATHS = """# Plan
1. Fix the parser
2. Run pytest

## Paths
- src/parser.py: the tokenizer
- `tests/test_parser.py` and `tests/data/*`
- ./docs/

Afterwards:
- [ ] tell the team
"""


def test_a_paths_section_lists_one_glob_per_item_or_each_backticked_path() -> None:
    assert plan_paths(PLAN_WITH_PATHS) == (
        "src/parser.py",
        "tests/test_parser.py",
        "tests/data/*",
        "docs/",
    )


def test_the_items_of_a_paths_section_are_not_todos() -> None:
    assert [t.content for t in todos_from_plan(PLAN_WITH_PATHS)] == [
        "Fix the parser",
        "Run pytest",
        "tell the team",
    ]


@pytest.mark.parametrize(
    ("plan", "paths"),
    [
        ("Paths: src/, `README.md`\n1. edit\n", ("src/", "README.md")),
        ("**Paths:**\n\n- a.py\n\n- b.py\nDone.\n- c.py\n", ("a.py", "b.py")),
        ("paths:\n* /abs/x.py\n", ("abs/x.py",)),
        ("Paths:\n", ()),
        ("1. fix it\n", None),
        ("Paths are hard to name.\n- a.py\n", None),
        ("- Paths: a.py\n", None),
    ],
)
def test_paths_syntax(plan: str, paths: tuple[str, ...] | None) -> None:
    assert plan_paths(plan) == paths


@pytest.mark.parametrize(
    ("path", "covered"),
    [
        ("src/parser.py", True),
        ("src/deep/x.txt", True),  # a directory covers what is below it
        ("tests/test_a.py", True),
        ("tests/unit/test_b.py", True),  # * also matches /
        ("setup.py", False),
        ("lib/src/parser.py", False),  # entries are anchored at the workspace root
        ("srcx/a.py", False),
    ],
)
def test_plan_paths_are_globs_from_the_workspace_root(path: str, covered: bool) -> None:
    assert in_plan_paths(path, ("src", "tests/test_*.py", "tests/*/test_*.py")) is covered


# --- an approved plan is changed only with a new approval ----------------------------------


def test_replacing_the_approved_plan_asks_and_rewriting_it_unchanged_does_not() -> None:
    state = planning_run("edit")
    approved = apply(state, plan_approved_events(state))
    workspace = Path("/w")

    changed = plan_change_decision(
        approved, "plan_write", "write", {"content": "delete everything"}, workspace=workspace
    )
    same = plan_change_decision(
        approved, "plan_write", "write", {"content": PLAN}, workspace=workspace
    )
    before_approval = plan_change_decision(
        state, "plan_write", "write", {"content": "anything"}, workspace=workspace
    )

    assert changed is not None and (changed.action, changed.rule) == ("ask", "plan")
    assert "approved plan" in changed.reason and "new approval" in changed.reason
    assert same is None and before_approval is None


@pytest.mark.parametrize("path", ["plans/PLAN.md", "./plans/../plans/PLAN.md", "/w/plans/PLAN.md"])
def test_other_tools_may_not_rewrite_the_approved_plan_file(path: str) -> None:
    state = planning_run("edit")
    approved = apply(state, plan_approved_events(state))

    verdict = plan_change_decision(
        approved, "write_file", "write", {"path": path, "content": "x"}, workspace=Path("/w")
    )

    assert verdict is not None and verdict.action == "deny"
    assert "change it with plan_write" in verdict.reason


def test_a_plan_with_a_lone_surrogate_still_has_a_digest() -> None:
    plan = json.loads('"1. fix the \\ud800 parser"')  # JSON may carry a lone surrogate
    assert plan_digest(plan) == hashlib.sha256(plan.encode("utf-8", "surrogatepass")).hexdigest()


def test_a_follow_on_mode_of_plan_means_the_default_mode() -> None:
    state = RunState(run_id="run_p", options=RunOptions(mode="plan", plan_then="plan"))
    assert follow_on_mode(state) is Mode.EDIT


@pytest.mark.parametrize(
    ("plan", "paths"),
    [
        ("Paths: `docs/user guide.md`, src/\n", ("docs/user guide.md", "src/")),
        ("Paths: src/a.py,src/b.py\n", ("src/a.py", "src/b.py")),
        (
            "Paths:\n- docs/INDEX\n- Xcode/Project.pbxproj\n- /XDG/dirs\n",
            ("docs/INDEX", "Xcode/Project.pbxproj", "XDG/dirs"),
        ),
    ],
)
def test_paths_are_split_at_commas_and_keep_their_letters(
    plan: str, paths: tuple[str, ...]
) -> None:
    assert plan_paths(plan) == paths


def test_a_plan_approved_outside_a_call_names_no_call() -> None:
    state = planning_run("edit")
    [approved, *_] = plan_approved_events(state)
    assert approved.data["call_id"] == ""


def test_replacing_the_approved_plan_asks_naming_the_digest_it_would_replace() -> None:
    state = planning_run("edit")
    approved = apply(state, plan_approved_events(state))
    decision = plan_change_decision(
        approved, "plan_write", "write", {"content": "other"}, workspace=Path("/w")
    )
    assert decision == Decision(
        action="ask",
        rule="plan",
        reason=f"the approved plan (sha256 {plan_digest(PLAN)[:12]}) would be replaced; "
        "changing an approved plan needs a new approval",
    )


def test_writing_the_approved_plan_file_with_another_tool_is_refused_saying_how_to_change_it() -> (
    None
):
    state = planning_run("edit")
    approved = apply(state, plan_approved_events(state))
    decision = plan_change_decision(
        approved, "edit_file", "write", {"path": "plans/PLAN.md"}, workspace=Path("/w")
    )
    assert decision == Decision(
        action="deny",
        rule="plan",
        reason="plans/PLAN.md holds the approved plan: change it with plan_write, which asks "
        "for a new approval",
    )
