"""Budgets: which dimension ran out, the 80 % warning line, and what remains."""

from __future__ import annotations

import math
import re

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from keel.core.budget import (
    MAX_COUNT,
    MAX_SECONDS,
    Budget,
    Dimension,
    Usage,
    check_budget,
    check_count,
    check_seconds,
)
from keel.core.errors import ConfigError


def test_no_dimension_is_exhausted_below_every_limit() -> None:
    budget = Budget(max_steps=10, max_tool_calls=10, max_tokens=1000, max_cost=1.0)
    assert budget.exhausted(Usage(steps=9, tool_calls=9, tokens=999, cost=0.99)) is None


@pytest.mark.parametrize(
    ("usage", "dimension"),
    [
        (Usage(steps=10), Dimension.STEPS),
        (Usage(tool_calls=5), Dimension.TOOL_CALLS),
        (Usage(tokens=1000), Dimension.TOKENS),
        (Usage(cost=0.5), Dimension.COST),
        (Usage(wall_seconds=60.0), Dimension.WALL_TIME),
    ],
)
def test_reaching_a_limit_names_that_dimension(usage: Usage, dimension: Dimension) -> None:
    budget = Budget(
        max_steps=10, max_tool_calls=5, max_tokens=1000, max_cost=0.5, max_wall_seconds=60
    )
    assert budget.exhausted(usage) is dimension


def test_unlimited_dimensions_never_run_out() -> None:
    budget = Budget(max_steps=None, max_tool_calls=None)
    huge = Usage(steps=10**9, tool_calls=10**9, tokens=10**12, cost=1e9, wall_seconds=1e9)
    assert budget.exhausted(huge) is None
    assert budget.warnings(huge) == []
    assert set(budget.remaining(huge).values()) == {None}


def test_warning_line_is_eighty_percent() -> None:
    budget = Budget(max_steps=10, max_tool_calls=100, max_cost=1.0)
    assert budget.warnings(Usage(steps=7, tool_calls=79, cost=0.79)) == []
    assert budget.warnings(Usage(steps=8, tool_calls=80, cost=0.8)) == [
        Dimension.STEPS,
        Dimension.TOOL_CALLS,
        Dimension.COST,
    ]


def test_remaining_never_goes_negative() -> None:
    budget = Budget(max_steps=3, max_tool_calls=None)
    remaining = budget.remaining(Usage(steps=5))
    assert remaining["steps"] == 0.0 and remaining["tool_calls"] is None


def test_usage_adds_up_and_cost_does_not_drift() -> None:
    usage = Usage()
    for _ in range(10):
        usage = usage.add(steps=1, tokens=7, cost=0.1, tool_calls=2, wall_seconds=0.5)
    assert (usage.steps, usage.tokens, usage.tool_calls, usage.wall_seconds) == (10, 70, 20, 5.0)
    assert usage.cost == 1.0


def test_budget_and_usage_round_trip_through_dicts() -> None:
    budget = Budget(max_steps=4, max_tool_calls=None, max_tokens=9, max_cost=0.3)
    assert Budget.from_dict(budget.to_dict()) == budget
    usage = Usage(
        steps=1,
        tool_calls=2,
        tokens=3,
        cost=0.4,
        wall_seconds=5.5,
        input_tokens=2,
        cached_input_tokens=1,
        output_tokens=1,
        reasoning_tokens=1,
    )
    assert Usage.from_dict(usage.to_dict()) == usage


def test_a_turn_adds_a_step_its_tokens_by_kind_and_its_cost() -> None:
    usage = Usage(wall_seconds=2.0).add_turn(
        {
            "input_tokens": 900,
            "cached_input_tokens": 600,
            "output_tokens": 100,
            "reasoning_tokens": 80,
        },
        0.25,
    )
    usage = usage.add_turn({"input_tokens": 100, "output_tokens": 10}, 0.05)
    assert (usage.steps, usage.tokens, usage.cost, usage.wall_seconds) == (2, 1110, 0.3, 2.0)
    assert (usage.input_tokens, usage.cached_input_tokens) == (1000, 600)
    assert (usage.output_tokens, usage.reasoning_tokens) == (110, 80)
    assert usage.cache_hit_ratio == 0.6
    assert usage.add(tool_calls=1).input_tokens == 1000  # other additions keep the kinds


def test_a_token_count_that_is_not_a_whole_number_counts_nothing() -> None:
    usage = Usage().add_turn(
        {"input_tokens": "12", "output_tokens": True, "cached_input_tokens": -5}, 0.0
    )
    assert (usage.steps, usage.tokens, usage.input_tokens, usage.cached_input_tokens) == (
        1,
        0,
        0,
        0,
    )
    assert usage.cache_hit_ratio is None


# --- limits are checked before a run exists ----------------------------------------------


@pytest.mark.parametrize(
    ("budget", "message"),
    [
        (Budget(max_steps=0), "max_steps must be a whole number from 1 to"),
        (Budget(max_tool_calls=-3), "max_tool_calls must be a whole number from 1 to"),
        (Budget(max_tokens=MAX_COUNT + 1), "max_tokens must be a whole number from 1 to"),
        (Budget(max_steps=2.5), "max_steps must be a whole number"),  # type: ignore[arg-type]
        (Budget(max_steps=True), "max_steps must be a whole number"),
        (Budget(max_cost=0.0), "max_cost must be a finite number above 0 (USD), got 0.0"),
        (Budget(max_cost=-1.0), "max_cost must be a finite number above 0 (USD)"),
        (Budget(max_cost=math.nan), "max_cost must be a finite number above 0 (USD), got nan"),
        (Budget(max_cost=math.inf), "max_cost must be a finite number above 0 (USD), got inf"),
        (Budget(max_wall_seconds=0), "max_wall_seconds must be a number of seconds above 0"),
        (Budget(max_wall_seconds=math.nan), "max_wall_seconds must be a number of seconds"),
        (Budget(max_wall_seconds=MAX_SECONDS * 2), f"at most {MAX_SECONDS}"),
    ],
)
def test_a_limit_out_of_range_is_refused_naming_it_and_the_accepted_range(
    budget: Budget, message: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        check_budget(budget)


def test_the_cli_names_its_options_instead_of_the_fields() -> None:
    labels = {
        "max_steps": "--max-steps",
        "max_tool_calls": "--max-tool-calls",
        "max_tokens": "--max-tokens",
        "max_cost": "--max-cost",
        "max_wall_seconds": "--timeout",
    }
    with pytest.raises(ConfigError, match=r"^--timeout must be"):
        check_budget(Budget(max_wall_seconds=-5), labels)


def test_sensible_limits_and_unlimited_dimensions_pass() -> None:
    check_budget(Budget(max_steps=1, max_tool_calls=MAX_COUNT, max_cost=0.01))
    check_budget(
        Budget(max_steps=None, max_tool_calls=None, max_tokens=None, max_wall_seconds=1e-3)
    )


@pytest.mark.parametrize("seconds", [0, -5, math.nan, math.inf, 10**400, "60", True])
def test_a_timeout_must_be_positive_finite_seconds(seconds: object) -> None:
    with pytest.raises(ConfigError, match=r"^--approval-timeout must be a number of seconds"):
        check_seconds("--approval-timeout", seconds)


def test_a_huge_number_is_shown_shortened_in_the_message() -> None:
    with pytest.raises(ConfigError) as err:
        check_seconds("grant_ttl", 10**400)
    assert len(str(err.value)) < 150


# --- what each addition changes, and nothing else ------------------------------------------

FULL = Usage(
    steps=3,
    tool_calls=4,
    tokens=500,
    cost=0.5,
    wall_seconds=6.0,
    input_tokens=400,
    cached_input_tokens=100,
    output_tokens=100,
    reasoning_tokens=20,
)


@pytest.mark.parametrize("field", ["steps", "tool_calls", "tokens", "cost", "wall_seconds"])
def test_adding_one_dimension_leaves_every_other_count_as_it_was(field: str) -> None:
    after = FULL.add(**{field: 2})
    before, changed = FULL.to_dict(), after.to_dict()
    assert changed.pop(field) == before.pop(field) + 2
    assert changed == before


def test_a_step_without_a_cost_leaves_the_cost_exactly_as_recorded() -> None:
    usage = Usage(cost=1 / 3)
    assert usage.add(steps=1).cost == 1 / 3
    assert usage.add_turn({"input_tokens": 5}, 0.0).cost == 1 / 3


@given(st.lists(st.floats(min_value=0, max_value=10, allow_nan=False), max_size=20))
@example([0.123456789012345, 2e-11])
def test_a_summed_cost_never_carries_float_noise_past_ten_decimal_places(
    costs: list[float],
) -> None:
    usage = Usage()
    for cost in costs:
        usage = usage.add(cost=cost).add_turn({}, cost).absorb({"cost": cost})
        assert round(usage.cost, 10) == usage.cost


def test_each_way_of_adding_a_cost_rounds_it_to_ten_decimal_places() -> None:
    cost = 0.123456789012345  # a price per token times a count, with float noise
    assert Usage().add(cost=cost).cost == 0.123456789
    assert Usage().add_turn({}, cost).cost == 0.123456789
    assert Usage().absorb({"cost": cost}).cost == 0.123456789


def test_a_child_run_adds_its_tokens_of_every_kind_and_its_cost_but_not_its_steps() -> None:
    child = {
        "steps": 7,
        "tool_calls": 9,
        "wall_seconds": 30.0,
        "tokens": 50,
        "cost": 0.125,
        "input_tokens": 40,
        "cached_input_tokens": 10,
        "output_tokens": 10,
        "reasoning_tokens": 5,
    }
    after = FULL.absorb(child)
    assert (after.steps, after.tool_calls, after.wall_seconds) == (3, 4, 6.0)
    assert after.tokens == 550 and after.cost == 0.625
    assert (after.input_tokens, after.cached_input_tokens) == (440, 110)
    assert (after.output_tokens, after.reasoning_tokens) == (110, 25)


@pytest.mark.parametrize(
    "bad", [None, True, "0.5", -1, -0.0, math.nan, math.inf, -math.inf, [1], {"usd": 1}]
)
def test_a_child_cost_that_is_not_a_finite_positive_number_adds_nothing(bad: object) -> None:
    assert FULL.absorb({"cost": bad}).cost == FULL.cost
    assert FULL.absorb({"cost": bad}) == FULL.absorb({})


@pytest.mark.parametrize("cost", [1, 0.3, 2.75])
def test_a_child_cost_adds_as_money(cost: float) -> None:
    assert FULL.absorb({"cost": cost}).cost == FULL.cost + cost


def test_a_child_without_usage_changes_nothing() -> None:
    assert FULL.absorb({}) == FULL


@pytest.mark.parametrize(
    ("count", "counted"),
    [(12.0, 12), (12.9, 12), (0.0, 0), (-3.5, 0), (math.nan, 0), (math.inf, 0), (7, 7), (-2, 0)],
)
def test_a_recorded_token_count_counts_its_whole_non_negative_part(
    count: float, counted: int
) -> None:
    kinds = ("input_tokens", "cached_input_tokens", "output_tokens", "reasoning_tokens")
    turn = Usage().add_turn(dict.fromkeys(kinds, count), 0.0)
    child = Usage().absorb(dict.fromkeys((*kinds, "tokens"), count))
    for kind in kinds:
        assert getattr(turn, kind) == counted
        assert getattr(child, kind) == counted
    assert child.tokens == counted


def test_a_usage_recorded_before_a_field_existed_reads_it_as_zero() -> None:
    assert Usage.from_dict({}) == Usage()
    assert Usage.from_dict({"steps": 2}) == Usage(steps=2)


def test_a_whole_number_limit_out_of_range_is_quoted_in_the_refusal() -> None:
    with pytest.raises(ConfigError, match=r", got 0$"):
        check_budget(Budget(max_steps=0))
    with pytest.raises(ConfigError, match=r", got -7$"):
        check_seconds("--timeout", -7)


def test_the_longest_timeout_is_accepted() -> None:
    check_seconds("--timeout", MAX_SECONDS)
    check_budget(Budget(max_wall_seconds=MAX_SECONDS))


@pytest.mark.parametrize("length", [39, 40, 41, 80])
def test_a_refused_value_is_quoted_whole_up_to_forty_characters_else_cut_with_an_ellipsis(
    length: int,
) -> None:
    value = "x" * (length - 2)  # its repr has the two quotes
    with pytest.raises(ConfigError) as err:
        check_count("--max-steps", value)
    shown = str(err.value).rpartition(", got ")[2]
    if length <= 40:
        assert shown == repr(value)
    else:
        assert len(shown) == 40 and shown.endswith("…")
        assert repr(value).startswith(shown[:-1])
