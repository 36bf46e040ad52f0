"""Approvals through the loop, as the model sees them (Harness API, real SQLite file)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from keel.core.errors import NothingPending
from keel.core.events import EventType
from keel.core.status import RunStatus
from keel.models.base import ModelRequest
from keel.models.scripted import ScriptedModel
from keel.runtime.harness import Harness


def turn(*calls: dict[str, Any]) -> dict[str, Any]:
    return {"tool_calls": list(calls)}


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "arguments": arguments}


APPEND = call("run_command", argv=["sh", "-c", "echo ran >> log.txt"])
DONE = turn(call("request_completion", summary="done"))


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


def policy(workspace: Path, text: str) -> None:
    (workspace / ".keel").mkdir(exist_ok=True)
    (workspace / ".keel" / "policy.toml").write_text(text)


def test_the_model_sees_the_denial_and_its_reason_in_its_next_request(
    workspace: Path, store_url: str
) -> None:
    model = ScriptedModel([turn(APPEND), DONE])
    with Harness(store=store_url, model=model) as h:
        waiting = h.run("log", cwd=workspace)
        h.approve(waiting.id, deny=True, reason="use the logging module instead")

        h.resume(waiting.id)

        told = last_tool_text(model.requests[1])
        assert "approval_denied" in told and "use the logging module instead" in told
        answered = [m for m in model.requests[1].messages if m.role == "tool"]
        assert [m.tool_call_id for m in answered] == ["call_0_0"]
        assert not (workspace / "log.txt").exists()


def test_a_second_decision_on_the_same_request_is_refused_and_the_call_runs_once(
    workspace: Path, store_url: str
) -> None:
    model = ScriptedModel([turn(APPEND), DONE])
    with Harness(store=store_url, model=model) as h:
        waiting = h.run("log", cwd=workspace)
        h.approve(waiting.id)

        with pytest.raises(NothingPending):
            h.approve(waiting.id)
        with pytest.raises(NothingPending):
            h.approve(waiting.id, deny=True, reason="changed my mind")

        assert h.resume(waiting.id).status is RunStatus.COMPLETED
        assert (workspace / "log.txt").read_text() == "ran\n"
        granted = [e for e in h.events(waiting.id) if e.type is EventType.APPROVAL_GRANTED]
        assert len(granted) == 1


def test_an_ask_rule_on_a_read_tool_asks_and_its_grant_is_spent_by_the_read(
    workspace: Path, store_url: str
) -> None:
    policy(workspace, '[[rule]]\naction = "ask"\ntool = "read_file"\npath = "secrets/*"\n')
    (workspace / "secrets").mkdir()
    (workspace / "secrets" / "key.txt").write_text("k\n")
    read = call("read_file", path="secrets/key.txt")
    model = ScriptedModel([turn(read), turn(read), DONE])
    with Harness(store=store_url, model=model) as h:
        waiting = h.run("read the key", cwd=workspace)
        assert waiting.status is RunStatus.WAITING
        h.approve(waiting.id)

        again = h.resume(waiting.id)

        assert again.status is RunStatus.WAITING  # the second read needs its own approval
        assert again.state.grants == {}
        assert "k" in last_tool_text(model.requests[1])


def test_an_approved_completion_is_not_approved_for_the_next_attempt_too(
    workspace: Path, store_url: str
) -> None:
    policy(workspace, '[[rule]]\naction = "ask"\ntool = "request_completion"\n')
    model = ScriptedModel(
        [DONE, turn(call("write_file", path="ok.txt", content="ok\n")), DONE, DONE]
    )
    with Harness(store=store_url, model=model) as h:
        waiting = h.run("make ok.txt", cwd=workspace, verify=["test -f ok.txt"])
        h.approve(waiting.id)

        second = h.resume(waiting.id)  # verification fails, the model fixes it, asks again

        assert second.status is RunStatus.WAITING
        assert second.state.pending is not None and second.state.pending.call_id == "call_2_0"
        assert second.state.grants == {}
        h.approve(second.id)
        assert h.resume(second.id).status is RunStatus.COMPLETED


def test_a_grant_is_used_up_when_the_approved_call_fails_its_pre_check(
    workspace: Path, store_url: str
) -> None:
    """Approve a call, its pre-check fails, the model retries the same call with a new id:
    the retry needs its own approval."""
    (workspace / "a.txt").write_text("hello\n")
    edit = call("edit_file", path="a.txt", old_text="goodbye", new_text="bye")
    model = ScriptedModel([turn(edit), turn(edit), DONE])
    with Harness(store=store_url, model=model) as h:
        waiting = h.run("edit a.txt", cwd=workspace, mode="ask")
        assert waiting.status is RunStatus.WAITING
        h.approve(waiting.id)

        again = h.resume(waiting.id)

        assert again.status is RunStatus.WAITING
        assert again.state.pending is not None and again.state.pending.call_id == "call_1_0"
        assert again.state.grants == {}
        [failed] = [e for e in h.events(waiting.id) if e.type is EventType.TOOL_FAILED]
        assert failed.data["call_id"] == "call_0_0" and failed.data["grant"]
        assert "not found" in last_tool_text(model.requests[1])
        assert (workspace / "a.txt").read_text() == "hello\n"


def test_a_grant_left_unused_past_its_ttl_asks_again_on_resume(
    workspace: Path, store_url: str
) -> None:
    write = call("write_file", path="out.txt", content="x\n")
    model = ScriptedModel([turn(write), DONE])
    with Harness(store=store_url, model=model) as h:
        waiting = h.run("write out.txt", cwd=workspace, mode="ask", grant_ttl=0.5)
        h.approve(waiting.id)
        [granted] = [e for e in h.events(waiting.id) if e.type is EventType.APPROVAL_GRANTED]
        assert granted.data["expires_at"] is not None
        time.sleep(0.6)

        again = h.resume(waiting.id)

        assert again.status is RunStatus.WAITING  # the expired grant did not let it through
        assert not (workspace / "out.txt").exists()
        requests = [e for e in h.events(waiting.id) if e.type is EventType.APPROVAL_REQUESTED]
        assert len(requests) == 2
        assert requests[1].data["expired_grant"]["expires_at"] == granted.data["expires_at"]
        h.approve(waiting.id)
        assert h.resume(waiting.id).status is RunStatus.COMPLETED
        assert (workspace / "out.txt").read_text() == "x\n"


def test_the_grant_ttl_comes_from_the_workspace_config_unless_given(
    workspace: Path, store_url: str
) -> None:
    (workspace / ".keel").mkdir()
    (workspace / ".keel" / "config.toml").write_text(
        "[approvals]\ngrant_ttl_seconds = 600\ntimeout_seconds = 120\n"
    )
    with Harness(store=store_url, model=ScriptedModel([DONE])) as h:
        from_config = h.create("x", cwd=workspace)
        given = h.create("x", cwd=workspace, grant_ttl=30, approval_timeout=45)

    assert (from_config.options.grant_ttl_s, from_config.options.approval_timeout_s) == (600, 120)
    assert (given.options.grant_ttl_s, given.options.approval_timeout_s) == (30, 45)


def test_an_approved_call_that_fails_uses_up_its_grant_so_the_same_call_is_asked_again(
    workspace: Path, store_url: str
) -> None:
    (workspace / "out").mkdir()  # writing a file named "out" fails: it is a directory
    failing = call("write_file", path="out", content="x\n")
    model = ScriptedModel([turn(failing), turn(failing), DONE])
    with Harness(store=store_url, model=model) as h:
        waiting = h.run("write out", cwd=workspace, mode="ask")
        assert waiting.status is RunStatus.WAITING
        h.approve(waiting.id)
        again = h.resume(waiting.id)
        events = list(h.events(waiting.id))

        failed = [e for e in events if e.type is EventType.TOOL_FAILED]
        assert [e.data["call_id"] for e in failed] == ["call_0_0"]
        assert again.state.grants == {}  # spent by the failed attempt
        # The same call again (same digest) is not run on the old approval: it waits.
        assert again.status is RunStatus.WAITING
        assert again.state.pending is not None and again.state.pending.call_id == "call_1_0"
        requested = [e for e in events if e.type is EventType.APPROVAL_REQUESTED]
        assert len(requested) == 2 and requested[0].data["digest"] == requested[1].data["digest"]
