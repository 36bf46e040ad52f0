"""What a provider's failed answer means: the class, the reason and the message kept."""

from __future__ import annotations

import json
from typing import Any

import pytest

from keel.core.errors import ModelError
from keel.models.profiles import DEEPSEEK, OPENAI, OPENAI_COMPATIBLE, ProviderProfile
from keel.models.provider_errors import (
    ERROR_BODY_CHARS,
    TransientFailure,
    classify_error_object,
    classify_http_failure,
)


def classify(
    profile: ProviderProfile,
    status: int,
    body: Any,
    headers: dict[str, str] | None = None,
) -> ModelError | TransientFailure:
    return classify_http_failure(
        profile,
        status=status,
        text=body if isinstance(body, str) else json.dumps(body),
        headers=headers or {},
        spec=f"{profile.name}:m",
        base_url="https://api.example.com/v1",
        key_variable=profile.key_variable,
    )


def as_model_error(outcome: ModelError | TransientFailure) -> ModelError:
    assert isinstance(outcome, ModelError), outcome
    return outcome


# --- out of credit --------------------------------------------------------------------------


def test_deepseek_402_is_out_of_credit_and_says_to_add_credit() -> None:
    body = {
        "error": {
            "message": "Insufficient Balance",
            "type": "unknown_error",
            "param": None,
            "code": "invalid_request_error",
        }
    }
    error = as_model_error(classify(DEEPSEEK, 402, body))
    assert error.reason == "out_of_credit"
    assert error.transient is False
    assert error.status_code == 402
    assert "add credit to your DeepSeek account" in str(error)
    assert "Insufficient Balance" in str(error)


def test_openai_insufficient_quota_comes_as_429_and_is_not_a_rate_limit() -> None:
    body = {
        "error": {
            "message": "You exceeded your current quota, please check your plan and billing.",
            "type": "insufficient_quota",
            "param": None,
            "code": "insufficient_quota",
        }
    }
    error = as_model_error(classify(OPENAI, 429, body, {"retry-after": "1"}))
    assert error.reason == "out_of_credit"
    assert error.transient is False
    assert "add credit to your OpenAI account" in str(error)
    assert "You exceeded your current quota" in str(error)


def test_a_compatible_servers_402_names_its_host() -> None:
    body = {"error": {"message": "Insufficient credits", "code": 402}}
    error = as_model_error(classify(OPENAI_COMPATIBLE, 402, body))
    assert error.reason == "out_of_credit"
    assert "api.example.com" in str(error)


# --- context overflow ----------------------------------------------------------------------------


def test_openai_context_length_code_is_context_overflow() -> None:
    body = {
        "error": {
            "message": "This model's maximum context length is 128000 tokens. However, your "
            "messages resulted in 130000 tokens. Please reduce the length of the messages.",
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        }
    }
    error = as_model_error(classify(OPENAI, 400, body))
    assert error.reason == "context_overflow"
    assert "maximum context length is 128000" in str(error)


def test_deepseek_context_length_phrase_is_context_overflow() -> None:
    body = {
        "error": {
            "message": "This model's maximum context length is 131072 tokens. However, you "
            "requested 140000 tokens (140000 in the messages, 0 in the completion).",
            "type": "invalid_request_error",
            "param": None,
            "code": "invalid_request_error",
        }
    }
    assert as_model_error(classify(DEEPSEEK, 400, body)).reason == "context_overflow"


def test_an_overflow_reported_only_inside_openrouters_metadata_raw_is_found_and_kept() -> None:
    raw = json.dumps({"error": {"message": "This model's maximum context length is 8192 tokens."}})
    body = {
        "error": {
            "message": "Provider returned error",
            "code": 400,
            "metadata": {"raw": raw, "provider_name": "Fireworks"},
        }
    }
    error = as_model_error(classify(OPENAI_COMPATIBLE, 400, body))
    assert error.reason == "context_overflow"
    assert "Provider returned error" in str(error)
    assert "Fireworks" in str(error)
    assert "maximum context length is 8192" in str(error)


def test_another_400_is_a_plain_model_error_with_the_whole_body() -> None:
    body = {
        "error": {
            "message": "Invalid 'messages[3].tool_calls[0].function.arguments'",
            "type": "invalid_request_error",
            "param": "messages.[3].tool_calls",
            "code": "invalid_value",
        }
    }
    error = as_model_error(classify(OPENAI, 400, body))
    assert error.reason == "model_error"
    assert error.transient is False
    assert "messages.[3].tool_calls" in str(error)  # the param, from the body
    assert "invalid_value" in str(error)


# --- authentication and others ---------------------------------------------------------------


@pytest.mark.parametrize("status", [401, 403])
def test_authentication_failures_name_the_key_variable(status: int) -> None:
    body = {"error": {"message": "Authentication Fails (no such user)", "type": "auth"}}
    error = as_model_error(classify(DEEPSEEK, status, body))
    assert error.reason == "authentication"
    assert "check DEEPSEEK_API_KEY" in str(error)
    assert "Authentication Fails" in str(error)


def test_not_found_hints_at_the_model_name_and_base_url() -> None:
    error = as_model_error(classify(OPENAI, 404, {"error": {"message": "no such model"}}))
    assert "check the model name and the base URL https://api.example.com/v1" in str(error)


# --- transient ---------------------------------------------------------------------------


@pytest.mark.parametrize("status", [408, 409, 425, 429, 500, 502, 503, 529])
def test_overload_and_server_errors_are_transient_with_retry_after(status: int) -> None:
    outcome = classify(OPENAI, status, {"error": {"message": "busy"}}, {"retry-after": "3"})
    assert isinstance(outcome, TransientFailure)
    assert outcome.status_code == status
    assert outcome.retry_after == 3.0
    assert "busy" in outcome.message


def test_a_rate_limit_with_another_code_is_not_out_of_credit() -> None:
    body = {"error": {"message": "Rate limit reached", "type": "requests", "code": "rate_limit"}}
    assert isinstance(classify(OPENAI, 429, body), TransientFailure)


# --- the body kept -----------------------------------------------------------------------


def test_a_huge_error_body_is_kept_bounded() -> None:
    body = {"error": {"message": "bad", "metadata": {"raw": "x" * 20_000}}}
    error = as_model_error(classify(OPENAI, 422, body))
    assert len(str(error)) < ERROR_BODY_CHARS + 300
    assert str(error).endswith("…")


def test_a_non_json_body_is_kept_as_text() -> None:
    outcome = classify(OPENAI, 502, "<html><body>502 Bad Gateway</body></html>")
    assert isinstance(outcome, TransientFailure)
    assert outcome.message == "HTTP 502: <html><body>502 Bad Gateway</body></html>"


# --- error objects sent with HTTP 200 (in a stream) ---------------------------------------------


def from_stream(profile: ProviderProfile, error: dict[str, Any]) -> ModelError | TransientFailure:
    text = json.dumps({"error": error})
    return classify_error_object(
        profile, text=text, error=error, spec="x:m", base_url="https://openrouter.ai/api/v1"
    )


def test_an_upstream_failure_mid_stream_is_transient() -> None:
    outcome = from_stream(
        OPENAI_COMPATIBLE, {"code": "server_error", "message": "Provider disconnected"}
    )
    assert isinstance(outcome, TransientFailure)
    assert "Provider disconnected" in outcome.message


def test_out_of_quota_mid_stream_is_out_of_credit() -> None:
    error = as_model_error(
        from_stream(OPENAI, {"code": "insufficient_quota", "message": "You exceeded"})
    )
    assert error.reason == "out_of_credit"


def test_an_http_status_as_code_mid_stream_is_classified_by_it() -> None:
    credit = as_model_error(from_stream(OPENAI_COMPATIBLE, {"code": 402, "message": "credits"}))
    assert credit.reason == "out_of_credit"
    bad = as_model_error(from_stream(OPENAI_COMPATIBLE, {"code": 400, "message": "bad input"}))
    assert (bad.reason, bad.status_code) == ("model_error", 400)
    assert isinstance(
        from_stream(OPENAI_COMPATIBLE, {"code": 429, "message": "x"}), TransientFailure
    )
