"""Model prices in USD per million tokens, and the user's additions from config.

The built-in table is keyed by model spec (``deepseek:deepseek-chat``), because the same
model name can be served at another price by another provider; every entry names the
page it was read from and when. Input tokens served from the provider's prompt cache
are billed at the cache-hit price (`Price.cached_input_per_mtok`). Where a provider
publishes peak and off-peak prices the PEAK price is listed, and OpenAI's standard tier
(not Batch or Flex): a cost budget must be an upper bound, never an optimistic guess.

Users add or override entries in ``.keel/config.toml``::

    [prices."openai:my-model"]
    input_per_mtok = 0.5
    output_per_mtok = 1.5
    cached_input_per_mtok = 0.05   # optional; the input price when absent

A model without a price costs 0: cost budgets then only bound what is known (and the
CLI refuses ``--max-cost`` for such a model). A price is a finite number, 0 or more (a
local model may be free); ``nan`` and ``inf``, which TOML can spell, are refused.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from keel.core.errors import ConfigError
from keel.models.base import TokenUsage

CONFIG_RELATIVE_PATH = Path(".keel") / "config.toml"


@dataclass(frozen=True, kw_only=True)
class Price:
    """USD per million input, cache-hit input and output tokens; where the price is from.

    `cached_input_per_mtok` None means cache hits cost the input price. `source` is the
    page (or config file) the price was read from, `as_of` the date it was read. A model
    that bills a whole request at higher rates once its prompt passes a size has
    `long_context_above` (input tokens) and those rates in `long_context`.
    """

    input_per_mtok: float
    output_per_mtok: float
    cached_input_per_mtok: float | None = None
    source: str | None = None
    as_of: str | None = None
    long_context_above: int | None = None
    long_context: Price | None = None

    def cost(self, usage: TokenUsage) -> float:
        """USD for `usage`: uncached input, cached input and output at their own prices.

        The cached count is taken as at most the input count (and at least 0), so an
        inconsistent report can never make a cost negative.
        """
        if (
            self.long_context is not None
            and self.long_context_above is not None
            and usage.input_tokens > self.long_context_above
        ):
            return self.long_context.cost(usage)
        cached = min(max(usage.cached_input_tokens, 0), usage.input_tokens)
        cached_price = (
            self.cached_input_per_mtok
            if self.cached_input_per_mtok is not None
            else self.input_per_mtok
        )
        return (
            (usage.input_tokens - cached) * self.input_per_mtok
            + cached * cached_price
            + usage.output_tokens * self.output_per_mtok
        ) / 1_000_000


# DeepSeek (https://api-docs.deepseek.com/quick_start/pricing, read 2026-11-15; prices in
# force since 2026-08-16). Peak hours are 01:00-04:00 and 06:00-10:00 UTC on weekdays;
# every other hour costs half. The PEAK price is listed, so a budget is an upper bound.
# deepseek-v4-flash is a legacy id served by the flash model at its price;
# deepseek-chat and deepseek-reasoner, retired aliases of the flash model (without and
# with thinking), keep its price for configurations that still name them.
_DEEPSEEK_PAGE = "https://api-docs.deepseek.com/quick_start/pricing"
_DEEPSEEK_AS_OF = "2026-11-15"


def _deepseek(*, miss: float, hit: float, output: float) -> Price:
    return Price(
        input_per_mtok=miss,
        cached_input_per_mtok=hit,
        output_per_mtok=output,
        source=_DEEPSEEK_PAGE,
        as_of=_DEEPSEEK_AS_OF,
    )


_DEEPSEEK_FLASH = _deepseek(miss=0.30, hit=0.006, output=1.20)
_DEEPSEEK_PRO = _deepseek(miss=1.32, hit=0.044, output=3.96)

# OpenAI (https://developers.openai.com/api/docs/pricing and the per-model pages, read
# 2026-11): standard tier, never Batch or Flex. Upper bounds where billing has more to it
# than three numbers:
# - GPT-5.4 and later bill a whole request whose prompt passes 272K tokens (200K for
#   gpt-5.6-luna) at twice the input and cache rates and 1.5 times the output rate;
# - GPT-5.6 and later bill prompt-cache writes at 1.25 times the input price, and usage
#   does not say which uncached tokens were written, so uncached input is priced as a
#   write;
# - gpt-5.6 (gpt-5.6-sol) is listed at its list price, not its promotional one;
# - a model without a published cache-hit price (the -pro models) bills hits as input.
_OPENAI_PAGE = "https://developers.openai.com/api/docs/pricing"
_OPENAI_AS_OF = "2026-11"
_LONG_PROMPT = 272_000


def _openai(
    input_price: float,
    cached: float | None,
    output: float,
    *,
    cache_write: float | None = None,
    long_above: int | None = None,
) -> Price:
    uncached = cache_write if cache_write is not None else input_price
    long_context = None
    if long_above is not None:
        long_context = Price(
            input_per_mtok=2 * uncached,
            cached_input_per_mtok=None if cached is None else 2 * cached,
            output_per_mtok=1.5 * output,
            source=_OPENAI_PAGE,
            as_of=_OPENAI_AS_OF,
        )
    return Price(
        input_per_mtok=uncached,
        cached_input_per_mtok=cached,
        output_per_mtok=output,
        source=_OPENAI_PAGE,
        as_of=_OPENAI_AS_OF,
        long_context_above=long_above,
        long_context=long_context,
    )


_GPT_5_6_SOL = _openai(5.00, 0.50, 30.00, cache_write=6.25, long_above=_LONG_PROMPT)

BUILTIN_PRICES: Mapping[str, Price] = MappingProxyType(
    {
        "deepseek:deepseek-flash": _DEEPSEEK_FLASH,
        "deepseek:deepseek-v4-flash": _DEEPSEEK_FLASH,
        "deepseek:deepseek-chat": _DEEPSEEK_FLASH,
        "deepseek:deepseek-reasoner": _DEEPSEEK_FLASH,
        "deepseek:deepseek-v4-pro": _DEEPSEEK_PRO,
        "openai:gpt-6.2-astra": _openai(
            8.00, 0.40, 40.00, cache_write=10.00, long_above=_LONG_PROMPT
        ),
        "openai:gpt-6.2-sol": _openai(2.00, 0.10, 10.00, cache_write=2.50, long_above=_LONG_PROMPT),
        "openai:gpt-6-luna": _openai(0.10, 0.01, 0.50, cache_write=0.125, long_above=_LONG_PROMPT),
        "openai:gpt-5.6": _GPT_5_6_SOL,
        "openai:gpt-5.6-sol": _GPT_5_6_SOL,
        "openai:gpt-5.6-terra": _openai(
            2.00, 0.20, 12.00, cache_write=2.50, long_above=_LONG_PROMPT
        ),
        "openai:gpt-5.6-luna": _openai(0.20, 0.02, 1.20, cache_write=0.25, long_above=200_000),
        "openai:gpt-5.5": _openai(5.00, 0.50, 30.00, long_above=_LONG_PROMPT),
        "openai:gpt-5.5-pro": _openai(30.00, None, 180.00, long_above=_LONG_PROMPT),
        "openai:gpt-5.4": _openai(2.50, 0.25, 15.00, long_above=_LONG_PROMPT),
        "openai:gpt-5.4-mini": _openai(0.75, 0.075, 4.50),
        "openai:gpt-5.4-nano": _openai(0.20, 0.02, 1.25),
        "openai:gpt-5.4-pro": _openai(30.00, None, 180.00, long_above=_LONG_PROMPT),
        "openai:gpt-5.2": _openai(1.75, 0.175, 14.00),
        "openai:gpt-5.1": _openai(1.25, 0.125, 10.00),
        "openai:gpt-5": _openai(1.25, 0.125, 10.00),
        "openai:gpt-5-mini": _openai(0.25, 0.025, 2.00),
        "openai:gpt-5-nano": _openai(0.05, 0.005, 0.40),
        "openai:gpt-4.1": _openai(2.00, 0.50, 8.00),
        "openai:gpt-4.1-mini": _openai(0.40, 0.10, 1.60),
        "openai:gpt-4.1-nano": _openai(0.10, 0.025, 0.40),
        "openai:gpt-4o": _openai(2.50, 1.25, 10.00),
        "openai:gpt-4o-mini": _openai(0.15, 0.075, 0.60),
        "openai:o3": _openai(2.00, 0.50, 8.00),
        "openai:o3-mini": _openai(1.10, 0.55, 4.40),
        "openai:o4-mini": _openai(1.10, 0.275, 4.40),
    }
)


@dataclass(frozen=True, kw_only=True)
class PriceTable:
    """Prices by model spec; `price_of` an unknown spec is None and its `cost` 0."""

    prices: Mapping[str, Price] = field(default_factory=lambda: BUILTIN_PRICES)

    def price_of(self, spec: str) -> Price | None:
        return self.prices.get(spec)

    def cost(self, spec: str, usage: TokenUsage) -> float:
        price = self.prices.get(spec)
        return price.cost(usage) if price is not None else 0.0


def load_price_table(cwd: Path) -> PriceTable:
    """The built-in prices overlaid with ``[prices."SPEC"]`` tables from the workspace's
    ``.keel/config.toml`` (absent file: built-ins only). Malformed entries raise
    `ConfigError` naming the file and the entry, so a typo never silently prices at 0."""
    path = cwd / CONFIG_RELATIVE_PATH
    if not path.is_file():
        return PriceTable()
    try:
        config = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from exc
    return price_table_from_config(config, path)


def price_table_from_config(config: Mapping[str, Any], path: Path | str) -> PriceTable:
    """The built-in prices overlaid with the ``prices`` table of a parsed config (pure);
    `path` only names the file in error messages and in each entry's `source`."""
    extra = config.get("prices", {})
    if not isinstance(extra, Mapping):
        raise ConfigError(f'{path}: [prices] must be a table of [prices."PROVIDER:MODEL"] tables')
    merged = dict(BUILTIN_PRICES)
    for spec, entry in extra.items():
        merged[spec] = _parse_price(path, spec, entry)
    return PriceTable(prices=MappingProxyType(merged))


_REQUIRED = ("input_per_mtok", "output_per_mtok")
_OPTIONAL = ("cached_input_per_mtok",)


def _finite_non_negative(value: object) -> float | None:
    """``value`` as a price when it is a finite number, 0 or more (TOML can spell nan, inf)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if 0 <= number < math.inf else None


def _parse_price(path: Path | str, spec: str, entry: object) -> Price:
    where = f'{path}: [prices."{spec}"]'
    if ":" not in spec:
        raise ConfigError(f"{where}: the key must be a model spec such as openai:gpt-4o")
    if not isinstance(entry, Mapping):
        raise ConfigError(f"{where} must be a table with input_per_mtok and output_per_mtok")
    unknown = sorted(set(entry) - set(_REQUIRED) - set(_OPTIONAL))
    if unknown:
        raise ConfigError(
            f"{where}: unknown key(s) {', '.join(unknown)}; expected input_per_mtok, "
            "output_per_mtok and optionally cached_input_per_mtok (USD per million tokens)"
        )
    values: dict[str, float] = {}
    for key in (*_REQUIRED, *(k for k in _OPTIONAL if k in entry)):
        value = entry.get(key)
        number = _finite_non_negative(value)
        if number is None:
            raise ConfigError(
                f"{where}: {key} must be a finite number of USD per million tokens, "
                f"0 or more, got {value!r}"
            )
        values[key] = number
    return Price(
        input_per_mtok=values["input_per_mtok"],
        output_per_mtok=values["output_per_mtok"],
        cached_input_per_mtok=values.get("cached_input_per_mtok"),
        source=str(path),
    )
