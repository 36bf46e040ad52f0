"""The OpenAI-compatible adapter against a real chat-completions server on 127.0.0.1.

Every test runs twice: with streamed answers (the default) and with plain JSON ones
(``KEEL_MODEL_STREAM=0``); the turn returned must not depend on which.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from keel.core.errors import ModelError
from keel.models.base import Message, ModelRequest, RetryNotice, ToolCall, ToolSpec
from keel.models.connections import close_shared_clients
from keel.models.openai_compat import OpenAICompatModel
from keel.models.profiles import OPENAI
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


@pytest.fixture(autouse=True)
def fresh_pool() -> Iterator[None]:
    """Each test's adapters start from no pooled connection and leave none behind."""
    close_shared_clients()
    yield
    close_shared_clients()


@pytest.fixture
def provider() -> Iterator[FakeProvider]:
    with FakeProvider() as server:
        yield server


MakeModel = Callable[..., OpenAICompatModel]


@pytest.fixture(params=[True, False], ids=["stream", "json"])
def streaming(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


@pytest.fixture
def make_model(provider: FakeProvider, streaming: bool) -> MakeModel:
    """An adapter pointed at the fake provider, with millisecond backoff and timeouts."""

    def make(**overrides: Any) -> OpenAICompatModel:
        settings: dict[str, Any] = {
            "spec": "openai:gpt-4o",
            "model": "gpt-4o",
            "base_url": provider.base_url,
            "api_key": "sk-test",
            "stream": streaming,
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


def test_reasoning_is_recorded_and_not_sent_back_after_a_turn_without_tool_calls(
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
        Message(role="assistant", content=first.content, reasoning=first.reasoning),
        Message(role="user", content="and doubled?"),
    )
    model.complete(ask(messages=history, step=1))

    resent = json.dumps(provider.requests[1])
    assert "reasoning" not in resent
    assert "two plus two" not in resent
    assert provider.requests[1]["messages"][1] == {"role": "assistant", "content": "4"}


def test_deepseek_gets_the_reasoning_of_a_tool_calling_turn_back(
    provider: FakeProvider, make_model: MakeModel
) -> None:
    provider.reply(tool_calls=[("read_file", {"path": "a"})], reasoning_content="read a first")
    provider.reply(content="done")
    model = make_model(spec="deepseek:deepseek-reasoner", model="deepseek-reasoner")

    first = model.complete(ask("go"))
    history = (
        Message(role="user", content="go"),
        Message(role="assistant", tool_calls=first.tool_calls, reasoning=first.reasoning),
        Message(role="tool", tool_call_id=first.tool_calls[0].id, content="A"),
    )
    model.complete(ask(messages=history, step=1))

    assert provider.requests[1]["messages"][1]["reasoning_content"] == "read a first"
    assert provider.violations == []


def test_openai_never_gets_reasoning_back(provider: FakeProvider, make_model: MakeModel) -> None:
    provider.reply(content="done")
    call = ToolCall(id="c1", name="read_file", arguments='{"path": "a"}')
    history = (
        Message(role="user", content="go"),
        Message(role="assistant", tool_calls=(call,), reasoning="private thoughts"),
        Message(role="tool", tool_call_id="c1", content="A"),
    )
    make_model().complete(ask(messages=history, step=1))
    assert "private thoughts" not in json.dumps(provider.requests[0])


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
    """Hand-written body: no recorded 429 rate limit kept its Retry-After header
    (tests/fixtures/providers/README.md)."""
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


# --- what is asked for, and how the answer is read ------------------------------------------


def test_the_request_asks_for_a_stream_with_usage_only_when_streaming(
    provider: FakeProvider, make_model: MakeModel, streaming: bool
) -> None:
    provider.reply(content="done", usage=(5, 1))
    turn = make_model().complete(ask())

    body = provider.requests[0]
    assert body["stream"] is streaming
    if streaming:
        assert body["stream_options"] == {"include_usage": True}
    else:
        assert "stream_options" not in body
    assert (turn.content, turn.usage.input_tokens, turn.usage.output_tokens) == ("done", 5, 1)


def test_a_plain_json_answer_to_a_stream_request_is_read_as_json(
    provider: FakeProvider, make_model: MakeModel
) -> None:
    body = {
        "id": "x",
        "model": "local-model",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "plain"}}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1},
    }
    provider.raw(200, json.dumps(body), headers={"Content-Type": "application/json"})
    turn = make_model().complete(ask())
    assert (turn.content, turn.model, turn.usage.input_tokens) == ("plain", "local-model", 3)


def test_deepseek_cache_hits_and_reasoning_tokens_are_counted_and_priced(
    provider: FakeProvider, make_model: MakeModel
) -> None:
    usage = {
        "prompt_tokens": 1_000_000,
        "completion_tokens": 200_000,
        "total_tokens": 1_200_000,
        "prompt_cache_hit_tokens": 800_000,
        "prompt_cache_miss_tokens": 200_000,
        "completion_tokens_details": {"reasoning_tokens": 150_000},
    }
    provider.reply(content="ok", usage=usage)
    model = make_model(spec="deepseek:deepseek-chat", model="deepseek-chat")
    turn = model.complete(ask())

    assert turn.usage.to_dict() == {
        "input_tokens": 1_000_000,
        "output_tokens": 200_000,
        "cached_input_tokens": 800_000,
        "reasoning_tokens": 150_000,
    }
    price = model.prices.price_of("deepseek:deepseek-chat")
    assert price is not None and price.cached_input_per_mtok is not None
    assert price.cached_input_per_mtok < price.input_per_mtok
    expected = (
        0.2 * price.input_per_mtok + 0.8 * price.cached_input_per_mtok + 0.2 * price.output_per_mtok
    )
    assert turn.cost == pytest.approx(expected)
    assert model.priced is True


def test_openai_cached_tokens_are_read_from_prompt_token_details(
    provider: FakeProvider, make_model: MakeModel
) -> None:
    usage = {
        "prompt_tokens": 2000,
        "completion_tokens": 300,
        "prompt_tokens_details": {"cached_tokens": 1536},
        "completion_tokens_details": {"reasoning_tokens": 64},
    }
    provider.reply(content="ok", usage=usage)
    turn = make_model().complete(ask())
    assert (turn.usage.cached_input_tokens, turn.usage.reasoning_tokens) == (1536, 64)


def test_a_model_without_a_price_says_so(make_model: MakeModel) -> None:
    assert make_model(spec="openai:my-local", model="my-local").priced is False


@pytest.mark.parametrize(
    ("provider_word", "finish", "recorded"),
    [
        ("length", "length", None),
        ("content_filter", "content_filter", None),
        ("eos", "stop", "eos"),
    ],
)
def test_the_finish_reason_is_normalised_and_an_unknown_one_kept(
    provider: FakeProvider,
    make_model: MakeModel,
    provider_word: str,
    finish: str,
    recorded: str | None,
) -> None:
    provider.reply(content="partial", finish_reason=provider_word)
    turn = make_model().complete(ask())
    assert (turn.finish_reason, turn.provider_finish_reason) == (finish, recorded)


def test_a_refusal_is_returned_as_such(provider: FakeProvider, make_model: MakeModel) -> None:
    provider.reply(refusal="I can't help with that.")
    turn = make_model().complete(ask())
    assert (turn.finish_reason, turn.refusal) == ("refusal", "I can't help with that.")


def test_deepseek_out_of_resources_finish_is_asked_again(
    provider: FakeProvider, make_model: MakeModel
) -> None:
    provider.reply(content="half", finish_reason="insufficient_system_resource")
    provider.reply(content="whole")
    notices: list[RetryNotice] = []
    model = make_model(spec="deepseek:deepseek-chat", model="deepseek-chat")

    turn = model.complete(ask(notices=notices))

    assert turn.content == "whole"
    assert len(provider.requests) == 2
    assert "insufficient_system_resource" in notices[0].error


# --- errors, classified by the provider's profile -------------------------------------------


def test_deepseek_out_of_balance_is_not_retried_and_says_to_add_credit(
    provider: FakeProvider, make_model: MakeModel
) -> None:
    provider.fail(402, "Insufficient Balance")
    model = make_model(spec="deepseek:deepseek-chat", model="deepseek-chat")
    with pytest.raises(ModelError) as caught:
        model.complete(ask())
    assert caught.value.reason == "out_of_credit"
    assert caught.value.transient is False
    assert "add credit to your DeepSeek account" in str(caught.value)
    assert len(provider.requests) == 1


def test_openai_insufficient_quota_429_is_not_retried(
    provider: FakeProvider, make_model: MakeModel
) -> None:
    body = {
        "error": {
            "message": "You exceeded your current quota, please check your plan and billing "
            "details.",
            "type": "insufficient_quota",
            "param": None,
            "code": "insufficient_quota",
        }
    }
    provider.raw(429, json.dumps(body), headers={"Content-Type": "application/json"})
    provider.reply(content="never served")
    notices: list[RetryNotice] = []

    with pytest.raises(ModelError) as caught:
        make_model(profile=OPENAI).complete(ask(notices=notices))  # as at api.openai.com

    assert caught.value.reason == "out_of_credit"
    assert "add credit to your OpenAI account" in str(caught.value)
    assert len(provider.requests) == 1
    assert notices == []


def test_an_over_long_conversation_is_a_context_overflow(
    provider: FakeProvider, make_model: MakeModel
) -> None:
    body = {
        "error": {
            "message": "This model's maximum context length is 128000 tokens. However, your "
            "messages resulted in 129001 tokens.",
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        }
    }
    provider.raw(400, json.dumps(body), headers={"Content-Type": "application/json"})
    with pytest.raises(ModelError) as caught:
        make_model().complete(ask())
    assert caught.value.reason == "context_overflow"
    assert caught.value.status_code == 400
    assert len(provider.requests) == 1


def test_a_failed_key_is_an_authentication_error(
    provider: FakeProvider, make_model: MakeModel
) -> None:
    provider.fail(401, "Incorrect API key provided: sk-test.")
    with pytest.raises(ModelError) as caught:
        make_model().complete(ask())
    assert caught.value.reason == "authentication"
    assert "check OPENAI_API_KEY" in str(caught.value)


def test_nested_upstream_details_are_kept_in_the_message(
    provider: FakeProvider, make_model: MakeModel
) -> None:
    raw = '{"error":{"message":"tool_choice is not supported by this endpoint"}}'
    body = {
        "error": {
            "message": "Provider returned error",
            "code": 422,
            "metadata": {"raw": raw, "provider_name": "Lambda"},
        }
    }
    provider.raw(422, json.dumps(body), headers={"Content-Type": "application/json"})
    with pytest.raises(ModelError) as caught:
        make_model(spec="openai:meta/llama", model="meta/llama").complete(ask())
    message = str(caught.value)
    assert "Provider returned error" in message
    assert "tool_choice is not supported by this endpoint" in message
    assert "Lambda" in message


def test_an_error_body_with_http_200_is_classified_like_one(
    provider: FakeProvider, make_model: MakeModel
) -> None:
    body = {"error": {"message": "Upstream timed out", "code": 502}}
    provider.raw(200, json.dumps(body), headers={"Content-Type": "application/json"})
    provider.reply(content="ok")
    notices: list[RetryNotice] = []
    turn = make_model().complete(ask(notices=notices))
    assert turn.content == "ok"
    assert "Upstream timed out" in notices[0].error
