"""Budgets: which dimension ran out, the 80 % warning line, and what remains."""

from __future__ import annotations

import pytest

from keel.core.budget import Budget, Dimension, Usage


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
    usage = Usage(steps=1, tool_calls=2, tokens=3, cost=0.4, wall_seconds=5.5)
    assert Usage.from_dict(usage.to_dict()) == usage
