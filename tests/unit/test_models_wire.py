"""The chat-completions wire format: the history repaired for strict servers, the request
body per provider profile, and how the transport reads errors."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from keel.models.base import Message, ToolCall, ToolSpec
from keel.models.openai_compat import provider_error_message, retry_after_seconds
from keel.models.profiles import DEEPSEEK, OPENAI, OPENAI_COMPATIBLE, ProviderProfile
from keel.models.wire import (
    EARLIER_RESULT_PREFIX,
    NO_RESULT,
    repair_history,
    request_body,
    wire_message,
)

ALL_PROFILES = (DEEPSEEK, OPENAI, OPENAI_COMPATIBLE)
FIXTURES = Path(__file__).parents[1] / "fixtures" / "providers"

SYSTEM = Message(role="system", content="be brief")
USER = Message(role="user", content="fix the bug")


def call(call_id: str, arguments: str = '{"path": "a"}', name: str = "read_file") -> ToolCall:
    return ToolCall(id=call_id, name=name, arguments=arguments)


def asks(*calls: ToolCall, reasoning: str | None = None) -> Message:
    return Message(role="assistant", content=None, tool_calls=calls, reasoning=reasoning)


def answer(call_id: str | None, content: str = "ok") -> Message:
    return Message(role="tool", tool_call_id=call_id, content=content)


def roles(messages: tuple[Message, ...]) -> list[str]:
    return [m.role for m in messages]


def keel_message(wire: dict[str, Any]) -> Message:
    """A recorded chat-completions message as the loop would rebuild it from events."""
    calls = tuple(
        ToolCall(id=c["id"], name=c["function"]["name"], arguments=c["function"]["arguments"])
        for c in wire.get("tool_calls", [])
    )
    return Message(
        role=wire["role"],
        content=wire.get("content"),
        tool_calls=calls,
        tool_call_id=wire.get("tool_call_id"),
        reasoning=wire.get("reasoning_content") or None,
    )


# --- repair_history: rule by rule --------------------------------------------------------


def test_a_valid_history_comes_back_unchanged() -> None:
    history = (SYSTEM, USER, asks(call("c1"), call("c2")), answer("c1"), answer("c2"))
    repaired = repair_history(history)
    assert repaired == history
    assert all(a is b for a, b in zip(repaired, history, strict=True))


def test_a_call_without_an_id_gets_a_stable_id_from_its_position() -> None:
    history = (USER, asks(call("c1"), call("")), answer("c1"), answer(""))

    repaired = repair_history(history)

    assert [c.id for c in repaired[1].tool_calls] == ["c1", "call_m1_1"]
    assert repaired[3] == answer("call_m1_1")
    assert repair_history(history) == repaired  # same history, same ids


def test_empty_id_answers_are_matched_to_empty_id_calls_in_order() -> None:
    history = (USER, asks(call(""), call("")), answer(None, "first"), answer("", "second"))

    repaired = repair_history(history)

    assert [c.id for c in repaired[1].tool_calls] == ["call_m1_0", "call_m1_1"]
    assert repaired[2:] == (answer("call_m1_0", "first"), answer("call_m1_1", "second"))


def test_an_id_repeated_within_one_turn_is_renamed_and_takes_the_next_answer() -> None:
    history = (USER, asks(call("c1"), call("c1")), answer("c1", "one"), answer("c1", "two"))

    repaired = repair_history(history)

    assert [c.id for c in repaired[1].tool_calls] == ["c1", "call_m1_1"]
    assert repaired[2:] == (answer("c1", "one"), answer("call_m1_1", "two"))


def test_a_generated_id_never_collides_with_one_the_model_chose() -> None:
    history = (USER, asks(call(""), call("call_m1_0")), answer(""), answer("call_m1_0"))

    ids = [c.id for c in repair_history(history)[1].tool_calls]

    assert len(set(ids)) == 2
    assert ids[1] == "call_m1_0"


@pytest.mark.parametrize(
    "arguments",
    ['{"path": "a", bad', "", "[1, 2]", '"text"', "null", "3"],
    ids=["malformed", "empty", "array", "string", "null", "number"],
)
def test_arguments_that_are_not_a_json_object_are_sent_as_an_empty_object(
    arguments: str,
) -> None:
    history = (USER, asks(call("c1", arguments)), answer("c1", "error: arguments are not JSON"))

    repaired = repair_history(history)

    assert repaired[1].tool_calls[0].arguments == "{}"
    assert repaired[2].content == "error: arguments are not JSON"  # the error stays


def test_an_answer_after_a_harness_note_is_moved_up_to_its_call() -> None:
    note = Message(role="user", content="[harness] approval granted")
    history = (USER, asks(call("c1"), call("c2")), answer("c1"), note, answer("c2"))

    repaired = repair_history(history)

    assert repaired == (USER, history[1], answer("c1"), answer("c2"), note)


def test_answers_follow_call_order_whatever_order_they_were_recorded_in() -> None:
    history = (USER, asks(call("c1"), call("c2")), answer("c2", "two"), answer("c1", "one"))

    repaired = repair_history(history)

    assert [m.tool_call_id for m in repaired[2:]] == ["c1", "c2"]


def test_a_call_with_no_answer_gets_a_no_result_message() -> None:
    later = Message(role="assistant", content="done")
    history = (USER, asks(call("c1"), call("c2")), answer("c2"), later)

    repaired = repair_history(history)

    assert repaired == (
        USER,
        history[1],
        Message(role="tool", tool_call_id="c1", content=NO_RESULT),
        answer("c2"),
        later,
    )


def test_answers_are_not_taken_from_after_the_next_assistant_turn() -> None:
    # Both turns use the id c1: the first turn's missing answer must not steal the second's.
    history = (USER, asks(call("c1")), asks(call("c1")), answer("c1", "second"))

    repaired = repair_history(history)

    assert [m.content for m in repaired if m.role == "tool"] == [NO_RESULT, "second"]
    assert roles(repaired) == ["user", "assistant", "tool", "assistant", "tool"]


def test_a_second_answer_to_one_call_keeps_the_first_and_shows_the_second_as_a_note() -> None:
    history = (USER, asks(call("c1")), answer("c1", "first"), answer("c1", "again"))

    repaired = repair_history(history)

    assert repaired[2] == answer("c1", "first")
    assert repaired[3] == Message(role="user", content=EARLIER_RESULT_PREFIX + "again")


def test_an_orphan_tool_message_becomes_a_user_note_where_it_stood() -> None:
    history = (SYSTEM, answer("gone", "42 files"), USER)

    repaired = repair_history(history)

    assert repaired == (
        SYSTEM,
        Message(role="user", content="[tool result for an earlier call] 42 files"),
        USER,
    )


def test_system_messages_stay_first() -> None:
    other = Message(role="system", content="tools: read_file")
    history = (SYSTEM, other, answer("x"), USER, asks(call("")))

    repaired = repair_history(history)

    assert repaired[:2] == (SYSTEM, other)
    assert roles(repaired) == ["system", "system", "user", "user", "assistant", "tool"]


def test_every_repaired_history_pairs_each_call_with_exactly_one_answer() -> None:
    history = (
        SYSTEM,
        answer("stray"),
        USER,
        asks(call(""), call("c1", "nope"), call("c1")),
        answer("c1", "a"),
        Message(role="user", content="note"),
        answer("", "b"),
        answer("c1", "c"),
        answer("c1", "d"),
        asks(call("c9")),
    )

    repaired = repair_history(history)

    for index, message in enumerate(repaired):
        if message.role == "assistant" and message.tool_calls:
            ids = [c.id for c in message.tool_calls]
            following = repaired[index + 1 : index + 1 + len(ids)]
            assert [m.role for m in following] == ["tool"] * len(ids)
            assert [m.tool_call_id for m in following] == ids
            assert len(set(ids)) == len(ids) and all(ids)
            assert all(isinstance(json.loads(c.arguments), dict) for c in message.tool_calls)
    answered = [m for m in repaired if m.role == "tool"]
    assert len(answered) == sum(len(m.tool_calls) for m in repaired)
    contents = [m.content for m in repaired]
    assert EARLIER_RESULT_PREFIX + "ok" in contents  # the stray answer, kept as a note
    assert EARLIER_RESULT_PREFIX + "d" in contents  # the extra answer, kept as a note


# --- request_body ------------------------------------------------------------------------


@pytest.mark.parametrize("profile", ALL_PROFILES, ids=lambda p: p.name)
def test_body_without_tools_or_streaming_has_only_model_messages_and_stream(
    profile: ProviderProfile,
) -> None:
    body = request_body(profile, "m", (USER,), (), stream=False)
    assert body == {
        "model": "m",
        "messages": [{"role": "user", "content": "fix the bug"}],
        "stream": False,
    }


@pytest.mark.parametrize("profile", ALL_PROFILES, ids=lambda p: p.name)
def test_a_streaming_body_asks_for_usage_in_the_last_chunk(profile: ProviderProfile) -> None:
    body = request_body(profile, "m", (USER,), (), stream=True)
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}


def test_tools_are_offered_as_functions() -> None:
    spec = ToolSpec(name="glob", description="Find files.", parameters={"type": "object"})
    body = request_body(OPENAI, "m", (), (spec,), stream=False)
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "glob",
                "description": "Find files.",
                "parameters": {"type": "object"},
            },
        }
    ]


def test_the_body_sends_the_repaired_history() -> None:
    history = (USER, asks(call("", "bad")), Message(role="user", content="go on"))
    sent = request_body(OPENAI, "m", history, (), stream=False)["messages"]
    assert sent[1]["tool_calls"][0]["id"] == "call_m1_0"
    assert sent[1]["tool_calls"][0]["function"]["arguments"] == "{}"
    assert sent[2] == {"role": "tool", "tool_call_id": "call_m1_0", "content": NO_RESULT}


THINKING_HISTORY = (
    USER,
    Message(role="assistant", content="plain answer", reasoning="no tools needed"),
    Message(role="user", content="now read a"),
    asks(call("c1"), reasoning="I should read a first"),
    answer("c1"),
    asks(call("c2")),
    answer("c2"),
)


def test_deepseek_gets_reasoning_back_only_on_assistant_messages_that_made_tool_calls() -> None:
    sent = request_body(DEEPSEEK, "deepseek-v4-flash", THINKING_HISTORY, (), stream=False)
    messages = sent["messages"]

    assert messages[1] == {"role": "assistant", "content": "plain answer"}
    assert messages[3] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "read_file", "arguments": '{"path": "a"}'},
            }
        ],
        "reasoning_content": "I should read a first",
    }
    # A tool-call turn with no recorded reasoning still carries the field, empty: thinking
    # mode refuses the request without it (and accepts it empty).
    assert messages[5]["reasoning_content"] == ""


def test_deepseek_thinking_history_is_sent_as_deepseek_accepted_it() -> None:
    # The third request of a recorded DeepSeek thinking-mode exchange (see the fixture's
    # source): turn 1's reasoning and turn 2's empty one went back with the tool calls.
    recorded = json.loads((FIXTURES / "deepseek_thinking_turn3.json").read_text())["request"]
    history = tuple(keel_message(m) for m in recorded["messages"])

    sent = request_body(DEEPSEEK, recorded["model"], history, (), stream=False)

    assert sent["messages"] == recorded["messages"]


@pytest.mark.parametrize("profile", [OPENAI, OPENAI_COMPATIBLE], ids=lambda p: p.name)
def test_other_providers_never_get_reasoning_back(profile: ProviderProfile) -> None:
    sent = request_body(profile, "m", THINKING_HISTORY, (), stream=False)
    text = json.dumps(sent)
    assert "reasoning" not in text
    assert "I should read a first" not in text


@pytest.mark.parametrize("profile", ALL_PROFILES, ids=lambda p: p.name)
def test_no_field_outside_the_chat_completions_schema_is_ever_sent(
    profile: ProviderProfile,
) -> None:
    spec = ToolSpec(name="glob", description="d", parameters={"type": "object"})
    body = request_body(profile, "m", (SYSTEM, *THINKING_HISTORY), (spec,), stream=True)

    assert set(body) <= {"model", "messages", "stream", "stream_options", "tools"}
    echo = {profile.echo_field} if profile.echo_reasoning else set()
    for message in body["messages"]:
        allowed = {
            "system": {"role", "content"},
            "user": {"role", "content"},
            "assistant": {"role", "content", "tool_calls", *echo},
            "tool": {"role", "tool_call_id", "content"},
        }[message["role"]]
        assert set(message) <= allowed
        for sent_call in message.get("tool_calls", []):
            assert set(sent_call) == {"id", "type", "function"}
            assert set(sent_call["function"]) == {"name", "arguments"}


def test_an_empty_assistant_message_is_sent_as_empty_text() -> None:
    assert wire_message(OPENAI, Message(role="assistant")) == {
        "role": "assistant",
        "content": "",
    }


def test_an_assistant_message_with_calls_keeps_its_content() -> None:
    wire = wire_message(
        OPENAI, Message(role="assistant", content="let me", tool_calls=(call("c"),))
    )
    assert wire["content"] == "let me"
    assert set(wire) == {"role", "content", "tool_calls"}


# --- provider errors (the transport's helpers) -------------------------------------------


@pytest.mark.parametrize(
    ("parsed", "raw", "expected"),
    [
        ({"error": {"message": "Insufficient Balance", "type": "x"}}, "", "Insufficient Balance"),
        ({"error": "model not found"}, "", "model not found"),
        ({"detail": "Not authenticated"}, "", "Not authenticated"),
        (None, "<html>Bad Gateway</html>", "<html>Bad Gateway</html>"),
        (None, "   ", "(empty body)"),
    ],
)
def test_provider_error_message_prefers_the_providers_words(
    parsed: object, raw: str, expected: str
) -> None:
    assert expected in provider_error_message(parsed, raw)


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"retry-after": "2"}, 2.0),
        ({"retry-after": "0.5"}, 0.5),
        ({"retry-after-ms": "250", "retry-after": "9"}, 0.25),
        ({"retry-after": "Wed, 21 Oct 2026 07:28:10 GMT"}, 10.0),
        ({"retry-after": "soon"}, None),
        ({}, None),
    ],
)
def test_retry_after_is_read_as_seconds_or_a_date(
    headers: dict[str, str], expected: float | None
) -> None:
    now = datetime(2026, 10, 21, 7, 28, 0, tzinfo=UTC)
    assert retry_after_seconds(headers, now=now) == expected
