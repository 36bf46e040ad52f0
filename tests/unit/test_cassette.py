"""Cassettes: recording model exchanges and replaying them, refusing a request that differs."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from keel.core.errors import ConfigError, ModelError
from keel.models.base import (
    Message,
    ModelRequest,
    ModelTurn,
    StreamDelta,
    TokenUsage,
    ToolCall,
    ToolSpec,
)
from keel.models.cassette import (
    EXCERPT_CHARS,
    RecordingModel,
    ReplayModel,
    canonical_request,
    request_digest,
)
from keel.models.scripted import ScriptedModel

READ = ToolSpec(
    name="read_file",
    description="Read a file.",
    parameters={"type": "object", "properties": {"path": {"type": "string"}}},
)
WRITE = ToolSpec(
    name="write_file",
    description="Write a file.",
    parameters={
        "type": "object",
        "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
    },
)
CALL = ToolCall(id="call_0_0", name="write_file", arguments='{"path": "a.txt", "content": "hi"}')
MESSAGES = (
    Message(role="system", content="You are an agent."),
    Message(role="user", content="write hi to a.txt"),
    Message(role="assistant", content=None, tool_calls=(CALL,)),
    Message(role="tool", tool_call_id="call_0_0", content="wrote 2 bytes to a.txt"),
)


def request(
    messages: tuple[Message, ...] = MESSAGES,
    tools: tuple[ToolSpec, ...] = (READ, WRITE),
    step: int = 0,
    **extra: Any,
) -> ModelRequest:
    return ModelRequest(messages=messages, tools=tools, step=step, **extra)


class Inner:
    """A model answering each step with a fixed turn, or failing where told."""

    spec = "openai:gpt-4o"
    priced = False

    def __init__(self, turns: dict[int, ModelTurn | ModelError]) -> None:
        self.turns = turns

    def complete(self, req: ModelRequest) -> ModelTurn:
        answer = self.turns[req.step]
        if isinstance(answer, ModelError):
            raise answer
        return answer


FULL_TURN = ModelTurn(
    content="done",
    reasoning="thought about it",
    tool_calls=(ToolCall(id="c1", name="read_file", arguments='{"path": "a.txt"}'),),
    usage=TokenUsage(
        input_tokens=100, output_tokens=20, cached_input_tokens=64, reasoning_tokens=7
    ),
    cost=0.0125,
    model="gpt-4o-2024-08-06",
    finish_reason="length",
    provider_finish_reason="max_tokens",
    refusal=None,
)


def record(path: Path, *requests: ModelRequest, turn: ModelTurn = FULL_TURN) -> RecordingModel:
    model = RecordingModel(Inner({r.step: turn for r in requests}), path)
    for req in requests:
        model.complete(req)
    return model


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def diverged(cassette: Path, now: ModelRequest) -> str:
    with pytest.raises(ModelError) as caught:
        ReplayModel.from_file(cassette).complete(now)
    assert caught.value.transient is False
    assert caught.value.reason == "model_error"
    return str(caught.value)


# --- the digest ----------------------------------------------------------------------------


def test_digest_is_the_same_whatever_the_order_of_keys() -> None:
    shuffled = ToolSpec(
        name="write_file",
        description="Write a file.",
        parameters={
            "properties": {"content": {"type": "string"}, "path": {"type": "string"}},
            "type": "object",
        },
    )
    one = canonical_request(request(tools=(READ, WRITE)))
    other = canonical_request(request(tools=(READ, shuffled)))

    assert request_digest(one) == request_digest(other)
    assert request_digest(one) == request_digest(json.loads(json.dumps(one)))


def test_digest_changes_with_anything_the_model_sees() -> None:
    base = request_digest(canonical_request(request()))
    changed = [
        request(messages=(*MESSAGES[:3], replace(MESSAGES[3], content="wrote 3 bytes"))),
        request(messages=(*MESSAGES[:2], replace(MESSAGES[2], reasoning="because"))),
        request(tools=(READ,)),
        request(tools=(READ, replace(WRITE, description="Write."))),
    ]
    assert base not in {request_digest(canonical_request(r)) for r in changed}
    # What the model does not see (step, callbacks) is no part of it.
    assert request_digest(canonical_request(request(step=4, on_delta=print))) == base


# --- recording -----------------------------------------------------------------------------


def test_recording_writes_a_header_then_one_exchange_per_call(tmp_path: Path) -> None:
    cassette = tmp_path / "run.cassette"
    model = record(cassette, request(step=0), request(step=1))

    header, first, second = lines(cassette)
    assert header["keel_cassette"] == 1
    assert header["model"] == "openai:gpt-4o"
    assert header["recorded_at"].endswith("Z")
    assert [first["step"], second["step"]] == [0, 1]
    assert first["request"] == canonical_request(request())
    assert first["request_digest"] == request_digest(canonical_request(request()))
    assert first["turn"] == {
        "content": "done",
        "reasoning": "thought about it",
        "tool_calls": [{"id": "c1", "name": "read_file", "arguments": '{"path": "a.txt"}'}],
        "usage": {
            "input_tokens": 100,
            "output_tokens": 20,
            "cached_input_tokens": 64,
            "reasoning_tokens": 7,
        },
        "cost": 0.0125,
        "model": "gpt-4o-2024-08-06",
        "finish_reason": "length",
        "provider_finish_reason": "max_tokens",
        "refusal": None,
    }
    assert model.spec == "openai:gpt-4o"
    assert model.priced is False  # the inner model's word


def test_a_failed_call_records_nothing_and_is_raised(tmp_path: Path) -> None:
    cassette = tmp_path / "run.cassette"
    failure = ModelError("provider said no", status_code=400)
    model = RecordingModel(Inner({0: failure}), cassette)

    with pytest.raises(ModelError, match="provider said no"):
        model.complete(request())
    assert len(lines(cassette)) == 1  # the header only


def test_redact_keeps_a_planted_secret_out_of_the_file(tmp_path: Path) -> None:
    secret = "sk-live-9f8e7d6c5b4a3210secret"
    cassette = tmp_path / "run.cassette"
    planted = request(
        messages=(
            Message(role="user", content=f"use key {secret}"),
            Message(
                role="assistant",
                tool_calls=(ToolCall(id="c", name="write_file", arguments=f'{{"k": "{secret}"}}'),),
                reasoning=secret,
            ),
        ),
        tools=(replace(READ, parameters={"default": secret}),),
    )
    turn = replace(
        FULL_TURN,
        content=f"the key is {secret}",
        tool_calls=(ToolCall(id="c2", name="write_file", arguments=f'"{secret}"'),),
    )
    model = RecordingModel(
        Inner({0: turn}), cassette, redact=lambda text: text.replace(secret, "[redacted:KEY]")
    )

    answered = model.complete(planted)

    assert secret not in cassette.read_text(encoding="utf-8")
    assert "[redacted:KEY]" in cassette.read_text(encoding="utf-8")
    assert answered == turn  # the run itself gets the turn as the provider sent it


def test_recording_again_appends_and_the_last_exchange_for_a_step_wins(tmp_path: Path) -> None:
    cassette = tmp_path / "run.cassette"
    record(cassette, request(step=0), request(step=1))
    again = replace(FULL_TURN, content="second take")
    record(cassette, request(step=1), turn=again)  # a resumed run re-asked step 1

    assert [line.get("step") for line in lines(cassette)] == [None, 0, 1, 1]
    replay = ReplayModel.from_file(cassette)
    assert replay.complete(request(step=1)).content == "second take"
    assert replay.complete(request(step=0)).content == "done"


def test_recording_refuses_a_cassette_of_another_model(tmp_path: Path) -> None:
    cassette = tmp_path / "run.cassette"
    record(cassette, request())
    other = ScriptedModel([{"content": "x"}], spec="scripted:other.json")

    with pytest.raises(ConfigError, match=r"recorded from model 'openai:gpt-4o'.*new file"):
        RecordingModel(other, cassette)


def test_recording_drops_a_torn_last_line_before_appending(tmp_path: Path) -> None:
    cassette = tmp_path / "run.cassette"
    record(cassette, request(step=0))
    with open(cassette, "ab") as file:
        file.write(b'{"step": 1, "request_dig')  # the recorder died here

    record(cassette, request(step=1))

    assert [line.get("step") for line in lines(cassette)] == [None, 0, 1]


# --- replaying -----------------------------------------------------------------------------


def test_replay_plays_every_field_of_the_recorded_turn(tmp_path: Path) -> None:
    cassette = tmp_path / "run.cassette"
    record(cassette, request())
    replay = ReplayModel.from_file(cassette)

    assert replay.complete(request()) == FULL_TURN
    assert replay.spec == f"replay:{cassette}"
    assert replay.priced is True


def test_replay_shows_the_recorded_text_to_a_live_view(tmp_path: Path) -> None:
    cassette = tmp_path / "run.cassette"
    record(cassette, request())
    seen: list[StreamDelta] = []

    ReplayModel.from_file(cassette, spec="replay:x").complete(request(on_delta=seen.append))

    assert [(d.kind, d.text) for d in seen] == [
        ("reasoning", "thought about it"),
        ("content", "done"),
    ]


def test_replay_without_an_exchange_for_the_step_says_how_many_it_has(tmp_path: Path) -> None:
    cassette = tmp_path / "run.cassette"
    record(cassette, request(step=0), request(step=1))

    with pytest.raises(ModelError) as caught:
        ReplayModel.from_file(cassette).complete(request(step=2))
    assert str(caught.value) == "the cassette has no exchange for step 3 (it recorded 2)"
    assert caught.value.transient is False


def test_divergence_names_the_message_whose_content_changed(tmp_path: Path) -> None:
    cassette = tmp_path / "run.cassette"
    record(cassette, request(step=2))
    now = (*MESSAGES[:3], replace(MESSAGES[3], content="wrote 3 bytes to a.txt"))

    assert diverged(cassette, request(now, step=2)) == (
        "replay diverged at step 3: message 3 (tool) content differs: "
        "recorded 'wrote 2 bytes to a.txt' now 'wrote 3 bytes to a.txt'"
    )


def test_divergence_names_the_first_extra_message(tmp_path: Path) -> None:
    cassette = tmp_path / "run.cassette"
    record(cassette, request(MESSAGES[:3]))

    assert diverged(cassette, request(MESSAGES)) == (
        "replay diverged at step 1: request has 4 messages, recorded 3 "
        "(first extra: tool 'wrote 2 bytes to a.txt')"
    )


def test_divergence_names_the_first_missing_message(tmp_path: Path) -> None:
    cassette = tmp_path / "run.cassette"
    record(cassette, request(MESSAGES))

    assert diverged(cassette, request(MESSAGES[:2])) == (
        "replay diverged at step 1: request has 2 messages, recorded 4 "
        """(first missing: assistant 'write_file({"path": "a.txt", "content": "hi"})')"""
    )


def test_divergence_lists_the_tools_offered_then_and_now(tmp_path: Path) -> None:
    cassette = tmp_path / "run.cassette"
    record(cassette, request(tools=(READ, WRITE)))

    assert diverged(cassette, request(tools=(READ,))) == (
        "replay diverged at step 1: tools differ: recorded read_file,write_file now read_file"
    )


def test_divergence_names_a_tool_whose_schema_changed(tmp_path: Path) -> None:
    cassette = tmp_path / "run.cassette"
    record(cassette, request(tools=(READ, WRITE)))

    message = diverged(cassette, request(tools=(READ, replace(WRITE, parameters={}))))
    assert message.startswith("replay diverged at step 1: tool write_file parameters differ: ")
    assert "now '{}'" in message


def test_divergence_names_the_tool_call_whose_arguments_changed(tmp_path: Path) -> None:
    cassette = tmp_path / "run.cassette"
    record(cassette, request())
    call = replace(CALL, arguments='{"path": "b.txt", "content": "hi"}')
    now = (*MESSAGES[:2], replace(MESSAGES[2], tool_calls=(call,)), MESSAGES[3])

    assert diverged(cassette, request(now)) == (
        "replay diverged at step 1: message 2 (assistant) tool call 0 (write_file) "
        """arguments differ: recorded '{"path": "a.txt", "content": "hi"}' """
        """now '{"path": "b.txt", "content": "hi"}'"""
    )


def test_divergence_quotes_at_most_an_excerpt_around_the_change(tmp_path: Path) -> None:
    cassette = tmp_path / "run.cassette"
    long = "line of text\n" * 100
    record(cassette, request((Message(role="user", content=long + "old ending"),)))

    message = diverged(cassette, request((Message(role="user", content=long + "new ending"),)))

    quoted = message.split("recorded ", 1)[1].split(" now ")
    assert all(len(q.strip("'")) <= EXCERPT_CHARS for q in quoted)
    assert "old ending" in quoted[0] and "new ending" in quoted[1]
    assert "\n" not in message


# --- broken cassettes ----------------------------------------------------------------------


def test_a_missing_cassette_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"replay cassette .*nowhere\.cassette does not exist"):
        ReplayModel.from_file(tmp_path / "nowhere.cassette")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", r"is empty: not a keel cassette"),
        ("not json\n", r"line 1: not a keel cassette header"),
        ('{"model": "x"}\n', r"line 1: not a keel cassette header"),
        ('{"keel_cassette": 2}\n', r"line 1: cassette version 2 is not supported"),
    ],
)
def test_a_bad_header_is_named_with_its_file(tmp_path: Path, text: str, expected: str) -> None:
    cassette = tmp_path / "bad.cassette"
    cassette.write_text(text, encoding="utf-8")

    with pytest.raises(ConfigError, match=expected) as caught:
        ReplayModel.from_file(cassette)
    assert str(cassette) in str(caught.value)


def corrupt(path: Path, line: int, change: Any) -> None:
    """Replace line `line` (1-based) of a recorded cassette by what `change` makes of it."""
    rows = path.read_text(encoding="utf-8").splitlines()
    rows[line - 1] = change(json.loads(rows[line - 1]))
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")


def _edit(data: dict[str, Any], **turn: Any) -> str:
    data["turn"].update(turn)
    return json.dumps(data)


def _edited_request(data: dict[str, Any]) -> str:
    data["request"]["messages"][0]["content"] = "edited"
    return json.dumps(data)


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda d: "{broken", r"line 3: not valid JSON"),
        (lambda d: json.dumps({"step": 1}), r"line 3: an exchange needs step, request_digest"),
        (lambda d: json.dumps({**d, "step": -1}), r"line 3: step must be a whole number"),
        (_edited_request, r"line 3: request_digest does not match the recorded request"),
        (lambda d: _edit(d, cost="free"), r"line 3: .*cost must be a finite number"),
        (lambda d: _edit(d, finish_reason="bored"), r"line 3: turn finish_reason 'bored'"),
        (lambda d: _edit(d, tool_calls=[{"id": 1}]), r"line 3: turn tool call 0 needs"),
        (lambda d: _edit(d, usage={"input_tokens": -1}), r"line 3: turn usage input_tokens"),
    ],
)
def test_a_bad_exchange_is_named_with_its_file_and_line(
    tmp_path: Path, change: Any, expected: str
) -> None:
    cassette = tmp_path / "run.cassette"
    record(cassette, request(step=0), request(step=1), request(step=2))
    corrupt(cassette, 3, change)

    with pytest.raises(ConfigError, match=expected) as caught:
        ReplayModel.from_file(cassette)
    assert str(cassette) in str(caught.value)


def test_replay_ignores_a_torn_last_line_a_crash_left(tmp_path: Path) -> None:
    cassette = tmp_path / "run.cassette"
    record(cassette, request(step=0))
    with open(cassette, "ab") as file:
        file.write(b'{"step": 1, "request_dig')

    replay = ReplayModel.from_file(cassette)

    assert replay.steps == 1
    assert replay.complete(request(step=0)) == FULL_TURN
