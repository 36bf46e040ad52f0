"""Prices: cost in USD from token usage by kind (cache hits at their own price), the
built-in table with its sources, and `[prices."SPEC"]` entries from config."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from keel.core.errors import ConfigError
from keel.models.base import TokenUsage
from keel.models.pricing import (
    BUILTIN_PRICES,
    Price,
    PriceTable,
    price_table_from_config,
)

CONFIG = Path("/ws/.keel/config.toml")


def test_cost_is_usd_per_million_tokens() -> None:
    price = Price(input_per_mtok=2.0, output_per_mtok=8.0)
    usage = TokenUsage(input_tokens=500_000, output_tokens=250_000)
    assert price.cost(usage) == pytest.approx(1.0 + 2.0)


def test_cache_hits_are_billed_at_the_cache_hit_price() -> None:
    # 1000 input tokens of which 800 came from DeepSeek's cache, 500 output, flash at the
    # peak price: miss 0.30, hit 0.006, output 1.20 USD per million.
    usage = TokenUsage(input_tokens=1000, output_tokens=500, cached_input_tokens=800)
    expected = (200 * 0.30 + 800 * 0.006 + 500 * 1.20) / 1e6

    cost = PriceTable().cost("deepseek:deepseek-flash", usage)

    assert cost == pytest.approx(expected)
    assert cost == pytest.approx(0.0006648)


def test_a_long_prompt_bills_the_whole_request_at_the_long_context_rates() -> None:
    table = PriceTable()
    short = TokenUsage(input_tokens=272_000, output_tokens=1000, cached_input_tokens=200_000)
    long = TokenUsage(input_tokens=272_001, output_tokens=1000, cached_input_tokens=200_000)

    assert table.cost("openai:gpt-5.4", short) == pytest.approx(
        (72_000 * 2.50 + 200_000 * 0.25 + 1000 * 15.00) / 1e6
    )
    assert table.cost("openai:gpt-5.4", long) == pytest.approx(
        (72_001 * 5.00 + 200_000 * 0.50 + 1000 * 22.50) / 1e6
    )


def test_models_that_bill_cache_writes_price_uncached_input_as_a_write() -> None:
    price = PriceTable().price_of("openai:gpt-6.2-sol")
    assert price is not None
    assert price.input_per_mtok == pytest.approx(1.25 * 2.00)


def test_without_a_cache_hit_price_cached_tokens_cost_the_input_price() -> None:
    price = Price(input_per_mtok=3.0, output_per_mtok=0.0)
    usage = TokenUsage(input_tokens=1_000_000, output_tokens=0, cached_input_tokens=600_000)
    assert price.cost(usage) == pytest.approx(3.0)


def test_more_cached_than_input_tokens_never_makes_a_cost_negative() -> None:
    price = Price(input_per_mtok=1.0, output_per_mtok=1.0, cached_input_per_mtok=0.5)
    usage = TokenUsage(input_tokens=100, output_tokens=0, cached_input_tokens=10_000)
    assert price.cost(usage) == pytest.approx(100 * 0.5 / 1e6)


@pytest.mark.parametrize(
    "spec",
    [
        "deepseek:deepseek-flash",
        "deepseek:deepseek-v4-flash",
        "deepseek:deepseek-v4-pro",
        "deepseek:deepseek-chat",
        "deepseek:deepseek-reasoner",
        "openai:gpt-5",
        "openai:gpt-5-mini",
        "openai:gpt-5-nano",
        "openai:gpt-5.5",
        "openai:gpt-5.4-mini",
        "openai:gpt-6.2-sol",
        "openai:gpt-6-luna",
        "openai:gpt-4.1",
        "openai:gpt-4.1-mini",
        "openai:gpt-4o",
        "openai:gpt-4o-mini",
        "openai:o3",
        "openai:o4-mini",
    ],
)
def test_current_models_have_a_dated_price_with_its_source(spec: str) -> None:
    price = PriceTable().price_of(spec)
    assert price is not None
    assert 0 < price.input_per_mtok <= price.output_per_mtok
    assert price.cached_input_per_mtok is not None
    assert 0 < price.cached_input_per_mtok <= price.input_per_mtok
    assert price.source is not None and price.source.startswith("https://")
    assert price.as_of is not None and re.fullmatch(r"\d{4}-\d{2}(-\d{2})?", price.as_of)


def test_every_builtin_price_names_its_page_and_date() -> None:
    for spec, price in BUILTIN_PRICES.items():
        provider = spec.partition(":")[0]
        assert price.source is not None and provider in price.source, spec
        assert price.as_of is not None, spec


def test_deepseek_aliases_are_priced_as_the_flash_model() -> None:
    table = PriceTable()
    flash = table.price_of("deepseek:deepseek-flash")
    assert table.price_of("deepseek:deepseek-v4-flash") == flash
    assert table.price_of("deepseek:deepseek-chat") == flash
    assert table.price_of("deepseek:deepseek-reasoner") == flash


def test_unknown_model_has_no_price_and_costs_zero() -> None:
    usage = TokenUsage(input_tokens=10**6, output_tokens=10**6)
    assert PriceTable().price_of("openai:llama3-local") is None
    assert PriceTable().cost("openai:llama3-local", usage) == 0.0


def test_builtin_table_cannot_be_mutated_by_accident() -> None:
    with pytest.raises(TypeError):
        BUILTIN_PRICES["openai:gpt-4o"] = Price(input_per_mtok=0, output_per_mtok=0)  # type: ignore[index]


# --- [prices."SPEC"] in config -------------------------------------------------------------


def prices_from(text: str) -> PriceTable:
    return price_table_from_config(tomllib.loads(text), CONFIG)


def test_config_may_give_a_cache_hit_price() -> None:
    table = prices_from(
        '[prices."openai:my-model"]\n'
        "input_per_mtok = 1.0\noutput_per_mtok = 2.0\ncached_input_per_mtok = 0.1\n"
    )
    price = table.price_of("openai:my-model")
    assert price == Price(
        input_per_mtok=1.0, output_per_mtok=2.0, cached_input_per_mtok=0.1, source=str(CONFIG)
    )
    usage = TokenUsage(input_tokens=1_000_000, output_tokens=0, cached_input_tokens=500_000)
    assert table.cost("openai:my-model", usage) == pytest.approx(0.5 + 0.05)


def test_config_without_a_cache_hit_price_bills_hits_at_the_input_price() -> None:
    price = prices_from('[prices."openai:x"]\ninput_per_mtok = 1\noutput_per_mtok = 2\n').price_of(
        "openai:x"
    )
    assert price is not None and price.cached_input_per_mtok is None


def test_config_overrides_a_builtin_and_keeps_the_rest() -> None:
    table = prices_from('[prices."openai:gpt-4o"]\ninput_per_mtok = 0\noutput_per_mtok = 0\n')
    assert table.cost("openai:gpt-4o", TokenUsage(input_tokens=10**6, output_tokens=10**6)) == 0
    assert table.price_of("deepseek:deepseek-v4-pro") == BUILTIN_PRICES["deepseek:deepseek-v4-pro"]


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("cached_input_per_mtok = nan", "cached_input_per_mtok must be a finite number"),
        ("cached_input_per_mtok = inf", "got inf"),
        ("cached_input_per_mtok = -0.1", "0 or more, got -0.1"),
        ('cached_input_per_mtok = "0.1"', "cached_input_per_mtok must be a finite number"),
        ("cached_input_per_mtok = true", "got True"),
        ("cache_hit_per_mtok = 0.1", "unknown key(s) cache_hit_per_mtok"),
    ],
)
def test_a_bad_cache_hit_price_is_refused_naming_the_file_and_entry(
    entry: str, message: str
) -> None:
    text = f'[prices."openai:x"]\ninput_per_mtok = 1\noutput_per_mtok = 2\n{entry}\n'
    with pytest.raises(ConfigError) as err:
        prices_from(text)
    assert f'{CONFIG}: [prices."openai:x"]' in str(err.value)
    assert message in str(err.value)


def test_prices_must_be_a_table() -> None:
    with pytest.raises(ConfigError, match=r"\[prices\] must be a table"):
        prices_from('prices = "cheap"\n')
