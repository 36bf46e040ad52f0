"""Questions end to end: ask_user makes `keel run` exit 3; `keel answer` then `keel resume`.

Real `keel` processes (stdin /dev/null) on a real SQLite file; scripted model turns.
"""

from __future__ import annotations

from pathlib import Path

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
    one_line_error,
    run_command_call,
    turn,
)

QUESTION = "Which colour should the banner be?"
ASK = turn(call("ask_user", question=QUESTION))


@pytest.fixture
def ws(tmp_path: Path) -> KeelWorkspace:
    return KeelWorkspace(tmp_path)


def test_a_question_waits_and_the_answer_reaches_the_model_on_resume(ws: KeelWorkspace) -> None:
    model = ws.script(ASK, turn(call("write_file", path="banner.txt", content="blue\n")), DONE)

    run_id, first = ws.start("make a banner", "--model", model)

    out = flat(expect(first, 3))
    assert QUESTION in out and f"keel answer {run_id} TEXT" in out
    shown = flat(expect(ws.keel("show", run_id), 0))
    assert QUESTION in shown and f"keel answer {run_id} TEXT" in shown
    asked = ws.of_type(run_id, EventType.INPUT_REQUESTED)
    assert [e.data["question"] for e in asked] == [QUESTION]
    assert not (ws.root / "banner.txt").exists()

    expect(ws.keel("answer", run_id, "dark blue, please"), 0)
    expect(ws.keel("resume", run_id), 0)

    assert ws.state(run_id).status is RunStatus.COMPLETED
    events = ws.events(run_id)
    received = next(e for e in events if e.type is EventType.INPUT_RECEIVED)
    assert received.data["answer"] == "dark blue, please"
    later = [e for e in events if e.seq > received.seq]
    assert any(e.type is EventType.MODEL_REQUESTED for e in later)
    # What the model was shown next contains the answer as the question's result.
    view = Transcript([e for e in events if e.seq <= received.seq]).view()
    assert view[-1].role == "tool" and "dark blue, please" in (view[-1].content or "")


def test_blank_misdirected_and_unasked_answers_are_refused_and_write_nothing(
    ws: KeelWorkspace,
) -> None:
    model = ws.script(ASK, DONE)
    run_id, first = ws.start("make a banner", "--model", model)
    expect(first, 3)
    before = ws.state(run_id).last_seq

    blank = one_line_error(ws.keel("answer", run_id, "   "))
    approve = one_line_error(ws.keel("approve", run_id))

    assert "blank" in blank
    assert "not waiting for an approval" in approve and "question" in approve
    assert ws.state(run_id).last_seq == before  # nothing written
    expect(ws.keel("answer", run_id, "red"), 0)
    after = ws.state(run_id).last_seq

    again = one_line_error(ws.keel("answer", run_id, "green"))

    assert "not waiting for an answer" in again
    assert ws.state(run_id).last_seq == after
    expect(ws.keel("resume", run_id), 0)
    answers = [e.data["answer"] for e in ws.of_type(run_id, EventType.INPUT_RECEIVED)]
    assert answers == ["red"]


def test_an_answer_to_a_run_waiting_for_approval_is_refused(ws: KeelWorkspace) -> None:
    model = ws.script(turn(run_command_call("true")), DONE)
    run_id, first = ws.start("run true", "--model", model)
    expect(first, 3)
    before = ws.state(run_id).last_seq

    refused = one_line_error(ws.keel("answer", run_id, "yes"))

    assert "not waiting for an answer" in refused and "approval" in refused
    assert ws.state(run_id).last_seq == before


def test_an_answer_to_an_unknown_run_is_refused(ws: KeelWorkspace) -> None:
    model = ws.script(DONE)
    run_id, first = ws.start("finish", "--model", model)
    expect(first, 0)

    assert "run_doesnotexist" in one_line_error(ws.keel("answer", "run_doesnotexist", "hi"))
    assert "not waiting for an answer" in one_line_error(ws.keel("answer", run_id, "hi"))
