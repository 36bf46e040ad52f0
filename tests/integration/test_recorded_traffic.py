"""Real provider answers (tests/fixtures/providers) served over loopback to the adapter.

Each body is what DeepSeek, OpenAI, Azure OpenAI or OpenRouter actually sent (see the
fixtures' README for where each was recorded). The expected values below were read off
the recordings by hand; the adapter must turn every body into that turn, usage, finish
reason or error class.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from keel.core.errors import ModelError
from keel.models.base import (
    Message,
    ModelRequest,
    ModelTurn,
    RetryNotice,
    StreamDelta,
    TokenUsage,
    ToolCall,
)
from keel.models.connections import close_shared_clients
from keel.models.openai_compat import OpenAICompatModel
from keel.models.profiles import DEEPSEEK, OPENAI, OPENAI_COMPATIBLE, ProviderProfile
from keel.testing.provider import FakeProvider
from keel.testing.recorded import RecordedExchange, fixture_names, load_fixture

PROFILES = {"deepseek": DEEPSEEK, "openai": OPENAI}


@pytest.fixture(autouse=True)
def fresh_pool() -> Iterator[None]:
    yield
    close_shared_clients()


@pytest.fixture
def provider() -> Iterator[FakeProvider]:
    with FakeProvider() as server:
        yield server


def profile_of(exchange: RecordedExchange) -> ProviderProfile:
    """The profile Keel would use at that provider (others are OpenAI-compatible)."""
    return PROFILES.get(exchange.provider, OPENAI_COMPATIBLE)


def adapter(
    provider: FakeProvider, exchange: RecordedExchange, **overrides: Any
) -> OpenAICompatModel:
    profile = profile_of(exchange)
    model = str((exchange.request or {}).get("model") or "recorded")  # as recorded: it picks
    settings: dict[str, Any] = {  # the request rules FakeProvider checks (DeepSeek's or not)
        "spec": f"{'deepseek' if profile is DEEPSEEK else 'openai'}:{model}",
        "model": model,
        "base_url": provider.base_url,
        "api_key": "sk-test",
        "profile": profile,
        "stream": exchange.is_stream or not exchange.body.lstrip().startswith("{"),
        "max_attempts": 3,
        "max_wait": 0.5,
        "initial_wait": 0.001,
        "timeout": 2.0,
    }
    settings.update(overrides)
    return OpenAICompatModel(**settings)


def serve(provider: FakeProvider, exchange: RecordedExchange, **shape: Any) -> None:
    """Queue the recorded answer; a recording that kept no content type gets the one its
    body has (some sources stored only the body)."""
    headers = dict(exchange.headers)
    if not exchange.content_type:
        is_json = exchange.body.lstrip().startswith("{")
        headers["Content-Type"] = "application/json" if is_json else "text/event-stream"
    provider.raw(exchange.status, exchange.body, headers=headers, **shape)


def ask(
    deltas: list[StreamDelta] | None = None, notices: list[RetryNotice] | None = None
) -> ModelRequest:
    return ModelRequest(
        messages=(Message(role="user", content="go"),),
        tools=(),
        step=3,
        on_delta=deltas.append if deltas is not None else None,
        on_retry=notices.append if notices is not None else None,
    )


# --- answers ----------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Expected:
    usage: TokenUsage
    finish_reason: str
    model: str
    content: str | None = None
    content_starts: str | None = None
    reasoning_starts: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    refusal: str | None = None


def usage(inp: int, out: int, cached: int = 0, reasoning: int = 0) -> TokenUsage:
    return TokenUsage(
        input_tokens=inp, output_tokens=out, cached_input_tokens=cached, reasoning_tokens=reasoning
    )


ANSWERS = {
    "deepseek_thinking_turn1": Expected(
        usage=usage(563, 116, cached=512, reasoning=60),
        finish_reason="tool_calls",
        model="deepseek-v4-flash",
        content="Let me load the dice rolling capability!",
        reasoning_starts="The user wants to play a dice game.",
        tool_calls=(
            ToolCall(
                id="call_00_sXqYgMESDht75NCLLZtt9804",
                name="load_capability",
                arguments='{"id": "DICE_ROLL"}',
            ),
        ),
    ),
    "deepseek_thinking_turn2": Expected(
        usage=usage(875, 79, cached=0, reasoning=26),
        finish_reason="tool_calls",
        model="deepseek-v4-flash",
        content="Let me get your name and roll the die!",
        reasoning_starts="Great, now I have access to the dice roll tool.",
        tool_calls=(
            ToolCall(id="call_00_6edlnw3Z1MgeMfey687g8451", name="get_player_name", arguments="{}"),
            ToolCall(id="call_01_km02sac7sHxNDPATKLZy7705", name="roll_dice", arguments="{}"),
        ),
    ),
    "deepseek_thinking_turn3": Expected(
        usage=usage(976, 61, cached=896, reasoning=25),
        finish_reason="stop",
        model="deepseek-v4-flash",
        content_starts="🎉 **Congratulations, Anne!**",
        reasoning_starts="The player's name is Anne",
    ),
    "deepseek_stream_reasoning_tool_call": Expected(
        usage=usage(374, 61, cached=256, reasoning=17),
        finish_reason="tool_calls",
        model="deepseek-v4-flash",
        reasoning_starts="The user asks about the weather in San Francisco.",
        tool_calls=(
            ToolCall(
                id="call_00_IhCAliIHtM9gKpgfqbBV9873",
                name="weather",
                arguments='{"location": "San Francisco"}',
            ),
        ),
    ),
    "openai_parallel_tool_calls": Expected(
        usage=usage(198, 245, reasoning=192),
        finish_reason="tool_calls",
        model="gpt-5-mini-2025-08-07",
        tool_calls=(
            ToolCall(
                id="call_e7n8N6sMFfH9gMr8fu8f2rEJ",
                name="get_weather",
                arguments='{"city": "Chicago"}',
            ),
            ToolCall(
                id="call_7wdreEMf0P53pgbm59En7h6z",
                name="get_population",
                arguments='{"city": "Chicago"}',
            ),
        ),
    ),
    "openai_length_text": Expected(
        usage=usage(14, 50),
        finish_reason="length",
        model="gpt-4o-2024-08-06",
        content_starts="Here is a list of all 50 U.S. states:\n\n1. Alabama",
    ),
    "openai_length_empty_content": Expected(
        usage=usage(12, 100, reasoning=100),
        finish_reason="length",
        model="gpt-5-nano-2025-08-07",
        content="",
    ),
    "openai_refusal": Expected(
        usage=usage(64, 13),
        finish_reason="refusal",
        model="gpt-4o-2024-08-06",
        refusal="I'm very sorry, but I can't assist with that request.",
    ),
    "openai_usage_reasoning_cached": Expected(
        usage=usage(3662, 529, cached=2816, reasoning=256),
        finish_reason="stop",
        model="gpt-5-mini-2025-08-07",
        content_starts="The Force is hungry.",
    ),
    "openai_stream_length_reasoning_only": Expected(
        usage=usage(12, 100, reasoning=100),
        finish_reason="length",
        model="gpt-5-nano-2025-08-07",
    ),
    "openai_stream_tool_calls": Expected(
        usage=usage(159, 126, reasoning=64),
        finish_reason="tool_calls",
        model="gpt-5-mini-2025-08-07",
        tool_calls=(
            ToolCall(
                id="call_G3a5HKjotE2b7URiQE2jYHh7",
                name="secret_retrieval_tool",
                arguments='{"password": "mellon"}',
            ),
            ToolCall(
                id="call_8a8EnJl6GNnu1T1bjVbA4Lsa",
                name="secret_retrieval_tool",
                arguments='{"password": "radiance"}',
            ),
        ),
    ),
    # Reasoning tokens are reported as 11 of 10 completion tokens: capped at the output.
    "openrouter_stream_comments_error": Expected(
        usage=usage(43, 10, reasoning=10),
        finish_reason="length",
        model="minimax/minimax-m2:free",
        reasoning_starts="We need to respond to a greeting. The user",
    ),
}


def check(turn: ModelTurn, expected: Expected) -> None:
    assert turn.usage == expected.usage
    assert turn.finish_reason == expected.finish_reason
    assert turn.model == expected.model
    assert turn.tool_calls == expected.tool_calls
    assert turn.refusal == expected.refusal
    if expected.content_starts is not None:
        assert (turn.content or "").startswith(expected.content_starts)
    elif expected.content is not None:
        assert turn.content == expected.content
    else:
        assert not turn.content
    if expected.reasoning_starts is not None:
        assert (turn.reasoning or "").startswith(expected.reasoning_starts)
    else:
        assert turn.reasoning is None


@pytest.mark.parametrize("name", sorted(ANSWERS))
def test_a_recorded_answer_gives_the_recorded_turn(provider: FakeProvider, name: str) -> None:
    exchange = load_fixture(name)
    serve(provider, exchange)
    deltas: list[StreamDelta] = []

    turn = adapter(provider, exchange).complete(ask(deltas))

    check(turn, ANSWERS[name])
    assert len(provider.requests) == 1
    if exchange.is_stream or not exchange.body.lstrip().startswith("{"):
        streamed = "".join(d.text for d in deltas if d.kind == "reasoning")
        assert streamed == (turn.reasoning or "")


@pytest.mark.parametrize(
    "name", sorted(n for n in ANSWERS if not load_fixture(n).body.lstrip().startswith("{"))
)
def test_a_recorded_stream_cut_half_way_is_retried_whole(provider: FakeProvider, name: str) -> None:
    exchange = load_fixture(name)
    events = exchange.events()
    serve(provider, exchange, cut_after=len(events) // 2)
    serve(provider, exchange)
    deltas: list[StreamDelta] = []
    notices: list[RetryNotice] = []

    turn = adapter(provider, exchange).complete(ask(deltas, notices))

    check(turn, ANSWERS[name])
    assert len(provider.requests) == 2
    assert [n.attempt for n in notices] == [1]
    second = "".join(d.text for d in deltas if d.attempt == 2 and d.kind == "tool_call")
    assert second == "".join(c.arguments for c in turn.tool_calls)


def test_deepseek_accepted_the_reasoning_keel_sends_back(provider: FakeProvider) -> None:
    """Turn 2's recorded request is one DeepSeek answered: the assistant message Keel
    builds from turn 1 must be the one in it, reasoning_content included."""
    first, second = load_fixture("deepseek_thinking_turn1"), load_fixture("deepseek_thinking_turn2")
    serve(provider, first)
    serve(provider, second)
    model = adapter(provider, first)
    turn = model.complete(ask())

    history = (
        Message(role="user", content="My guess is 4"),
        Message(
            role="assistant",
            content=turn.content,
            tool_calls=turn.tool_calls,
            reasoning=turn.reasoning,
        ),
        Message(role="tool", tool_call_id=turn.tool_calls[0].id, content="{}"),
    )
    model.complete(ModelRequest(messages=history, tools=(), step=1))

    assert second.request is not None
    accepted = second.request["messages"][3]
    assert provider.requests[1]["messages"][1] == accepted
    assert provider.requests[1]["messages"][2] == second.request["messages"][4]


# --- errors ------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Failure:
    reason: str
    status: int
    says: tuple[str, ...]


FAILURES = {
    "deepseek_error_402": Failure(
        reason="out_of_credit",
        status=402,
        says=("add credit to your DeepSeek account", "Insufficient Balance"),
    ),
    "deepseek_error_400_context_length": Failure(
        reason="context_overflow", status=400, says=("maximum context length is 131072",)
    ),
    "openai_error_400_context_length": Failure(
        reason="context_overflow", status=400, says=("resulted in 150008 tokens",)
    ),
    "openai_error_401_invalid_api_key": Failure(
        reason="authentication",
        status=401,
        says=("Incorrect API key provided", "check OPENAI_API_KEY", "invalid_api_key"),
    ),
    "openai_error_429_insufficient_quota": Failure(
        reason="out_of_credit",
        status=429,
        says=("add credit to your OpenAI account", "You exceeded your current quota"),
    ),
    "openrouter_error_400_metadata_raw": Failure(
        reason="model_error",
        status=400,
        says=("Provider returned error", "must contain the word 'json'", "OpenAI"),
    ),
    "azure_error_400_content_filter": Failure(
        reason="provider_refused:content_filter",
        status=400,
        says=("content management policy", "ResponsibleAIPolicyViolation", '"self_harm"'),
    ),
}


@pytest.mark.parametrize("name", sorted(FAILURES))
def test_a_recorded_error_is_classified_and_never_retried(
    provider: FakeProvider, name: str
) -> None:
    exchange = load_fixture(name)
    serve(provider, exchange)
    provider.reply(content="never served")
    expected = FAILURES[name]

    with pytest.raises(ModelError) as caught:
        adapter(provider, exchange).complete(ask())

    assert caught.value.reason == expected.reason
    assert caught.value.status_code == expected.status
    assert caught.value.transient is False
    for words in expected.says:
        assert words in str(caught.value)
    assert len(provider.requests) == 1


def test_every_recorded_exchange_has_an_expectation() -> None:
    """A fixture added without saying what it must give would test nothing."""
    assert set(fixture_names()) <= set(ANSWERS) | set(FAILURES)
