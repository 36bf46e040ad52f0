"""ask_user through the loop, as the model sees it (Harness API, real SQLite file)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from keel.core.errors import NothingPending, UsageError
from keel.core.events import EventType
from keel.core.status import RunStatus
from keel.models.base import Message
from keel.models.scripted import ScriptedModel
from keel.runtime.harness import Harness


def turn(*calls: dict[str, Any]) -> dict[str, Any]:
    return {"tool_calls": list(calls)}


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "arguments": arguments}


DONE = turn(call("request_completion", summary="done"))


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    return root


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/keel.db"


def tool_results(messages: tuple[Message, ...]) -> dict[str, str]:
    return {m.tool_call_id or "": m.content or "" for m in messages if m.role == "tool"}


def test_the_answer_reaches_the_model_as_the_result_of_its_question(
    workspace: Path, store_url: str
) -> None:
    model = ScriptedModel([turn(call("ask_user", question="Which port?")), DONE])
    with Harness(store=store_url, model=model) as h:
        waiting = h.run("configure", cwd=workspace)
        assert waiting.status is RunStatus.WAITING
        assert waiting.state.pending is not None and waiting.state.pending.question == "Which port?"
        assert len(model.requests) == 1  # no model turn while it waits

        h.answer(waiting.id, "8080")
        assert h.resume(waiting.id).status is RunStatus.COMPLETED

        assert tool_results(model.requests[1].messages)["call_0_0"] == "The user answered: 8080"


def test_blank_and_unasked_answers_raise_and_record_nothing(
    workspace: Path, store_url: str
) -> None:
    model = ScriptedModel([turn(call("ask_user", question="Which port?")), DONE])
    with Harness(store=store_url, model=model) as h:
        waiting = h.run("configure", cwd=workspace)
        with pytest.raises(UsageError, match="blank"):
            h.answer(waiting.id, " \n\t")
        assert h.get(waiting.id).last_seq == waiting.state.last_seq
        h.answer(waiting.id, "8080")
        with pytest.raises(NothingPending, match="not waiting for an answer"):
            h.answer(waiting.id, "9090")


def test_a_second_question_in_the_same_turn_is_refused_while_the_first_waits(
    workspace: Path, store_url: str
) -> None:
    model = ScriptedModel(
        [
            turn(
                call("ask_user", question="Which port?"), call("ask_user", question="Which host?")
            ),
            DONE,
        ]
    )
    with Harness(store=store_url, model=model) as h:
        waiting = h.run("configure", cwd=workspace)

        assert waiting.state.pending is not None
        assert waiting.state.pending.question == "Which port?"
        refused = [e for e in h.events(waiting.id) if e.type is EventType.TOOL_FAILED]
        assert [(e.data["call_id"], e.data["error_kind"]) for e in refused] == [
            ("call_0_1", "invalid_turn")
        ]

        h.answer(waiting.id, "8080")
        assert h.resume(waiting.id).status is RunStatus.COMPLETED

        asked = [e for e in h.events(waiting.id) if e.type is EventType.INPUT_REQUESTED]
        assert [e.data["question"] for e in asked] == ["Which port?"]
        results = tool_results(model.requests[1].messages)
        assert results["call_0_0"] == "The user answered: 8080"
        assert "one question at a time" in results["call_0_1"]


def test_a_question_mixed_with_a_write_is_refused_whole_as_invalid_model_output(
    workspace: Path, store_url: str
) -> None:
    model = ScriptedModel(
        [
            turn(
                call("ask_user", question="May I?"),
                call("write_file", path="a.txt", content="a"),
            ),
            DONE,
        ]
    )
    with Harness(store=store_url, model=model) as h:
        outcome = h.run("write", cwd=workspace)

        assert outcome.status is RunStatus.COMPLETED  # the run went on; nothing was asked
        assert not (workspace / "a.txt").exists()
        events = list(h.events(outcome.id))
        assert not any(e.type is EventType.INPUT_REQUESTED for e in events)
        results = tool_results(model.requests[1].messages)
        assert set(results) == {"call_0_0", "call_0_1"}
        for text in results.values():
            assert "invalid model output" in text and "write_file" in text
