"""Provider profiles: each provider's chat-completions quirks in one table.

Every difference between providers that Keel acts on lives in a `ProviderProfile`, so
the wire format (`keel.models.wire`) and the transport read one table instead of
branching on names. The quirks and where they come from:

DeepSeek (https://api-docs.deepseek.com):
- thinking mode (on by default) returns the reasoning in ``message.reasoning_content``;
  between two user messages, an assistant turn that made tool calls must have its
  ``reasoning_content`` passed back in every later request, else HTTP 400 ("The
  `reasoning_content` in the thinking mode must be passed back to the API"). Turns
  without tool calls need not carry it (it is ignored), so it is sent only on assistant
  messages with tool calls — ``""`` when none was recorded, which DeepSeek accepts
  (https://api-docs.deepseek.com/guides/thinking_mode).
- usage reports cache hits as ``prompt_cache_hit_tokens``
  (https://api-docs.deepseek.com/guides/kv_cache); ``prompt_tokens_details.cached_tokens``
  is read when that is absent.
- ``finish_reason`` may be ``insufficient_system_resource``: the request was interrupted
  for lack of inference resources, so it is asked again
  (https://api-docs.deepseek.com/api/create-chat-completion).
- HTTP 402 is "Insufficient Balance" (https://api-docs.deepseek.com/quick_start/error_codes);
  an over-long prompt is HTTP 400 "This model's maximum context length is 131072 tokens.
  However, you requested … tokens …".

OpenAI (https://platform.openai.com/docs/api-reference/chat):
- chat completions never return reasoning text, and nothing is sent back.
- usage: ``prompt_tokens_details.cached_tokens`` and
  ``completion_tokens_details.reasoning_tokens``
  (https://platform.openai.com/docs/guides/prompt-caching).
- ``finish_reason``: stop, length, tool_calls, content_filter and the deprecated
  function_call; a refusal comes as ``message.refusal``.
- out of credit is HTTP 429 with ``error.code``/``error.type`` ``insufficient_quota`` (newer
  bodies: type ``insufficient_quota``, code ``credit_balance_exhausted``); an
  over-long prompt is HTTP 400 with code ``context_length_exceeded``
  (https://platform.openai.com/docs/guides/error-codes).

OpenAI-compatible servers (vLLM, Ollama, LM Studio, llama.cpp, OpenRouter …): the union
of the fields above is read, nothing unknown is ever sent (strict servers answer 400 to
a field they do not know), and the finish-reason table is lenient: OpenRouter's
``error`` (a generation that failed mid-way, https://openrouter.ai/docs/api-reference/errors)
is asked again; text-generation-inference's ``eos_token`` and ``stop_sequence`` are
stops. llama.cpp names an over-long prompt ``exceed_context_size_error`` ("… exceeds the
available context size …"); OpenRouter answers 402 when credits run out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any
from urllib.parse import urlsplit

from keel.core.errors import ConfigError

RETRY = "retry"
"""The `ProviderProfile.finish_reasons` value meaning "transient: ask again"."""

OPENAI_DEFAULT_BASE_URL = "https://api.openai.com/v1"
DEEPSEEK_DEFAULT_BASE_URL = "https://api.deepseek.com"


@dataclass(frozen=True, kw_only=True)
class ProviderProfile:
    """One provider's quirks, read by the wire format and the transport.

    `finish_reasons` maps the provider's word to a `keel.models.base.FinishReason` or to
    ``"retry"``; a word not in it is recorded and treated as ``stop``. Paths in
    `cached_tokens_paths` and `reasoning_tokens_paths` lead into the response's
    ``usage`` object and are tried in order. `context_overflow_phrases` are lower-case
    substrings of a 400 error message. `refusal_codes` are error codes of a 400 that
    refuses the prompt itself (Azure OpenAI's content filter): the run fails
    ``provider_refused:content_filter``, never retried. `docs` lists the pages the
    quirks come from.
    """

    name: str
    key_variable: str
    base_url_variable: str
    default_base_url: str
    reasoning_fields: tuple[str, ...]
    echo_reasoning: bool
    echo_field: str
    cached_tokens_paths: tuple[tuple[str, ...], ...]
    reasoning_tokens_paths: tuple[tuple[str, ...], ...]
    stream_options: Mapping[str, Any] | None
    finish_reasons: Mapping[str, str]
    out_of_credit_statuses: frozenset[int]
    out_of_credit_codes: frozenset[str]
    context_overflow_codes: frozenset[str]
    context_overflow_phrases: tuple[str, ...]
    refusal_codes: frozenset[str]
    docs: tuple[str, ...]


_INCLUDE_USAGE: Mapping[str, Any] = MappingProxyType({"include_usage": True})
_OPENAI_CACHED = ("prompt_tokens_details", "cached_tokens")
_DEEPSEEK_CACHED = ("prompt_cache_hit_tokens",)
_REASONING_TOKENS = ("completion_tokens_details", "reasoning_tokens")
_STANDARD_FINISH = {  # the chat-completions words every profile knows
    "stop": "stop",
    "tool_calls": "tool_calls",
    "length": "length",
    "content_filter": "content_filter",
}

DEEPSEEK = ProviderProfile(
    name="deepseek",
    key_variable="DEEPSEEK_API_KEY",
    base_url_variable="DEEPSEEK_BASE_URL",
    default_base_url=DEEPSEEK_DEFAULT_BASE_URL,
    reasoning_fields=("reasoning_content",),
    echo_reasoning=True,
    echo_field="reasoning_content",
    cached_tokens_paths=(_DEEPSEEK_CACHED, _OPENAI_CACHED),
    reasoning_tokens_paths=(_REASONING_TOKENS,),
    stream_options=_INCLUDE_USAGE,
    finish_reasons=MappingProxyType({**_STANDARD_FINISH, "insufficient_system_resource": RETRY}),
    out_of_credit_statuses=frozenset({402}),
    out_of_credit_codes=frozenset(),
    context_overflow_codes=frozenset(),
    context_overflow_phrases=("maximum context length",),
    refusal_codes=frozenset(),
    docs=(
        "https://api-docs.deepseek.com/guides/thinking_mode",
        "https://api-docs.deepseek.com/guides/kv_cache",
        "https://api-docs.deepseek.com/api/create-chat-completion",
        "https://api-docs.deepseek.com/quick_start/error_codes",
    ),
)

OPENAI = ProviderProfile(
    name="openai",
    key_variable="OPENAI_API_KEY",
    base_url_variable="OPENAI_BASE_URL",
    default_base_url=OPENAI_DEFAULT_BASE_URL,
    reasoning_fields=(),
    echo_reasoning=False,
    echo_field="reasoning_content",
    cached_tokens_paths=(_OPENAI_CACHED,),
    reasoning_tokens_paths=(_REASONING_TOKENS,),
    stream_options=_INCLUDE_USAGE,
    finish_reasons=MappingProxyType({**_STANDARD_FINISH, "function_call": "tool_calls"}),
    out_of_credit_statuses=frozenset(),
    out_of_credit_codes=frozenset({"insufficient_quota", "credit_balance_exhausted"}),
    context_overflow_codes=frozenset({"context_length_exceeded"}),
    context_overflow_phrases=("maximum context length",),
    refusal_codes=frozenset({"content_filter"}),
    docs=(
        "https://platform.openai.com/docs/api-reference/chat/object",
        "https://platform.openai.com/docs/guides/prompt-caching",
        "https://platform.openai.com/docs/guides/error-codes",
    ),
)

OPENAI_COMPATIBLE = ProviderProfile(
    name="openai-compatible",
    key_variable="OPENAI_API_KEY",
    base_url_variable="OPENAI_BASE_URL",
    default_base_url=OPENAI_DEFAULT_BASE_URL,
    reasoning_fields=("reasoning_content", "reasoning"),
    echo_reasoning=False,
    echo_field="reasoning_content",
    cached_tokens_paths=(_OPENAI_CACHED, _DEEPSEEK_CACHED),
    reasoning_tokens_paths=(_REASONING_TOKENS,),
    stream_options=_INCLUDE_USAGE,
    finish_reasons=MappingProxyType(
        {
            **_STANDARD_FINISH,
            "function_call": "tool_calls",
            "insufficient_system_resource": RETRY,
            "error": RETRY,
            "eos_token": "stop",
            "stop_sequence": "stop",
        }
    ),
    out_of_credit_statuses=frozenset({402}),
    out_of_credit_codes=frozenset({"insufficient_quota", "credit_balance_exhausted"}),
    context_overflow_codes=frozenset({"context_length_exceeded", "exceed_context_size_error"}),
    context_overflow_phrases=(
        "maximum context length",
        "exceeds the available context size",
    ),
    refusal_codes=frozenset({"content_filter"}),  # Azure OpenAI's prompt filter
    docs=(
        "https://platform.openai.com/docs/api-reference/chat/object",
        "https://api-docs.deepseek.com/api/create-chat-completion",
        "https://openrouter.ai/docs/api-reference/errors",
        "https://docs.vllm.ai/en/latest/serving/openai_compatible_server.html",
        "https://github.com/ggml-org/llama.cpp/tree/master/tools/server",
    ),
)

PROFILES: Mapping[str, ProviderProfile] = MappingProxyType(
    {p.name: p for p in (DEEPSEEK, OPENAI, OPENAI_COMPATIBLE)}
)

_OPENAI_HOST = "api.openai.com"


def profile_for(provider: str, base_url: str) -> ProviderProfile:
    """The profile for a spec's `provider` served at `base_url`.

    ``deepseek`` is DeepSeek wherever it is served; ``openai`` is OpenAI only at
    api.openai.com (an empty `base_url` means the default) and the lenient
    OpenAI-compatible profile anywhere else, because a local server must never be sent
    a field only OpenAI accepts. Any other provider is a `ConfigError`.
    """
    if provider == "deepseek":
        return DEEPSEEK
    if provider == "openai":
        host = urlsplit(base_url.strip() or OPENAI_DEFAULT_BASE_URL).hostname
        return OPENAI if host == _OPENAI_HOST else OPENAI_COMPATIBLE
    raise ConfigError(
        f"no provider profile for {provider!r}: expected deepseek or openai "
        "(any OpenAI-compatible server is openai with OPENAI_BASE_URL)"
    )


__all__ = [
    "DEEPSEEK",
    "OPENAI",
    "OPENAI_COMPATIBLE",
    "PROFILES",
    "RETRY",
    "ProviderProfile",
    "profile_for",
]
