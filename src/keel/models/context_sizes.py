"""How many tokens a model's context holds (pure), so a run knows when to compact.

Keyed by model spec, like the price table, because a provider decides what it serves.
Each entry is the provider's published context window (input and output together),
read from the page named beside it. A model not listed gets ``DEFAULT_CONTEXT_TOKENS``,
on the small side of what current models take: compacting early costs a little
context, passing the window costs a failed request (which the loop then answers by
compacting once and asking again, ``keel.loop.context``). A run sets its own size with
``context_tokens`` (``keel run --context-tokens N``), which wins over this table.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from keel.core.errors import ConfigError

DEFAULT_CONTEXT_TOKENS = 128_000
MIN_CONTEXT_TOKENS = 1_000  # below this no request with a system prompt and tools fits
MAX_CONTEXT_TOKENS = 100_000_000

# DeepSeek V4 (flash and pro; deepseek-chat and deepseek-reasoner are served by V4):
# 1M tokens, https://api-docs.deepseek.com/quick_start/pricing (read 2026-11).
_DEEPSEEK_V4 = 1_000_000
# OpenAI, https://platform.openai.com/docs/models (read 2026-11).
_GPT_5_4 = 1_050_000
_GPT_5 = 400_000
_GPT_4_1 = 1_047_576
_O_SERIES = 200_000

BUILTIN_CONTEXT_TOKENS: Mapping[str, int] = MappingProxyType(
    {
        "deepseek:deepseek-flash": _DEEPSEEK_V4,
        "deepseek:deepseek-v4-flash": _DEEPSEEK_V4,
        "deepseek:deepseek-v4-pro": _DEEPSEEK_V4,
        "deepseek:deepseek-chat": _DEEPSEEK_V4,
        "deepseek:deepseek-reasoner": _DEEPSEEK_V4,
        "openai:gpt-5.5": _GPT_5_4,
        "openai:gpt-5.5-pro": _GPT_5_4,
        "openai:gpt-5.4": _GPT_5_4,
        "openai:gpt-5.4-pro": _GPT_5_4,
        "openai:gpt-5.4-mini": _GPT_5,
        "openai:gpt-5.4-nano": _GPT_5,
        "openai:gpt-5.2": _GPT_5,
        "openai:gpt-5.1": _GPT_5,
        "openai:gpt-5": _GPT_5,
        "openai:gpt-5-mini": _GPT_5,
        "openai:gpt-5-nano": _GPT_5,
        "openai:gpt-4.1": _GPT_4_1,
        "openai:gpt-4.1-mini": _GPT_4_1,
        "openai:gpt-4.1-nano": _GPT_4_1,
        "openai:gpt-4o": 128_000,
        "openai:gpt-4o-mini": 128_000,
        "openai:o3": _O_SERIES,
        "openai:o3-mini": _O_SERIES,
        "openai:o4-mini": _O_SERIES,
    }
)


def context_tokens_of(spec: str) -> int:
    """The context size of the model ``spec`` names; the default for one not listed
    (scripted and replayed models included: their turns were written for any size)."""
    return BUILTIN_CONTEXT_TOKENS.get(spec.strip(), DEFAULT_CONTEXT_TOKENS)


def check_context_tokens(label: str, value: object) -> None:
    """ConfigError naming ``label`` unless ``value`` is None or a whole number of tokens
    in [MIN_CONTEXT_TOKENS, MAX_CONTEXT_TOKENS]."""
    if value is None:
        return
    if (
        not isinstance(value, int)
        or isinstance(value, bool)
        or not MIN_CONTEXT_TOKENS <= value <= MAX_CONTEXT_TOKENS
    ):
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:39] + "…"
        raise ConfigError(
            f"{label} must be a whole number of tokens from {MIN_CONTEXT_TOKENS} to "
            f"{MAX_CONTEXT_TOKENS}, got {shown}"
        )


__all__ = [
    "BUILTIN_CONTEXT_TOKENS",
    "DEFAULT_CONTEXT_TOKENS",
    "MAX_CONTEXT_TOKENS",
    "MIN_CONTEXT_TOKENS",
    "check_context_tokens",
    "context_tokens_of",
]
