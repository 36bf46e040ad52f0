"""The chat-completions wire format: what the adapter sends and how it reads errors."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from keel.models.base import Message, ToolCall, ToolSpec
from keel.models.openai_compat import (
    provider_error_message,
    request_body,
    retry_after_seconds,
    wire_message,
)


def test_body_without_tools_omits_the_tools_key() -> None:
    body = request_body("deepseek-chat", (Message(role="user", content="hi"),), ())
    assert body == {
        "model": "deepseek-chat",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": False,
    }


def test_tools_are_offered_as_functions() -> None:
    spec = ToolSpec(name="glob", description="Find files.", parameters={"type": "object"})
    body = request_body("m", (), (spec,))
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


def test_assistant_tool_calls_keep_the_raw_argument_text() -> None:
    call = ToolCall(id="c1", name="write_file", arguments='{"path": "a", bad')
    wire = wire_message(Message(role="assistant", content="let me", tool_calls=(call,)))
    assert wire["tool_calls"][0]["function"]["arguments"] == '{"path": "a", bad'
    assert wire["content"] == "let me"
    assert set(wire) == {"role", "content", "tool_calls"}


def test_an_empty_assistant_message_is_sent_as_empty_text() -> None:
    assert wire_message(Message(role="assistant")) == {"role": "assistant", "content": ""}


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
    assert provider_error_message(parsed, raw) == expected


def test_long_error_bodies_are_cut() -> None:
    message = provider_error_message(None, "x" * 5000)
    assert len(message) < 600
    assert message.endswith("…")


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
