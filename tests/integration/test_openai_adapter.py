"""The OpenAI-compatible adapter against a real chat-completions server on 127.0.0.1."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from keel.core.errors import ModelError
from keel.models.base import Message, ModelRequest, RetryNotice, ToolCall, ToolSpec
from keel.models.openai_compat import OpenAICompatModel
from keel.testing.provider import FakeProvider

READ_FILE = ToolSpec(
    name="read_file",
    description="Read a file in the workspace.",
    parameters={
        "type": "object",
        "properties": {"path": {"type": "string"}},
        "required": ["path"],
    },
)


@pytest.fixture
def provider() -> Iterator[FakeProvider]:
    with FakeProvider() as server:
        yield server


MakeModel = Callable[..., OpenAICompatModel]


@pytest.fixture
def make_model(provider: FakeProvider) -> MakeModel:
    """An adapter pointed at the fake provider, with millisecond backoff and timeouts."""

    def make(**overrides: Any) -> OpenAICompatModel:
        settings: dict[str, Any] = {
            "spec": "openai:gpt-4o",
            "model": "gpt-4o",
            "base_url": provider.base_url,
            "api_key": "sk-test",
            "max_attempts": 3,
            "max_wait": 1.0,
            "initial_wait": 0.001,
            "timeout": 0.5,
        }
        settings.update(overrides)
        return OpenAICompatModel(**settings)

    return make


def ask(
    text: str = "check package.json",
    *,
    step: int = 0,
    notices: list[RetryNotice] | None = None,
    messages: tuple[Message, ...] | None = None,
) -> ModelRequest:
    return ModelRequest(
        messages=messages or (Message(role="user", content=text),),
        tools=(READ_FILE,),
        step=step,
        on_retry=notices.append if notices is not None else None,
    )


# --- a successful turn ---------------------------------------------------------------


def test_tool_calling_turn_is_parsed_with_usage_and_cost(
    provider: FakeProvider, make_model: MakeModel
) -> None:
    provider.reply(
        tool_calls=[("read_file", {"path": "package.json"}), ("read_file", '{"path": ')],
        usage=(1000, 200),
        model="gpt-4o-2024-08-06",
    )
    turn = make_model().complete(ask())

    assert turn.content is None
    assert turn.tool_calls == (
        ToolCall(id="call_fake_0_0", name="read_file", arguments='{"path": "package.json"}'),
        ToolCall(id="call_fake_0_1", name="read_file", arguments='{"path": '),
    )
    assert (turn.usage.input_tokens, turn.usage.output_tokens) == (1000, 200)
    assert turn.cost == pytest.approx((1000 * 2.50 + 200 * 10.00) / 1_000_000)
    assert turn.model == "gpt-4o-2024-08-06"
    assert turn.reasoning is None


def test_request_offers_tools_and_sends_the_key(
    provider: FakeProvider, make_model: MakeModel
) -> None:
    provider.reply(content="done")
    make_model().complete(ask("hello"))

    [body] = provider.requests
    assert body["model"] == "gpt-4o"
    assert body["messages"] == [{"role": "user", "content": "hello"}]
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "read_file",
                "description": "Read a file in the workspace.",
                "parameters": READ_FILE.parameters,
            },
        }
    ]
    assert provider.headers[0]["authorization"] == "Bearer sk-test"


def test_tool_results_are_fed_back_linked_to_their_calls(
    provider: FakeProvider, make_model: MakeModel
) -> None:
    provider.reply(content="the name is keel")
    call = ToolCall(id="call_7", name="read_file", arguments='{"path": "package.json"}')
    conversation = (
        Message(role="system", content="You are careful."),
        Message(role="user", content="what is the package name?"),
        Message(role="assistant", content=None, tool_calls=(call,)),
        Message(role="tool", tool_call_id="call_7", content='{"name": "keel"}'),
    )
    turn = make_model().complete(ask(messages=conversation, step=1))

    assert turn.content == "the name is keel"
    assert turn.tool_calls == ()
    sent = provider.requests[0]["messages"]
    assert sent[2] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_7",
                "type": "function",
                "function": {"name": "read_file", "arguments": '{"path": "package.json"}'},
            }
        ],
    }
    assert sent[3] == {"role": "tool", "tool_call_id": "call_7", "content": '{"name": "keel"}'}


def test_reasoning_is_recorded_but_never_sent_back(
    provider: FakeProvider, make_model: MakeModel
) -> None:
    provider.reply(content="4", reasoning_content="two plus two makes four")
    provider.reply(content="8")
    model = make_model(spec="deepseek:deepseek-reasoner", model="deepseek-reasoner")

    first = model.complete(ask("2+2?"))
    assert first.reasoning == "two plus two makes four"
    assert first.content == "4"

    history = (
        Message(role="user", content="2+2?"),
        Message(role="assistant", content=first.content, tool_calls=first.tool_calls),
        Message(role="user", content="and doubled?"),
    )
    model.complete(ask(messages=history, step=1))

    resent = json.dumps(provider.requests[1])
    assert "reasoning" not in resent
    assert "two plus two" not in resent
    assert provider.requests[1]["messages"][1] == {"role": "assistant", "content": "4"}


def test_unknown_model_costs_nothing(provider: FakeProvider, make_model: MakeModel) -> None:
    provider.reply(content="hi", usage=(500, 50))
    turn = make_model(spec="openai:some-local-model", model="some-local-model").complete(ask())
    assert turn.cost == 0.0
    assert (turn.usage.input_tokens, turn.usage.output_tokens) == (500, 50)


def test_missing_usage_counts_as_zero_tokens(provider: FakeProvider, make_model: MakeModel) -> None:
    provider.reply(content="hi")
    turn = make_model().complete(ask())
    assert (turn.usage.input_tokens, turn.usage.output_tokens, turn.cost) == (0, 0, 0.0)


@pytest.mark.parametrize("usage", [(10**13, 5), (5, 10**40)])
def test_absurd_token_counts_are_refused_as_a_model_error_not_stored_as_cost(
    provider: FakeProvider, make_model: MakeModel, usage: tuple[int, int]
) -> None:
    provider.reply(content="hi", usage=usage)
    with pytest.raises(ModelError, match="refusing a usage report that cannot be right"):
        make_model().complete(ask())


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "1e999", "-3"])
def test_non_integer_or_negative_token_counts_count_as_unreported(
    provider: FakeProvider, make_model: MakeModel, literal: str
) -> None:
    body = (
        '{"choices": [{"message": {"role": "assistant", "content": "hi"}}], '
        f'"usage": {{"prompt_tokens": {literal}, "completion_tokens": {literal}}}}}'
    )
    provider.raw(200, body, headers={"Content-Type": "application/json"})
    turn = make_model().complete(ask())
    assert (turn.usage.input_tokens, turn.usage.output_tokens, turn.cost) == (0, 0, 0.0)


# --- transient failures are retried ------------------------------------------------------


def test_rate_limit_is_retried_after_the_servers_retry_after(
    provider: FakeProvider, make_model: MakeModel
) -> None:
    provider.fail(429, "Rate limit reached for gpt-4o", headers={"Retry-After": "0.05"})
    provider.reply(content="ok")
    notices: list[RetryNotice] = []

    turn = make_model().complete(ask(notices=notices))

    assert turn.content == "ok"
    assert len(provider.requests) == 2
    [notice] = notices
    assert notice.attempt == 1
    assert notice.status_code == 429
    assert "Rate limit reached for gpt-4o" in notice.error
    assert 0.05 <= notice.wait_seconds <= 1.0


def test_server_errors_until_give_up_name_the_provider_error(
    provider: FakeProvider, make_model: MakeModel
) -> None:
    for _ in range(3):
        provider.fail(500, "upstream overloaded")
    notices: list[RetryNotice] = []

    with pytest.raises(ModelError) as caught:
        make_model(max_attempts=3).complete(ask(notices=notices))

    assert caught.value.transient is True
    assert caught.value.status_code == 500
    assert "upstream overloaded" in str(caught.value)
    assert "3 attempt" in str(caught.value)
    assert len(provider.requests) == 3
    assert [n.attempt for n in notices] == [1, 2]
    assert all(n.wait_seconds > 0 for n in notices)


def test_backoff_grows_and_total_wait_stays_within_budget(
    provider: FakeProvider, make_model: MakeModel
) -> None:
    for _ in range(10):
        provider.fail(503, "try later")
    notices: list[RetryNotice] = []
    model = make_model(max_attempts=10, initial_wait=0.01, max_wait=0.1)

    started = time.monotonic()
    with pytest.raises(ModelError, match="try later"):
        model.complete(ask(notices=notices))

    waits = [n.wait_seconds for n in notices]
    assert sum(waits) <= 0.1 + 1e-6
    assert waits[2] > waits[0]  # exponential: 0.005-0.01, then 0.02-0.04
    assert len(provider.requests) < 10  # the wait budget ended it before the attempts did
    assert time.monotonic() - started < 2.0


def test_a_huge_retry_after_is_bounded_by_the_wait_budget(
    provider: FakeProvider, make_model: MakeModel
) -> None:
    provider.fail(429, "slow down", headers={"Retry-After": "3600"})
    provider.reply(content="ok")
    notices: list[RetryNotice] = []

    started = time.monotonic()
    turn = make_model(max_wait=0.05).complete(ask(notices=notices))

    assert turn.content == "ok"
    assert notices[0].wait_seconds == pytest.approx(0.05)
    assert time.monotonic() - started < 2.0


def test_hung_provider_times_out_and_is_retried(
    provider: FakeProvider, make_model: MakeModel
) -> None:
    provider.hang(5.0)
    provider.reply(content="ok")
    notices: list[RetryNotice] = []

    started = time.monotonic()
    turn = make_model(timeout=0.2).complete(ask(notices=notices))

    assert turn.content == "ok"
    assert time.monotonic() - started < 2.0
    [notice] = notices
    assert "no answer within 0.2s" in notice.error
    assert notice.status_code is None


def test_dropped_connection_is_retried(provider: FakeProvider, make_model: MakeModel) -> None:
    provider.disconnect()
    provider.reply(content="ok")
    notices: list[RetryNotice] = []

    turn = make_model().complete(ask(notices=notices))

    assert turn.content == "ok"
    assert len(provider.requests) == 2
    assert "connection failed" in notices[0].error


def test_refused_connection_gives_up_as_transient(make_model: MakeModel) -> None:
    with FakeProvider() as closed:
        dead_url = closed.base_url
    with pytest.raises(ModelError) as caught:
        make_model(base_url=dead_url, max_attempts=2).complete(ask())
    assert caught.value.transient is True
    assert "connection failed" in str(caught.value)


def test_non_json_body_from_a_failing_proxy_is_retried(
    provider: FakeProvider, make_model: MakeModel
) -> None:
    provider.raw(502, "<html><body>502 Bad Gateway</body></html>")
    provider.reply(content="ok")
    notices: list[RetryNotice] = []

    turn = make_model().complete(ask(notices=notices))

    assert turn.content == "ok"
    assert "HTTP 502" in notices[0].error
    assert "Bad Gateway" in notices[0].error


# --- refusals fail at once --------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "message"),
    [
        (400, "Invalid 'messages[1].content': expected a string"),
        (401, "Authentication Fails, Your api key: ****abcd is invalid"),
        (403, "Your account is not allowed to use this model"),
        (404, "The model `gpt-9` does not exist"),
    ],
)
def test_refusal_fails_at_once_with_the_providers_message(
    provider: FakeProvider, make_model: MakeModel, status: int, message: str
) -> None:
    provider.fail(status, message)
    provider.reply(content="never served")
    notices: list[RetryNotice] = []

    with pytest.raises(ModelError) as caught:
        make_model().complete(ask(notices=notices))

    assert message in str(caught.value)
    assert caught.value.status_code == status
    assert caught.value.transient is False
    assert len(provider.requests) == 1
    assert provider.pending == 1
    assert notices == []


def test_authentication_error_names_the_key_variable(
    provider: FakeProvider, make_model: MakeModel
) -> None:
    provider.fail(401, "Authentication Fails")
    model = make_model(spec="deepseek:deepseek-chat", api_key_variable="DEEPSEEK_API_KEY")
    with pytest.raises(ModelError, match=r"Authentication Fails.*DEEPSEEK_API_KEY"):
        model.complete(ask())


def test_an_unscripted_request_is_answered_with_a_clear_error(
    provider: FakeProvider, make_model: MakeModel
) -> None:
    with pytest.raises(ModelError, match="FakeProvider: no scripted reply left"):
        make_model(max_attempts=1).complete(ask())
