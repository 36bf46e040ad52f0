"""Completion by evidence through the whole loop, on a real SQLite file and workspace.

The model only requests completion; the harness runs its own verifiers and completes
the run only when every one passed at the current mutation revision.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from keel.core.events import Event, EventType
from keel.core.status import RunStatus
from keel.models.base import ModelRequest
from keel.models.scripted import ScriptedModel
from keel.runtime.harness import Harness, RunOutcome


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("hello\n", encoding="utf-8")
    return ws


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"tool_calls": [{"name": name, "arguments": arguments}]}


def drive(
    tmp_path: Path, workspace: Path, turns: list[dict[str, Any]], **options: Any
) -> tuple[RunOutcome, list[Event], ScriptedModel]:
    model = ScriptedModel(turns)
    with Harness(store=f"sqlite:///{tmp_path}/keel.db", model=model) as harness:
        outcome = harness.run("make a.txt say bye", cwd=workspace, **options)
        events = list(harness.events(outcome.id))
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    return outcome, events, model


def harness_notes(request: ModelRequest) -> list[str]:
    return [
        m.content or ""
        for m in request.messages
        if m.role == "user" and (m.content or "").startswith("[harness]")
    ]


def statuses(events: list[Event]) -> list[str]:
    return [e.data["to"] for e in events if e.type is EventType.STATUS_CHANGED]


def test_a_failing_verifier_returns_the_run_to_running_and_the_model_sees_the_gaps(
    tmp_path: Path, workspace: Path
) -> None:
    outcome, events, model = drive(
        tmp_path,
        workspace,
        [
            {"content": "done already"},
            call("edit_file", path="a.txt", old_text="hello", new_text="bye"),
            {"content": "now done"},
        ],
        verify=["grep -q bye a.txt"],
    )

    assert outcome.status is RunStatus.COMPLETED
    assert statuses(events) == ["verifying", "running", "verifying", "completed"]
    [failed] = [e for e in events if e.type is EventType.VERIFICATION_FAILED]
    assert failed.data["gaps"] == ["grep -q bye a.txt: failed with exit code 1"]
    [note] = harness_notes(model.requests[1])
    assert "Verification failed" in note and "grep -q bye a.txt: failed with exit code 1" in note
    assert [v.passed for v in outcome.state.validations] == [False, True]


def test_an_edit_after_a_passing_verifier_blocks_completion_until_it_passes_again(
    tmp_path: Path, workspace: Path
) -> None:
    bye, done = "grep -q bye a.txt", "test -f done.txt"
    outcome, events, model = drive(
        tmp_path,
        workspace,
        [
            call("edit_file", path="a.txt", old_text="hello", new_text="bye"),  # revision 1
            {"content": "done"},  # bye passes at 1, done.txt missing
            call("write_file", path="a.txt", content="hello again\n"),  # revision 2
            call("write_file", path="done.txt", content="x"),  # revision 3
            {"content": "done"},  # the earlier pass of `bye` is stale and now fails
            call("write_file", path="a.txt", content="bye\n"),  # revision 4
            {"content": "done"},
        ],
        verify=[bye, done],
    )

    assert outcome.status is RunStatus.COMPLETED
    assert statuses(events) == ["verifying", "running"] * 2 + ["verifying", "completed"]
    by_round = [
        {r["command"]: (r["passed"], r["mutation_revision"]) for r in e.data["records"]}
        for e in events
        if e.type in (EventType.VERIFICATION_PASSED, EventType.VERIFICATION_FAILED)
    ]
    assert by_round == [
        {bye: (True, 1), done: (False, 1)},
        {bye: (False, 3), done: (True, 3)},
        {bye: (True, 4), done: (True, 4)},
    ]
    # after the edit the model is told its earlier pass no longer counts
    system = model.requests[4].messages[0].content or ""
    assert f"{bye}: last run at revision 1, files changed since (now 3)" in system
    assert outcome.state.result is not None
    assert outcome.state.result["mutation_revision"] == 4
    assert len(outcome.evidence) == 2


@pytest.mark.sandboxed
def test_the_model_cannot_satisfy_a_verifier_by_running_the_command_itself(
    tmp_path: Path, workspace: Path
) -> None:
    outcome, events, model = drive(
        tmp_path,
        workspace,
        [
            call("run_command", argv=["sh", "-c", "grep -q bye a.txt; exit 0"]),
            call("request_completion", summary="I ran grep -q bye a.txt and it passed"),
            call("run_command", argv=["sh", "-c", "grep -q bye a.txt; exit 0"]),
            {"content": "verified it myself, done"},
        ],
        mode="auto",
        verify=["grep -q bye a.txt"],
    )

    assert outcome.status is RunStatus.FAILED
    assert "scripted model has no turn 4" in (outcome.stop_reason or "")  # never completed
    assert RunStatus.COMPLETED.value not in statuses(events)
    assert [e.type for e in events].count(EventType.VERIFICATION_FAILED) == 2
    ran = [
        e for e in events if e.type is EventType.TOOL_FINISHED and e.data["tool"] == "run_command"
    ]
    assert len(ran) == 2  # the model's own runs happened, and counted for nothing
    assert all(not v.passed for v in outcome.state.validations)
    assert len(outcome.state.validations) == 2  # only the harness's verifier runs
    assert (workspace / "a.txt").read_text() == "hello\n"
    assert any("grep -q bye a.txt: failed" in n for n in harness_notes(model.requests[2]))


def test_without_verifiers_the_run_completes_saying_none_was_configured(
    tmp_path: Path, workspace: Path
) -> None:
    outcome, _, _ = drive(tmp_path, workspace, [{"content": "done"}])

    assert (outcome.status, outcome.stop_reason) == (
        RunStatus.COMPLETED,
        "completed without verifiers",
    )
    assert outcome.state.result is not None
    assert "no verifier was configured" in outcome.state.result["evidence_note"]
    assert outcome.evidence == []


@pytest.mark.sandboxed
def test_a_commands_file_changes_bump_the_revision_and_invalidate_an_earlier_pass(
    tmp_path: Path, workspace: Path
) -> None:
    """A verifier that passed before a ``run_command`` changed the files is stale: the
    command's changes count like an edit's, so it runs again and the evidence is of the
    files as they are at the end."""
    outcome, events, _ = drive(
        tmp_path,
        workspace,
        [
            call("write_file", path="a.txt", content="one\n"),
            call("request_completion", summary="first try"),
            call("run_command", argv=["sh", "-c", "echo two > a.txt"]),
            call("request_completion", summary="second try"),
        ],
        mode="auto",
        verify=["exists=test -s a.txt", "two=grep -q two a.txt"],
    )

    assert outcome.status is RunStatus.COMPLETED, outcome.stop_reason
    (command,) = [
        e for e in events if e.type is EventType.TOOL_FINISHED and e.data["tool"] == "run_command"
    ]
    assert command.data["changed_files"] == {"a.txt": command.data["changed_files"]["a.txt"]}
    assert outcome.state.mutation_revision == 2  # the write, then the command
    started = [e.data for e in events if e.type is EventType.VERIFICATION_STARTED]
    assert [s["mutation_revision"] for s in started] == [1, 2]
    assert started[1]["commands"] == ["test -s a.txt", "grep -q two a.txt"]  # both again
    assert {r.command: r.mutation_revision for r in outcome.state.validations if r.passed} == {
        "test -s a.txt": 2,
        "grep -q two a.txt": 2,
    }
