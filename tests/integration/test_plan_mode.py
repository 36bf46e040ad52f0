"""Plan mode through the loop, as the model sees it (Harness API, real SQLite file).

Each refusal tells the model it is in plan mode and how to leave it; the
no-progress rule gives a model that insisted a fair chance to plan; after the
plan is approved the system prompt names the follow-on mode and the seeded todos.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from keel.core.events import EventType
from keel.core.status import RunStatus
from keel.models.base import ModelRequest
from keel.models.scripted import ScriptedModel
from keel.runtime.harness import Harness

PLAN = "1. Write notes.txt\n2. Request completion\n"
WRITE = {"name": "write_file", "arguments": {"path": "notes.txt", "content": "n\n"}}


def turn(*calls: dict[str, Any]) -> dict[str, Any]:
    return {"tool_calls": list(calls)}


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "arguments": arguments}


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    return root


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/keel.db"


def last_tool_text(request: ModelRequest) -> str:
    return next(m.content or "" for m in reversed(request.messages) if m.role == "tool")


def system_text(request: ModelRequest) -> str:
    return request.messages[0].content or ""


def test_a_model_that_insists_three_times_is_told_it_is_in_plan_mode_and_may_still_plan(
    workspace: Path, store_url: str
) -> None:
    model = ScriptedModel(
        [
            turn(WRITE),
            turn(WRITE),
            turn(WRITE),
            turn(call("plan_write", content=PLAN)),
            turn(call("plan_exit", summary="write notes")),
            turn(WRITE),
            turn(call("request_completion", summary="notes written")),
        ]
    )
    with Harness(store=store_url, model=model) as h:
        waiting = h.run("take notes", cwd=workspace, mode="plan")

        assert waiting.status is RunStatus.WAITING  # not failed by no-progress
        assert "Mode: plan" in system_text(model.requests[0])
        for request in model.requests[1:4]:
            assert "You are in plan mode" in last_tool_text(request)
        # The no-progress note after the third refusal points at the way out.
        replan = [m.content or "" for m in model.requests[3].messages if m.role == "user"][-1]
        assert "No progress" in replan and "plan_write" in replan and "plan_exit" in replan
        assert not (workspace / "notes.txt").exists()

        h.approve(waiting.id)
        done = h.resume(waiting.id)

        assert done.status is RunStatus.COMPLETED
        after_approval = model.requests[5]
        assert "plan approved; you are now in edit mode" in last_tool_text(after_approval)
        assert "Mode: edit" in system_text(after_approval)
        assert "[ ] Write notes.txt" in system_text(after_approval)
        assert (workspace / "notes.txt").read_text() == "n\n"
        model.assert_consumed()


def test_a_model_that_never_stops_insisting_fails_for_no_progress_not_by_acting(
    workspace: Path, store_url: str
) -> None:
    model = ScriptedModel([turn(WRITE)] * 8)
    with Harness(store=store_url, model=model) as h:
        outcome = h.run("take notes", cwd=workspace, mode="plan")

        assert (outcome.status, outcome.stop_reason) == (RunStatus.FAILED, "no_progress")
        assert not (workspace / "notes.txt").exists()
        refusals = [e for e in h.events(outcome.id) if e.type is EventType.TOOL_FAILED]
        assert len(refusals) == 5  # three, the replan note, two more chances
        assert {e.data["error_kind"] for e in refusals} == {"policy_denied"}


def test_a_rejected_plan_reaches_the_model_with_the_reviewers_reason(
    workspace: Path, store_url: str
) -> None:
    model = ScriptedModel(
        [
            turn(call("plan_write", content=PLAN)),
            turn(call("plan_exit", summary="write notes")),
            turn(WRITE),
        ]
    )
    with Harness(store=store_url, model=model) as h:
        waiting = h.run("take notes", cwd=workspace, plan_then="auto")
        h.approve(waiting.id, deny=True, reason="the notes belong in docs/")

        h.resume(waiting.id)

        told = last_tool_text(model.requests[2])
        assert "approval_denied" in told and "the notes belong in docs/" in told
        assert "Mode: plan" in system_text(model.requests[2])
        state = h.get(waiting.id)
        assert state.mode == "plan" and state.plan == PLAN
        assert "You are in plan mode" in state.recent_errors[-1]
        assert not (workspace / "notes.txt").exists()


def test_plan_exit_without_a_plan_is_refused_and_outside_plan_mode_it_is_refused_too(
    workspace: Path, store_url: str
) -> None:
    model = ScriptedModel([turn(call("plan_exit", summary="go"))])
    with Harness(store=store_url, model=model) as h:
        planning = h.run("x", cwd=workspace, mode="plan")
        assert "write the plan with plan_write first" in last_tool_text(model.requests[-1])
        assert planning.state.pending is None

    model = ScriptedModel([turn(call("plan_exit", summary="go"))])
    with Harness(store=store_url, model=model) as h:
        editing = h.run("x", cwd=workspace, mode="edit")
        assert "plan_exit only works in plan mode" in last_tool_text(model.requests[-1])
        assert h.get(editing.id).mode == "edit"


SCOPED_PLAN = "1. Write notes.txt\n2. Request completion\n\nPaths:\n- notes.txt\n"


def test_an_approved_plan_replaced_without_approval_is_refused_until_a_person_approves(
    workspace: Path, store_url: str
) -> None:
    hostile = "1. delete everything\n2. push to prod\n"
    model = ScriptedModel(
        [
            turn(call("plan_write", content=PLAN)),
            turn(call("plan_exit", summary="write notes")),
            turn(call("plan_write", content=hostile)),
            turn(WRITE),
        ]
    )
    with Harness(store=store_url, model=model) as h:
        waiting = h.run("take notes", cwd=workspace, plan_then="auto")
        h.approve(waiting.id)

        replaced = h.resume(waiting.id)

        assert replaced.status is RunStatus.WAITING
        pending = replaced.state.pending
        assert pending is not None and pending.tool == "plan_write"
        assert (workspace / "plans" / "PLAN.md").read_text() == PLAN  # not replaced
        assert replaced.state.plan == PLAN
        [approved] = [e for e in h.events(waiting.id) if e.type is EventType.PLAN_APPROVED]
        assert approved.data["plan_sha256"] == replaced.state.approved_plan_sha256
        asked = [e for e in h.events(waiting.id) if e.type is EventType.APPROVAL_REQUESTED][-1]
        assert asked.data["rule"] == "plan" and asked.data["arguments"]["content"] == hostile

        h.approve(waiting.id, deny=True, reason="keep the approved plan")
        h.resume(waiting.id)

        assert "keep the approved plan" in last_tool_text(model.requests[3])
        assert (workspace / "plans" / "PLAN.md").read_text() == PLAN


def test_changes_outside_the_plans_paths_are_a_gap_until_an_approved_plan_names_them(
    workspace: Path, store_url: str
) -> None:
    other = call("write_file", path="other.txt", content="o\n")
    revised = SCOPED_PLAN + "- other.txt\n"
    model = ScriptedModel(
        [
            turn(call("plan_write", content=SCOPED_PLAN)),
            turn(call("plan_exit", summary="write notes")),
            turn(WRITE, other),
            turn(call("request_completion", summary="notes written")),
            turn(call("plan_write", content=revised)),
            turn(call("request_completion", summary="notes written, other.txt too")),
        ]
    )
    with Harness(store=store_url, model=model) as h:
        waiting = h.run("take notes", cwd=workspace, mode="plan")
        h.approve(waiting.id)

        outcome = h.resume(waiting.id)  # completion refused: other.txt is outside the plan

        [failed] = [e for e in h.events(waiting.id) if e.type is EventType.VERIFICATION_FAILED]
        assert failed.data["outside_plan"] == ["other.txt"]
        told = [m.content or "" for m in model.requests[4].messages if m.role == "user"][-1]
        assert "changes outside the approved plan's paths: other.txt" in told
        assert outcome.status is RunStatus.WAITING  # the revised plan needs approval
        assert outcome.state.pending is not None and outcome.state.pending.tool == "plan_write"

        h.approve(waiting.id)
        done = h.resume(waiting.id)

        assert done.status is RunStatus.COMPLETED
        assert done.state.plan_paths == ("notes.txt", "other.txt")
        model.assert_consumed()
