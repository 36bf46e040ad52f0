"""Outcome-shaped results through the real loop: named evidence that opens, a person's
sign-off as a verifier, and a gap no edit can fix ending the run ``blocked``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from keel.core.errors import NothingPending, UsageError
from keel.core.events import EventType
from keel.core.status import RunStatus
from keel.models.scripted import ScriptedModel
from keel.runtime.harness import Harness

WRITE = {"name": "write_file", "arguments": {"path": "fix.txt", "content": "fixed\n"}}


def done(**more: Any) -> dict[str, Any]:
    arguments = {"summary": "bumped the dependency and added a test", **more}
    return {"tool_calls": [{"name": "request_completion", "arguments": arguments}]}


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    return root


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/keel.db"


def test_a_completed_run_names_its_evidence_outcome_and_remaining_actions(
    workspace: Path, store_url: str
) -> None:
    model = ScriptedModel([{"tool_calls": [WRITE]}, done(remaining_actions=["release 2.1.4"])])
    with Harness(store=store_url, model=model) as h:
        run = h.run(
            "fix the vulnerable dependency, add a test, don't release",
            cwd=workspace,
            verify=["unit_tests=grep -q fixed fix.txt", "test -f fix.txt"],
            outcome="change_ready_for_approval",
        )
        result = run.state.result
        assert run.status is RunStatus.COMPLETED and result is not None
        assert result["outcome"] == "change_ready_for_approval"
        assert set(result["evidence"]) == {"unit_tests", "test -f fix.txt"}
        assert result["remaining_actions"] == ["release 2.1.4"]
        # The evidence opens: the verifier's log, command line and exit code included.
        ref = result["evidence"]["unit_tests"]
        _, content = h.store.get_artifact(ref.removeprefix("artifact:"))
        assert content.decode().startswith("$ grep -q fixed fix.txt\n[exit code 0]")


def test_a_person_signs_off_as_a_verifier_and_the_run_completes_without_rerunning_tests(
    workspace: Path, store_url: str
) -> None:
    model = ScriptedModel([{"tool_calls": [WRITE]}, done()])
    with Harness(store=store_url, model=model) as h:
        waiting = h.run(
            "fix it", cwd=workspace, verify=["unit=test -f fix.txt"], verify_human=["security"]
        )
        assert waiting.status is RunStatus.WAITING
        assert waiting.state.reason == "signoff:security"
        with pytest.raises(UsageError, match="waits for the sign-off of 'security', not 'legal'"):
            h.sign_off(waiting.id, "legal")
        with pytest.raises(NothingPending):
            h.approve(waiting.id)  # an approval is not a sign-off
        h.sign_off(waiting.id, "security", by="ana")
        done_run = h.resume(waiting.id)
        events = list(h.events(waiting.id))
        result = done_run.state.result

    assert done_run.status is RunStatus.COMPLETED and result is not None
    assert set(result["evidence"]) == {"unit", "security"}
    started = [e for e in events if e.type is EventType.VERIFICATION_STARTED]
    assert [e.data["commands"] for e in started] == [["test -f fix.txt"], []]
    (signed,) = [e.data for e in events if e.type is EventType.SIGNOFF_RECORDED]
    assert signed["by"] == "ana" and signed["passed"] is True
    with Harness(store=store_url) as h:
        _, content = h.store.get_artifact(result["evidence"]["security"].removeprefix("artifact:"))
    assert json.loads(content)["by"] == "ana"


def test_a_declined_signoff_sends_the_reason_to_the_model_and_asks_again(
    workspace: Path, store_url: str
) -> None:
    fix_more = {"name": "write_file", "arguments": {"path": "fix.txt", "content": "better\n"}}
    model = ScriptedModel([{"tool_calls": [WRITE]}, done(), {"tool_calls": [fix_more]}, done()])
    with Harness(store=store_url, model=model) as h:
        waiting = h.run("fix it", cwd=workspace, verify_human=["security"])
        with pytest.raises(UsageError, match="declining needs a reason"):
            h.sign_off(waiting.id, "security", deny=True)
        h.sign_off(waiting.id, "security", deny=True, reason="the token is still logged", by="ana")
        again = h.resume(waiting.id)
        assert again.status is RunStatus.WAITING  # the model worked on, and asks again
        assert "the token is still logged" in str(model.requests[2].messages)
        h.sign_off(waiting.id, "security", by="ana")
        final = h.resume(waiting.id)
    assert final.status is RunStatus.COMPLETED
    assert (workspace / "fix.txt").read_text() == "better\n"


def test_a_verifier_that_cannot_run_ends_the_run_blocked_with_the_reason(
    workspace: Path, store_url: str
) -> None:
    model = ScriptedModel([done(), done(), done()])
    with Harness(store=store_url, model=model) as h:
        run = h.run("finish", cwd=workspace, verify=["types=no-such-checker-xyz ."])
    assert run.status is RunStatus.BLOCKED
    assert run.state.reason == "unfixable_gap: types: the command was not found"
    assert len(model.requests) == 1  # not sent back to loop on what it cannot fix


def test_remaining_actions_past_their_limits_are_refused_and_the_model_is_told(
    workspace: Path, store_url: str
) -> None:
    huge = done(remaining_actions=["x" * 5000])
    many = done(remaining_actions=[f"step {i}" for i in range(51)])
    model = ScriptedModel([huge, many, done(remaining_actions=["release it"])])
    with Harness(store=store_url, model=model) as h:
        run = h.run("finish", cwd=workspace)
        failed = [e.data for e in h.events(run.id) if e.type is EventType.TOOL_FAILED]
    assert [f["error_kind"] for f in failed] == ["invalid_arguments", "invalid_arguments"]
    assert run.status is RunStatus.COMPLETED
    assert run.state.result is not None
    assert run.state.result["remaining_actions"] == ["release it"]
