"""`keel resume RUN --model SPEC`: the rest of a run is driven by another model.

A person whose provider ran dry, or who wants a stronger model for the rest of a
waiting run, resumes it with `--model`; every later `model_requested` names the model
that was asked, so the log says which model made which turn.
"""

from __future__ import annotations

from pathlib import Path

from keel.core.events import EventType
from keel.core.status import RunStatus
from keel.testing.cli import KeelWorkspace, call, expect, turn


def test_resume_with_model_drives_the_rest_of_the_run_with_that_model(tmp_path: Path) -> None:
    ws = KeelWorkspace(root=tmp_path)
    first = ws.script(turn(call("ask_user", question="which file?")), {"content": "unused"})
    # Scripted models play turn `step`: the second model's first turn is the run's second.
    second = ws.script({"content": "unused"}, turn(call("request_completion", summary="b did it")))
    run_id, waiting = ws.start("find the file", "--model", first)
    expect(waiting, 3)
    expect(ws.keel("answer", run_id, "notes.txt"), 0)

    resumed = ws.keel("resume", run_id, "--model", second)

    expect(resumed, 0)
    state = ws.state(run_id)
    assert state.status is RunStatus.COMPLETED
    assert (state.result or {}).get("summary") == "b did it"
    asked = [e.data["model"] for e in ws.events(run_id) if e.type is EventType.MODEL_REQUESTED]
    assert asked == [first, second]


def test_resume_with_a_model_that_cannot_be_used_exits_2_and_leaves_the_run(
    tmp_path: Path,
) -> None:
    ws = KeelWorkspace(root=tmp_path)
    first = ws.script(turn(call("ask_user", question="which file?")))
    run_id, waiting = ws.start("find the file", "--model", first)
    expect(waiting, 3)
    expect(ws.keel("answer", run_id, "notes.txt"), 0)
    before = ws.events(run_id)

    refused = ws.keel("resume", run_id, "--model", "deepseek:deepseek-flash")  # no API key

    expect(refused, 2)
    assert "DEEPSEEK_API_KEY" in refused.stderr
    assert ws.events(run_id) == before
