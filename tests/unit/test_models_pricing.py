"""Built-in prices: cost in USD from token usage; an unknown model costs nothing."""

from __future__ import annotations

import pytest

from keel.models.base import TokenUsage
from keel.models.pricing import BUILTIN_PRICES, Price, PriceTable


def test_cost_is_usd_per_million_tokens() -> None:
    price = Price(input_per_mtok=2.0, output_per_mtok=8.0)
    usage = TokenUsage(input_tokens=500_000, output_tokens=250_000)
    assert price.cost(usage) == pytest.approx(1.0 + 2.0)


@pytest.mark.parametrize(
    "spec",
    [
        "deepseek:deepseek-chat",
        "deepseek:deepseek-reasoner",
        "openai:gpt-4o",
        "openai:gpt-4o-mini",
        "openai:gpt-4.1",
        "openai:gpt-4.1-mini",
        "openai:o3-mini",
    ],
)
def test_common_models_have_a_price(spec: str) -> None:
    price = PriceTable().price_of(spec)
    assert price is not None
    assert 0 < price.input_per_mtok <= price.output_per_mtok


def test_unknown_model_costs_zero() -> None:
    usage = TokenUsage(input_tokens=10**6, output_tokens=10**6)
    assert PriceTable().cost("openai:llama3-local", usage) == 0.0


def test_builtin_table_cannot_be_mutated_by_accident() -> None:
    with pytest.raises(TypeError):
        BUILTIN_PRICES["openai:gpt-4o"] = Price(input_per_mtok=0, output_per_mtok=0)  # type: ignore[index]
