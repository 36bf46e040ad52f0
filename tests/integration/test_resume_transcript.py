"""A resumed long run shows the model exactly the conversation a never-stopped process would."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from keel.core.budget import Budget
from keel.core.status import RunStatus
from keel.loop.transcript import Transcript
from keel.runtime.harness import Harness
from keel.store.url import open_store
from keel.testing import ScriptedModel

STEPS = 150  # far more messages than the model's view holds


def long_script() -> list[dict[str, Any]]:
    turns: list[dict[str, Any]] = [
        {"tool_calls": [{"name": "read_file", "arguments": {"path": "a.txt", "limit": i + 1}}]}
        for i in range(STEPS)
    ]
    turns.append({"tool_calls": [{"name": "ask_user", "arguments": {"question": "go on?"}}]})
    turns.append({"content": "done"})
    return turns


def test_resumed_run_rebuilds_the_models_view_from_the_log_tail_identically(
    tmp_path: Path,
) -> None:
    (tmp_path / "a.txt").write_text("hello\n")
    url = f"sqlite:///{tmp_path / 'keel.db'}"
    budget = Budget(max_steps=STEPS * 2, max_tool_calls=STEPS * 2)
    with Harness(store=url, model=ScriptedModel(long_script())) as first:
        waiting = first.run("read a lot", cwd=tmp_path, budget=budget)
    assert waiting.status is RunStatus.WAITING

    resumed_model = ScriptedModel(long_script())
    with Harness(store=url, model=resumed_model) as second:
        second.answer(waiting.id, "yes")
        with open_store(url) as store:
            answered = Transcript(store.read_events(waiting.id))
        outcome = second.resume(waiting.id)

    assert outcome.status is RunStatus.COMPLETED
    (request,) = resumed_model.requests
    assert request.step == STEPS + 1
    assert list(request.messages[2:]) == answered.view()  # system, goal, then the view
    assert len(answered.messages) > 2 * len(answered.view())  # the view is a small tail
