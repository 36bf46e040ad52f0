"""Confidence intervals against published values.

Single proportions: Newcombe, "Two-sided confidence intervals for the single proportion:
comparison of seven methods", Statistics in Medicine 17:857-872 (1998), Table I, method
3 (Wilson score without continuity correction). Differences: Newcombe, "Interval
estimation for the difference between independent proportions: comparison of eleven
methods", Statistics in Medicine 17:873-890 (1998), Table II, method 10 (hybrid score).
Both tables are given to 4 decimals, for z = 1.96.
"""

from __future__ import annotations

import math

import pytest

from keel.core.intervals import (
    Interval,
    newcombe,
    regularized_beta,
    student_t_cdf,
    student_t_quantile,
    welch,
    wilson,
)


def close(interval: Interval, low: float, high: float, tol: float = 6e-5) -> bool:
    return abs(interval.low - low) < tol and abs(interval.high - high) < tol


def test_wilson_of_8_in_10() -> None:
    assert close(wilson(8, 10), 0.4902, 0.9433)


@pytest.mark.parametrize(
    ("k", "n", "low", "high"),
    [
        (81, 263, 0.2553, 0.3662),
        (15, 148, 0.0624, 0.1605),
        (0, 20, 0.0, 0.1611),
        (1, 29, 0.0061, 0.1718),
    ],
)
def test_wilson_matches_newcombes_single_proportion_examples(
    k: int, n: int, low: float, high: float
) -> None:
    assert close(wilson(k, n, z=1.96), low, high)


def test_wilson_stays_inside_zero_and_one_and_knows_nothing_of_no_trials() -> None:
    assert wilson(0, 3).low == 0.0 and wilson(3, 3).high == 1.0
    assert wilson(0, 0) == Interval(low=0.0, high=1.0)
    with pytest.raises(ValueError):
        wilson(4, 3)


@pytest.mark.parametrize(
    ("x1", "n1", "x2", "n2", "low", "high"),
    [
        (56, 70, 48, 80, 0.0524, 0.3339),  # (a)
        (9, 10, 3, 10, 0.1705, 0.8090),  # (b)
        (6, 7, 2, 7, 0.0582, 0.8062),  # (c)
        (5, 56, 0, 29, -0.0381, 0.1926),  # (d)
        (0, 10, 0, 20, -0.1611, 0.2775),  # (e)
        (0, 10, 0, 10, -0.2775, 0.2775),  # (f)
        (10, 10, 0, 20, 0.6791, 1.0000),  # (g)
        (10, 10, 0, 10, 0.6075, 1.0000),  # (h)
    ],
)
def test_newcombe_matches_his_table_of_differences(
    x1: int, n1: int, x2: int, n2: int, low: float, high: float
) -> None:
    assert close(newcombe(x1, n1, x2, n2, z=1.96), low, high)


def test_a_difference_is_significant_only_when_its_interval_excludes_zero() -> None:
    assert newcombe(9, 10, 3, 10).excludes_zero
    assert not newcombe(0, 10, 0, 10).excludes_zero
    assert newcombe(0, 5, 5, 5).excludes_zero  # 0/5 against 5/5: about -100 to -39 pts
    with pytest.raises(ValueError):
        newcombe(1, 0, 1, 2)


@pytest.mark.parametrize(
    ("df", "quantile"),
    [(1, 12.7062), (2, 4.3027), (5, 2.5706), (10, 2.2281), (30, 2.0423), (1000, 1.9623)],
)
def test_student_t_quantiles_match_the_tables(df: float, quantile: float) -> None:
    assert abs(student_t_quantile(0.975, df) - quantile) < 1e-4
    assert abs(student_t_quantile(0.025, df) + quantile) < 1e-4
    assert abs(student_t_cdf(quantile, df) - 0.975) < 1e-5


def test_regularized_beta_at_known_points() -> None:
    assert regularized_beta(0.5, 2, 2) == pytest.approx(0.5)
    assert regularized_beta(0.3, 1, 1) == pytest.approx(0.3)  # uniform
    assert regularized_beta(0.25, 1, 3) == pytest.approx(1 - 0.75**3)


# Welch's t-test, Wikipedia's first example: t = -2.46, about 25 degrees of freedom.
A1 = [27.5, 21.0, 19.0, 23.6, 17.0, 17.9, 16.9, 20.1, 21.9, 22.6, 23.1, 19.6, 19.0, 21.7, 21.4]
A2 = [27.1, 22.0, 20.8, 23.4, 23.4, 23.5, 25.8, 22.0, 24.8, 20.2, 21.9, 22.1, 22.9, 20.5, 24.4]


def test_welch_interval_of_the_textbook_example() -> None:
    interval = welch(A1, A2)
    assert interval is not None
    assert close(interval, -3.9841, -0.3492, tol=1e-4)
    centre = (interval.low + interval.high) / 2
    se = (interval.high - centre) / student_t_quantile(0.975, 24.9885)
    assert centre / se == pytest.approx(-2.4554, abs=1e-3)
    assert interval.excludes_zero


def test_welch_without_spread_is_exact_and_without_two_values_unknown() -> None:
    assert welch([3, 3, 3], [1, 1]) == Interval(low=2.0, high=2.0)
    assert welch([3], [1, 2]) is None
    one_spread = welch([1, 2, 3], [5, 5, 5])
    assert one_spread is not None and math.isfinite(one_spread.low)
