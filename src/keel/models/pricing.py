"""Model prices in USD per million tokens, and the user's additions from config.

The built-in table holds published list prices (uncached input) and is keyed by model
spec (``deepseek:deepseek-chat``), because the same model name can be served at another
price by another provider. Users add or override entries in ``.keel/config.toml``::

    [prices."openai:my-model"]
    input_per_mtok = 0.5
    output_per_mtok = 1.5

A model without a price costs 0: cost budgets then only bound what is known. A price
is a finite number, 0 or more (a local model may be free); ``nan`` and ``inf``,
which TOML can spell, are refused.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from keel.core.errors import ConfigError
from keel.models.base import TokenUsage

CONFIG_RELATIVE_PATH = Path(".keel") / "config.toml"


@dataclass(frozen=True, kw_only=True)
class Price:
    """USD per million input tokens and per million output tokens."""

    input_per_mtok: float
    output_per_mtok: float

    def cost(self, usage: TokenUsage) -> float:
        return (
            usage.input_tokens * self.input_per_mtok + usage.output_tokens * self.output_per_mtok
        ) / 1_000_000


# List prices as published by the providers (DeepSeek: V3.2 pricing of 2025-09;
# OpenAI: standard tier). Cache-hit discounts are ignored, so costs are upper bounds.
BUILTIN_PRICES: Mapping[str, Price] = MappingProxyType(
    {
        "deepseek:deepseek-chat": Price(input_per_mtok=0.28, output_per_mtok=0.42),
        "deepseek:deepseek-reasoner": Price(input_per_mtok=0.28, output_per_mtok=0.42),
        "openai:gpt-4o": Price(input_per_mtok=2.50, output_per_mtok=10.00),
        "openai:gpt-4o-mini": Price(input_per_mtok=0.15, output_per_mtok=0.60),
        "openai:gpt-4.1": Price(input_per_mtok=2.00, output_per_mtok=8.00),
        "openai:gpt-4.1-mini": Price(input_per_mtok=0.40, output_per_mtok=1.60),
        "openai:gpt-4.1-nano": Price(input_per_mtok=0.10, output_per_mtok=0.40),
        "openai:o3": Price(input_per_mtok=2.00, output_per_mtok=8.00),
        "openai:o3-mini": Price(input_per_mtok=1.10, output_per_mtok=4.40),
        "openai:o4-mini": Price(input_per_mtok=1.10, output_per_mtok=4.40),
        "openai:gpt-5": Price(input_per_mtok=1.25, output_per_mtok=10.00),
        "openai:gpt-5-mini": Price(input_per_mtok=0.25, output_per_mtok=2.00),
        "openai:gpt-5-nano": Price(input_per_mtok=0.05, output_per_mtok=0.40),
    }
)


@dataclass(frozen=True, kw_only=True)
class PriceTable:
    """Prices by model spec; `cost` of an unknown spec is 0."""

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
    extra = config.get("prices", {})
    if not isinstance(extra, dict):
        raise ConfigError(f'{path}: [prices] must be a table of [prices."PROVIDER:MODEL"] tables')
    merged = dict(BUILTIN_PRICES)
    for spec, entry in extra.items():
        merged[spec] = _parse_price(path, spec, entry)
    return PriceTable(prices=MappingProxyType(merged))


def _finite_non_negative(value: object) -> float | None:
    """``value`` as a price when it is a finite number, 0 or more (TOML can spell nan, inf)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if 0 <= number < math.inf else None


def _parse_price(path: Path, spec: str, entry: object) -> Price:
    where = f'{path}: [prices."{spec}"]'
    if ":" not in spec:
        raise ConfigError(f"{where}: the key must be a model spec such as openai:gpt-4o")
    if not isinstance(entry, dict):
        raise ConfigError(f"{where} must be a table with input_per_mtok and output_per_mtok")
    allowed = {"input_per_mtok", "output_per_mtok"}
    unknown = sorted(set(entry) - allowed)
    if unknown:
        raise ConfigError(
            f"{where}: unknown key(s) {', '.join(unknown)}; "
            "expected input_per_mtok and output_per_mtok (USD per million tokens)"
        )
    values: dict[str, float] = {}
    for key in sorted(allowed):
        value = entry.get(key)
        number = _finite_non_negative(value)
        if number is None:
            raise ConfigError(
                f"{where}: {key} must be a finite number of USD per million tokens, "
                f"0 or more, got {value!r}"
            )
        values[key] = number
    return Price(input_per_mtok=values["input_per_mtok"], output_per_mtok=values["output_per_mtok"])
