"""Approvals end to end: `keel run` exits 3, another process decides, `keel resume` continues.

Real `keel` processes (stdin /dev/null), a real SQLite file; only the model's turns
are scripted. ``edit`` mode is the default: writes are allowed, commands ask.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from keel.core.events import EventType
from keel.core.status import RunStatus
from keel.loop.prepare import build_messages
from keel.loop.transcript import Transcript
from keel.testing.cli import (
    DONE,
    KeelWorkspace,
    call,
    expect,
    flat,
    one_line_error,
    run_command_call,
    turn,
)
from keel.testing.stores import STORE_BACKENDS, postgres_unavailable

APPEND = run_command_call("sh", "-c", "echo ran >> log.txt")


@pytest.fixture
def ws(tmp_path: Path) -> KeelWorkspace:
    return KeelWorkspace(tmp_path)


def log_lines(ws: KeelWorkspace) -> list[str]:
    log = ws.root / "log.txt"
    return log.read_text().splitlines() if log.exists() else []


def test_approval_from_another_process_then_resume_runs_the_call_exactly_once(
    ws: KeelWorkspace,
) -> None:
    model = ws.script(turn(APPEND), DONE)

    run_id, first = ws.start("log that it ran", "--model", model)

    out = flat(expect(first, 3))  # waiting, no terminal: exit at once
    assert f"keel approve {run_id}" in out and "echo ran >> log.txt" in out
    assert log_lines(ws) == []  # nothing ran before the approval
    requested = ws.of_type(run_id, EventType.APPROVAL_REQUESTED)
    assert [e.data["tool"] for e in requested] == ["run_command"]
    assert requested[0].data["arguments"]["argv"] == ["sh", "-c", "echo ran >> log.txt"]
    assert requested[0].data["risk"] == "high" and requested[0].data["expires_at"]

    approved = ws.keel("approve", run_id, "--reason", "fine by me")
    assert "approved" in expect(approved, 0)
    assert log_lines(ws) == []  # approving records the decision; the run acts on resume

    expect(ws.keel("resume", run_id), 0)
    expect(ws.keel("resume", run_id), 0)  # a finished run is not driven again

    assert log_lines(ws) == ["ran"]
    state = ws.state(run_id)
    assert state.status is RunStatus.COMPLETED and state.grants == {}
    started = ws.of_type(run_id, EventType.TOOL_STARTED)
    granted = ws.of_type(run_id, EventType.APPROVAL_GRANTED)
    assert len(started) == 1 and len(granted) == 1
    assert started[0].data["grant"] == requested[0].data["digest"] == granted[0].data["digest"]
    assert granted[0].data["reason"] == "fine by me"


def test_denied_call_never_runs_and_the_model_is_told_the_reason(ws: KeelWorkspace) -> None:
    model = ws.script(turn(APPEND), DONE)
    run_id, first = ws.start("log that it ran", "--model", model)
    expect(first, 3)

    no_reason = ws.keel("approve", run_id, "--deny")
    assert "reason" in one_line_error(no_reason)
    assert ws.state(run_id).status is RunStatus.WAITING  # the refusal wrote nothing

    expect(ws.keel("approve", run_id, "--deny", "--reason", "no shell commands today"), 0)
    expect(ws.keel("resume", run_id), 0)

    assert log_lines(ws) == []
    assert ws.of_type(run_id, EventType.TOOL_STARTED) == []
    events = ws.events(run_id)
    failed = next(e for e in events if e.type is EventType.TOOL_FAILED)
    assert failed.data["error_kind"] == "approval_denied"
    assert "no shell commands today" in failed.data["message"]
    # The model's next request came after the denial, and shows it the reason.
    after = [e.type for e in events if e.seq > failed.seq]
    assert EventType.MODEL_REQUESTED in after
    upto = [e for e in events if e.seq <= failed.seq]
    shown = build_messages(ws.state(run_id), Transcript(upto))
    tool_results = [m.content or "" for m in shown if m.role == "tool"]
    assert any("no shell commands today" in text for text in tool_results)


def test_a_grant_is_used_once_so_the_same_call_later_asks_again(ws: KeelWorkspace) -> None:
    model = ws.script(turn(APPEND), turn(APPEND), DONE)
    run_id, first = ws.start("log twice", "--model", model)
    expect(first, 3)
    expect(ws.keel("approve", run_id), 0)

    second = ws.keel("resume", run_id)

    expect(second, 3)  # the identical second call needs its own approval
    assert log_lines(ws) == ["ran"]
    state = ws.state(run_id)
    assert state.grants == {}
    assert state.pending is not None and state.pending.call_id == "call_1_0"
    requested = ws.of_type(run_id, EventType.APPROVAL_REQUESTED)
    assert requested[0].data["digest"] == requested[1].data["digest"]  # same call, same digest

    expect(ws.keel("approve", run_id), 0)
    expect(ws.keel("resume", run_id), 0)
    assert log_lines(ws) == ["ran", "ran"]


def test_changed_arguments_need_a_new_approval(ws: KeelWorkspace) -> None:
    other = run_command_call("sh", "-c", "echo other >> log.txt")
    model = ws.script(turn(APPEND), turn(other), DONE)
    run_id, first = ws.start("log", "--model", model)
    expect(first, 3)
    expect(ws.keel("approve", run_id), 0)

    expect(ws.keel("resume", run_id), 3)

    assert log_lines(ws) == ["ran"]  # the changed call did not ride on the first grant
    requested = ws.of_type(run_id, EventType.APPROVAL_REQUESTED)
    assert len(requested) == 2
    assert requested[0].data["digest"] != requested[1].data["digest"]
    assert requested[1].data["arguments"]["argv"][-1] == "echo other >> log.txt"


def test_expired_approval_is_refused_and_the_run_ends_failed(ws: KeelWorkspace) -> None:
    model = ws.script(turn(APPEND), DONE)
    run_id, first = ws.start("log", "--model", model, "--approval-timeout", "1")
    expect(first, 3)
    time.sleep(1.2)

    late = ws.keel("approve", run_id)

    message = one_line_error(late)
    assert "expired" in message and "approval_timeout" in message
    state = ws.state(run_id)
    assert (state.status, state.reason) == (RunStatus.FAILED, "approval_timeout")
    expect(ws.keel("resume", run_id), 1)
    assert log_lines(ws) == []
    assert ws.of_type(run_id, EventType.APPROVAL_GRANTED) == []


def test_resuming_an_expired_wait_ends_the_run_failed(ws: KeelWorkspace) -> None:
    model = ws.script(turn(APPEND), DONE)
    run_id, first = ws.start("log", "--model", model, "--approval-timeout", "1")
    expect(first, 3)
    time.sleep(1.2)

    resumed = ws.keel("resume", run_id)

    assert "approval_timeout" in expect(resumed, 1)
    state = ws.state(run_id)
    assert (state.status, state.reason) == (RunStatus.FAILED, "approval_timeout")
    assert log_lines(ws) == []
    assert "not waiting for an approval" in one_line_error(ws.keel("approve", run_id))


def test_show_prints_the_waiting_call_and_the_commands_that_answer_it(
    ws: KeelWorkspace,
) -> None:
    model = ws.script(turn(APPEND), DONE)
    run_id, first = ws.start("log", "--model", model)
    expect(first, 3)

    out = flat(expect(ws.keel("show", run_id), 0))

    assert "waiting" in out and "run_command" in out
    assert '"argv": ["sh", "-c", "echo ran >> log.txt"]' in out
    assert f"keel approve {run_id}" in out
    assert f"keel approve {run_id} --deny --reason TEXT" in out


def test_run_and_show_name_a_non_default_store_in_the_answering_command(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'elsewhere.db'}"
    ws = KeelWorkspace(tmp_path, store_url=url)
    model = ws.script(turn(APPEND), DONE)

    run_id, first = ws.start("log", "--model", model)

    command = f"keel approve {run_id} --store {url}"
    assert command in flat(expect(first, 3))
    assert command in flat(expect(ws.keel("show", run_id), 0))


@pytest.mark.parametrize("backend", sorted(STORE_BACKENDS))
def test_a_waiting_run_survives_its_process_and_store_and_resumes_elsewhere(
    backend: str, tmp_path: Path
) -> None:
    if backend == "postgres" and (reason := postgres_unavailable()):
        pytest.skip(reason)
    (tmp_path / "store").mkdir()
    root = tmp_path / "workspace"
    root.mkdir()
    with STORE_BACKENDS[backend](tmp_path / "store") as store:
        url = store.url
        store.close()  # every command below opens the store afresh in its own process
        ws = KeelWorkspace(root, store_url=url)
        model = ws.script(turn(call("write_file", path="a.txt", content="a\n")), turn(APPEND), DONE)
        run_id, first = ws.start("write then log", "--model", model)
        expect(first, 3)
        waiting = ws.state(run_id)
        assert waiting.status is RunStatus.WAITING and waiting.pending is not None

        expect(ws.keel("approve", run_id), 0)
        expect(ws.keel("resume", run_id), 0)

        assert (root / "a.txt").read_text() == "a\n"
        assert log_lines(ws) == ["ran"]
        assert ws.state(run_id).status is RunStatus.COMPLETED
