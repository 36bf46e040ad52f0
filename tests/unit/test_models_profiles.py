"""Provider profiles: which profile serves a spec, and how each reads an answer back —
content, reasoning, tool calls, usage by kind and the finish reason."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, get_args

import pytest

from keel.core.errors import ConfigError, ModelError
from keel.models.base import FinishReason, TokenUsage, ToolCall
from keel.models.profiles import (
    DEEPSEEK,
    OPENAI,
    OPENAI_COMPATIBLE,
    PROFILES,
    RETRY,
    ProviderProfile,
    profile_for,
)
from keel.models.wire import parse_response

ALL_PROFILES = (DEEPSEEK, OPENAI, OPENAI_COMPATIBLE)


def payload(
    message: dict[str, Any] | None = None,
    *,
    finish_reason: object = "stop",
    usage: object = None,
    model: object = "served-model",
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "hi", **(message or {})},
                "finish_reason": finish_reason,
            }
        ],
    }
    if usage is not None:
        body["usage"] = usage
    if model is not None:
        body["model"] = model
    return body


def parse(profile: ProviderProfile, body: dict[str, Any], step: int = 3) -> Any:
    return parse_response(profile, body, model="asked-model", step=step)


# --- choosing a profile ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("provider", "base_url", "expected"),
    [
        ("deepseek", "https://api.deepseek.com", "deepseek"),
        ("deepseek", "https://proxy.example/v1", "deepseek"),
        ("openai", "https://api.openai.com/v1", "openai"),
        ("openai", "https://api.openai.com/v1/", "openai"),
        ("openai", "", "openai"),
        ("openai", "http://127.0.0.1:11434/v1", "openai-compatible"),
        ("openai", "https://openrouter.ai/api/v1", "openai-compatible"),
        ("openai", "https://api.openai.com.evil.example/v1", "openai-compatible"),
    ],
)
def test_a_profile_is_chosen_by_provider_and_base_url(
    provider: str, base_url: str, expected: str
) -> None:
    assert profile_for(provider, base_url).name == expected


def test_an_unknown_provider_has_no_profile() -> None:
    with pytest.raises(ConfigError, match="no provider profile for 'anthropic'"):
        profile_for("anthropic", "https://api.anthropic.com")


@pytest.mark.parametrize("profile", ALL_PROFILES, ids=lambda p: p.name)
def test_every_profile_cites_its_pages_and_maps_only_to_known_reasons(
    profile: ProviderProfile,
) -> None:
    assert profile.docs and all(url.startswith("https://") for url in profile.docs)
    allowed = set(get_args(FinishReason)) | {RETRY}
    assert set(profile.finish_reasons.values()) <= allowed
    assert all(p == p.lower() for p in profile.context_overflow_phrases)
    assert PROFILES[profile.name] is profile


def test_only_deepseek_echoes_reasoning() -> None:
    assert DEEPSEEK.echo_reasoning and DEEPSEEK.echo_field == "reasoning_content"
    assert not OPENAI.echo_reasoning
    assert not OPENAI_COMPATIBLE.echo_reasoning


def test_out_of_credit_and_overflow_signals_match_the_providers_docs() -> None:
    assert 402 in DEEPSEEK.out_of_credit_statuses
    assert "insufficient_quota" in OPENAI.out_of_credit_codes
    assert "context_length_exceeded" in OPENAI.context_overflow_codes
    deepseek_400 = (
        "This model's maximum context length is 131072 tokens. However, you requested "
        "140000 tokens (140000 in the messages, 0 in the completion). Please reduce the "
        "length of the messages or completion."
    ).lower()
    assert any(p in deepseek_400 for p in DEEPSEEK.context_overflow_phrases)
    llama_400 = "request (9412 tokens) exceeds the available context size (8192 tokens)"
    assert any(p in llama_400 for p in OPENAI_COMPATIBLE.context_overflow_phrases)
    assert not any(p in "invalid tool name" for p in OPENAI_COMPATIBLE.context_overflow_phrases)


# --- content and reasoning ---------------------------------------------------------------


def test_content_parts_are_joined_into_text() -> None:
    parts = [
        {"type": "text", "text": "Hello, "},
        {"type": "image_url"},
        {"type": "text", "text": "world"},
    ]
    parsed = parse(OPENAI_COMPATIBLE, payload({"content": parts}))
    assert parsed.content == "Hello, world"


def test_null_content_stays_none() -> None:
    assert parse(OPENAI, payload({"content": None})).content is None


@pytest.mark.parametrize(
    ("profile", "field", "expected"),
    [
        (DEEPSEEK, "reasoning_content", "think"),
        (DEEPSEEK, "reasoning", None),
        (OPENAI, "reasoning_content", None),
        (OPENAI_COMPATIBLE, "reasoning_content", "think"),
        (OPENAI_COMPATIBLE, "reasoning", "think"),
    ],
    ids=lambda v: getattr(v, "name", v),
)
def test_reasoning_is_read_from_the_profiles_fields(
    profile: ProviderProfile, field: str, expected: str | None
) -> None:
    assert parse(profile, payload({field: "think"})).reasoning == expected


def test_the_reported_model_wins_over_the_asked_one() -> None:
    assert parse(OPENAI, payload(model="gpt-5-2026-01-01")).model == "gpt-5-2026-01-01"
    assert parse(OPENAI, payload(model=None)).model == "asked-model"
    assert parse(OPENAI, payload(model=7)).model == "asked-model"


# --- tool calls ----------------------------------------------------------------------------


def test_tool_calls_keep_raw_argument_text_and_get_ids_when_missing() -> None:
    calls = [
        {
            "id": "call_a",
            "type": "function",
            "function": {"name": "read_file", "arguments": '{"p": 1'},
        },
        {"type": "function", "function": {"name": "glob", "arguments": {"pattern": "*.py"}}},
        {"id": "", "function": {"name": "ls"}},
        "junk",
    ]
    parsed = parse(
        OPENAI, payload({"content": None, "tool_calls": calls}, finish_reason="tool_calls")
    )

    assert parsed.tool_calls == (
        ToolCall(id="call_a", name="read_file", arguments='{"p": 1'),
        ToolCall(id="call_3_1", name="glob", arguments='{"pattern": "*.py"}'),
        ToolCall(id="call_3_2", name="ls", arguments=""),
    )
    assert parsed.finish_reason == "tool_calls"
    assert parsed.provider_finish_reason is None


def test_a_legacy_function_call_is_read_as_a_tool_call() -> None:
    message = {"content": None, "function_call": {"name": "glob", "arguments": "{}"}}
    parsed = parse(OPENAI, payload(message, finish_reason="function_call"), step=0)
    assert parsed.tool_calls == (ToolCall(id="call_0_0", name="glob", arguments="{}"),)
    assert parsed.finish_reason == "tool_calls"
    assert parsed.provider_finish_reason == "function_call"


# --- usage -------------------------------------------------------------------------------

DEEPSEEK_USAGE = {
    "prompt_tokens": 1000,
    "completion_tokens": 500,
    "total_tokens": 1500,
    "prompt_cache_hit_tokens": 800,
    "prompt_cache_miss_tokens": 200,
    "completion_tokens_details": {"reasoning_tokens": 320},
}
OPENAI_USAGE = {
    "prompt_tokens": 2006,
    "completion_tokens": 300,
    "total_tokens": 2306,
    "prompt_tokens_details": {"cached_tokens": 1920, "audio_tokens": 0},
    "completion_tokens_details": {"reasoning_tokens": 192, "audio_tokens": 0},
}


DEEPSEEK_READ = TokenUsage(
    input_tokens=1000, output_tokens=500, cached_input_tokens=800, reasoning_tokens=320
)
OPENAI_READ = TokenUsage(
    input_tokens=2006, output_tokens=300, cached_input_tokens=1920, reasoning_tokens=192
)


@pytest.mark.parametrize(
    ("profile", "usage", "expected"),
    [
        pytest.param(DEEPSEEK, DEEPSEEK_USAGE, DEEPSEEK_READ, id="deepseek"),
        pytest.param(DEEPSEEK, OPENAI_USAGE, OPENAI_READ, id="deepseek-fallback"),
        pytest.param(OPENAI, OPENAI_USAGE, OPENAI_READ, id="openai"),
        pytest.param(
            OPENAI,
            DEEPSEEK_USAGE,
            TokenUsage(input_tokens=1000, output_tokens=500, reasoning_tokens=320),
            id="openai-ignores-deepseek-field",
        ),
        pytest.param(OPENAI_COMPATIBLE, DEEPSEEK_USAGE, DEEPSEEK_READ, id="compat-deepseek"),
        pytest.param(OPENAI_COMPATIBLE, OPENAI_USAGE, OPENAI_READ, id="compat-openai"),
    ],
)
def test_usage_is_read_by_kind_through_the_profiles_paths(
    profile: ProviderProfile, usage: dict[str, Any], expected: TokenUsage
) -> None:
    assert parse(profile, payload(usage=usage)).usage == expected


def test_deepseek_prefers_its_own_cache_field_over_the_openai_one() -> None:
    usage = {**OPENAI_USAGE, "prompt_cache_hit_tokens": 1000}
    assert parse(DEEPSEEK, payload(usage=usage)).usage.cached_input_tokens == 1000


@pytest.mark.parametrize(
    "usage",
    [
        {"prompt_tokens": -5, "completion_tokens": True, "prompt_cache_hit_tokens": -1},
        {"prompt_tokens": "10", "completion_tokens": 2.5, "prompt_tokens_details": None},
        {"prompt_tokens_details": {"cached_tokens": "9"}, "completion_tokens_details": []},
        "not a mapping",
    ],
)
def test_unreadable_usage_counts_read_as_zero(usage: object) -> None:
    assert parse(OPENAI_COMPATIBLE, payload(usage=usage)).usage == TokenUsage(
        input_tokens=0, output_tokens=0
    )


def test_cached_and_reasoning_counts_never_exceed_their_totals() -> None:
    usage = {
        "prompt_tokens": 10,
        "completion_tokens": 4,
        "prompt_cache_hit_tokens": 50,
        "completion_tokens_details": {"reasoning_tokens": 9},
    }
    parsed = parse(DEEPSEEK, payload(usage=usage)).usage
    assert (parsed.cached_input_tokens, parsed.reasoning_tokens) == (10, 4)


def test_missing_usage_is_zero() -> None:
    assert parse(DEEPSEEK, payload()).usage == TokenUsage(input_tokens=0, output_tokens=0)


# --- finish reasons ----------------------------------------------------------------------

ISR = "insufficient_system_resource"


@pytest.mark.parametrize(
    ("profile", "word", "finish", "provider_word", "retry"),
    [
        (DEEPSEEK, "stop", "stop", None, False),
        (DEEPSEEK, "length", "length", None, False),
        (DEEPSEEK, "content_filter", "content_filter", None, False),
        (DEEPSEEK, "tool_calls", "tool_calls", None, False),
        (DEEPSEEK, ISR, "stop", ISR, True),
        (DEEPSEEK, "function_call", "stop", "function_call", False),
        (OPENAI, "stop", "stop", None, False),
        (OPENAI, "length", "length", None, False),
        (OPENAI, "content_filter", "content_filter", None, False),
        (OPENAI, "tool_calls", "tool_calls", None, False),
        (OPENAI, "function_call", "tool_calls", "function_call", False),
        (OPENAI, ISR, "stop", ISR, False),
        (OPENAI_COMPATIBLE, "eos_token", "stop", "eos_token", False),
        (OPENAI_COMPATIBLE, "stop_sequence", "stop", "stop_sequence", False),
        (OPENAI_COMPATIBLE, "error", "stop", "error", True),
        (OPENAI_COMPATIBLE, ISR, "stop", ISR, True),
        (OPENAI_COMPATIBLE, "length", "length", None, False),
        (OPENAI_COMPATIBLE, "abort_mystery", "stop", "abort_mystery", False),
    ],
    ids=lambda v: getattr(v, "name", v),
)
def test_finish_reasons_are_normalised_by_the_profile(
    profile: ProviderProfile, word: str, finish: str, provider_word: str | None, retry: bool
) -> None:
    parsed = parse(profile, payload(finish_reason=word))
    assert (parsed.finish_reason, parsed.provider_finish_reason, parsed.retry) == (
        finish,
        provider_word,
        retry,
    )


@pytest.mark.parametrize("word", [None, "", 3])
def test_a_missing_finish_reason_follows_the_tool_calls(word: object) -> None:
    with_calls = payload(
        {"tool_calls": [{"id": "c", "function": {"name": "ls"}}]}, finish_reason=word
    )
    assert parse(OPENAI, with_calls).finish_reason == "tool_calls"
    assert parse(OPENAI, payload(finish_reason=word)).finish_reason == "stop"
    assert parse(OPENAI, payload(finish_reason=word)).provider_finish_reason is None


def test_a_retry_reason_with_calls_keeps_them_but_asks_again() -> None:
    body = payload(
        {"tool_calls": [{"id": "c", "function": {"name": "ls"}}]},
        finish_reason="insufficient_system_resource",
    )
    parsed = parse(DEEPSEEK, body)
    assert parsed.retry and parsed.finish_reason == "tool_calls"


def test_an_openai_refusal_ends_the_turn_as_refused() -> None:
    body = payload({"content": None, "refusal": "I can't help with that."}, finish_reason="stop")
    parsed = parse(OPENAI, body)
    assert parsed.finish_reason == "refusal"
    assert parsed.refusal == "I can't help with that."
    assert parsed.provider_finish_reason == "stop"
    assert not parsed.retry


@pytest.mark.parametrize("refusal", [None, "", "   "])
def test_an_empty_refusal_field_is_no_refusal(refusal: object) -> None:
    parsed = parse(OPENAI, payload({"refusal": refusal}))
    assert parsed.finish_reason == "stop"
    assert parsed.refusal is None


# --- answers without a choice --------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"error": {"message": "Upstream overloaded", "code": 502}}, "Upstream overloaded"),
        ({"choices": []}, '"choices": []'),
        ({"choices": ["x"], "detail": "bad gateway"}, "bad gateway"),
    ],
)
def test_an_answer_without_choices_is_a_model_error_quoting_the_provider(
    body: dict[str, Any], words: str
) -> None:
    with pytest.raises(ModelError) as err:
        parse(OPENAI, body)
    assert "asked-model: the response has no choices: " in str(err.value)
    assert words in str(err.value)


def test_a_choice_without_a_message_is_a_model_error() -> None:
    with pytest.raises(ModelError, match="first choice has no message"):
        parse(OPENAI, {"choices": [{"index": 0, "finish_reason": "stop"}]})


# --- recorded answers ----------------------------------------------------------------------

FIXTURES = Path(__file__).parents[1] / "fixtures" / "providers"


def recorded(name: str) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(json.loads((FIXTURES / name).read_text())["body"])
    return body


def test_a_recorded_deepseek_thinking_turn_is_read_whole() -> None:
    parsed = parse(DEEPSEEK, recorded("deepseek_thinking_turn1.json"))

    assert parsed.content == "Let me load the dice rolling capability!"
    assert parsed.reasoning is not None and parsed.reasoning.startswith("The user wants")
    assert parsed.tool_calls == (
        ToolCall(
            id="call_00_sXqYgMESDht75NCLLZtt9804",
            name="load_capability",
            arguments='{"id": "DICE_ROLL"}',
        ),
    )
    assert parsed.usage == TokenUsage(
        input_tokens=563, output_tokens=116, cached_input_tokens=512, reasoning_tokens=60
    )
    assert (parsed.finish_reason, parsed.provider_finish_reason) == ("tool_calls", None)
    assert parsed.model == "deepseek-v4-flash"


@pytest.mark.parametrize(
    ("name", "finish", "usage"),
    [
        ("openai_parallel_tool_calls.json", "tool_calls", (198, 245, 0, 192)),
        ("openai_length_text.json", "length", (14, 50, 0, 0)),
        ("openai_length_empty_content.json", "length", (12, 100, 0, 100)),
        ("openai_usage_reasoning_cached.json", "stop", (3662, 529, 2816, 256)),
        ("openai_refusal.json", "refusal", (64, 13, 0, 0)),
    ],
)
def test_recorded_openai_answers_are_read_by_kind(
    name: str, finish: str, usage: tuple[int, int, int, int]
) -> None:
    parsed = parse(OPENAI, recorded(name))

    assert parsed.finish_reason == finish
    assert parsed.usage == TokenUsage(
        input_tokens=usage[0],
        output_tokens=usage[1],
        cached_input_tokens=usage[2],
        reasoning_tokens=usage[3],
    )
    assert parsed.reasoning is None
    assert not parsed.retry


def test_recorded_parallel_calls_and_refusal_keep_their_details() -> None:
    calls = parse(OPENAI, recorded("openai_parallel_tool_calls.json"))
    assert [c.name for c in calls.tool_calls] == ["get_weather", "get_population"]
    assert calls.content is None and calls.refusal is None

    refused = parse(OPENAI, recorded("openai_refusal.json"))
    assert refused.refusal == "I'm very sorry, but I can't assist with that request."
    assert refused.provider_finish_reason == "stop"
    assert refused.content is None

    cut = parse(OPENAI, recorded("openai_length_empty_content.json"))
    assert cut.content == ""


def test_recorded_overflow_and_credit_errors_match_their_profiles() -> None:
    deepseek = recorded("deepseek_error_400_context_length.json")
    message = deepseek["error"]["message"].lower()
    assert any(p in message for p in DEEPSEEK.context_overflow_phrases)
    assert deepseek["error"]["code"] not in DEEPSEEK.context_overflow_codes  # phrase only

    openai = recorded("openai_error_429_insufficient_quota.json")
    assert openai["error"]["code"] in OPENAI.out_of_credit_codes
