"""Plan mode end to end: no write or command before a person approves the plan.

Real `keel` processes (stdin /dev/null) on a real SQLite file; scripted model turns.
The model insists three times on acting before it plans: code refuses every time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from keel.core.events import EventType
from keel.core.status import RunStatus
from keel.loop.transcript import Transcript
from keel.testing.cli import (
    DONE,
    KeelWorkspace,
    call,
    expect,
    flat,
    run_command_call,
    turn,
)

PLAN = "# Plan\n\n- Write the banner file\n- Check it says hello\n"
WRITE = call("write_file", path="banner.txt", content="hello\n")
COMMAND = run_command_call("sh", "-c", "echo hello > banner.txt")


@pytest.fixture
def ws(tmp_path: Path) -> KeelWorkspace:
    return KeelWorkspace(tmp_path)


@pytest.mark.parametrize(
    ("flags", "action", "follow_on"),
    [
        (["--plan-then", "edit"], WRITE, "edit"),
        (["--mode", "plan"], WRITE, "edit"),
        pytest.param(["--plan-then", "auto"], COMMAND, "auto", marks=pytest.mark.sandboxed),
    ],
    ids=["plan-then-edit-write", "mode-plan-write", "plan-then-auto-command"],
)
def test_acting_before_the_plan_is_approved_is_refused_and_the_same_call_works_after(
    ws: KeelWorkspace, flags: list[str], action: dict[str, Any], follow_on: str
) -> None:
    model = ws.script(
        turn(action),
        turn(action),
        turn(action),  # the model insists
        turn(call("plan_write", content=PLAN)),
        turn(call("plan_exit", summary="write the banner")),
        turn(action),
        DONE,
    )

    run_id, first = ws.start("make a banner", "--model", model, *flags)

    out = flat(expect(first, 3))
    assert "approval of the plan" in out and f"keel approve {run_id}" in out
    assert "Write the banner file" in out
    assert not (ws.root / "banner.txt").exists()
    refused = ws.of_type(run_id, EventType.TOOL_FAILED)
    assert len(refused) == 3
    for event in refused:
        assert event.data["error_kind"] == "policy_denied"
        assert "You are in plan mode" in event.data["message"]
        assert "plan_exit" in event.data["message"]
    state = ws.state(run_id)
    assert state.status is RunStatus.WAITING and state.mode == "plan"
    assert state.plan == PLAN
    assert (ws.root / "plans" / "PLAN.md").read_text() == PLAN
    assert state.pending is not None and state.pending.kind == "plan"
    assert "approval of the plan" in flat(expect(ws.keel("show", run_id), 0))

    expect(ws.keel("approve", run_id), 0)
    expect(ws.keel("resume", run_id), 0)

    assert (ws.root / "banner.txt").read_text() == "hello\n"
    done = ws.state(run_id)
    assert done.status is RunStatus.COMPLETED and done.mode == follow_on
    changed = ws.of_type(run_id, EventType.MODE_CHANGED)
    assert [(e.data["from"], e.data["to"]) for e in changed] == [("plan", follow_on)]
    seeded = ws.of_type(run_id, EventType.TODO_UPDATED)[0].data["todos"]
    assert [t["content"] for t in seeded] == ["Write the banner file", "Check it says hello"]
    after = [e for e in ws.of_type(run_id, EventType.TOOL_FINISHED) if e.seq > changed[0].seq]
    assert [e.data["tool"] for e in after][:2] == ["plan_exit", action["name"]]


def test_a_rejected_plan_keeps_plan_mode_and_the_model_sees_the_reason(
    ws: KeelWorkspace,
) -> None:
    model = ws.script(
        turn(call("plan_write", content=PLAN)),
        turn(call("plan_exit", summary="write the banner")),
        turn(WRITE),
        turn(call("plan_write", content=PLAN + "- Add a test\n")),
        turn(call("plan_exit", summary="write the banner, with a test")),
    )
    run_id, first = ws.start("make a banner", "--model", model, "--mode", "plan")
    expect(first, 3)

    denied = ws.keel("approve", run_id, "--deny", "--reason", "add a test to the plan")
    expect(denied, 0)
    expect(ws.keel("resume", run_id), 3)  # waits for the second plan's approval

    state = ws.state(run_id)
    assert state.mode == "plan" and state.plan == PLAN + "- Add a test\n"
    assert ws.of_type(run_id, EventType.MODE_CHANGED) == []
    assert not (ws.root / "banner.txt").exists()
    events = ws.events(run_id)
    failures = [e for e in events if e.type is EventType.TOOL_FAILED]
    assert [f.data["error_kind"] for f in failures] == ["approval_denied", "policy_denied"]
    assert "add a test to the plan" in failures[0].data["message"]
    assert "plan mode" in failures[1].data["message"]
    view = Transcript([e for e in events if e.seq <= failures[0].seq]).view()
    assert "add a test to the plan" in (view[-1].content or "")
    assert (ws.root / "plans" / "PLAN.md").read_text() == PLAN + "- Add a test\n"
