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


# --- bounds, edges and refusals -------------------------------------------------------------


def test_an_interval_reads_as_low_and_high() -> None:
    assert Interval(low=0.25, high=0.75).to_dict() == {"low": 0.25, "high": 0.75}


@pytest.mark.parametrize("n", range(1, 120))
def test_wilson_never_leaves_zero_and_one_even_by_rounding(n: int) -> None:
    assert wilson(n, n).high <= 1.0 and wilson(0, n).low >= 0.0


@pytest.mark.parametrize("n", range(1, 40))
def test_newcombe_never_leaves_minus_one_and_one_even_by_rounding(n: int) -> None:
    assert newcombe(0, n, 17, 17).low >= -1.0
    assert newcombe(17, 17, 0, n).high <= 1.0


def test_newcombe_takes_one_trial_a_side_and_refuses_none() -> None:
    assert newcombe(1, 1, 0, 1).low > -1.0
    with pytest.raises(ValueError, match=r"^newcombe needs trials on both sides, got 1/1 and 0/0$"):
        newcombe(1, 1, 0, 0)


def test_newcombe_builds_on_wilson_intervals_of_the_same_confidence() -> None:
    z = 1.0  # about 68 %
    x1, n1, x2, n2 = 8, 10, 3, 12
    p1, p2 = x1 / n1, x2 / n2
    w1, w2 = wilson(x1, n1, z), wilson(x2, n2, z)
    interval = newcombe(x1, n1, x2, n2, z)
    assert interval.low == pytest.approx(
        p1 - p2 - math.sqrt((p1 - w1.low) ** 2 + (w2.high - p2) ** 2)
    )
    assert interval.high == pytest.approx(
        p1 - p2 + math.sqrt((w1.high - p1) ** 2 + (p2 - w2.low) ** 2)
    )


def test_welch_needs_two_values_a_side_and_no_more() -> None:
    assert welch([1.0, 2.0], [3.0, 5.0]) is not None


@pytest.mark.parametrize(("p", "df"), [(0, 5), (1, 5), (1.5, 5), (-0.1, 5), (0.9, 0), (0.9, -1)])
def test_a_quantile_outside_the_open_unit_interval_or_without_freedom_is_refused(
    p: float, df: float
) -> None:
    with pytest.raises(
        ValueError, match=rf"^student_t_quantile needs 0 < p < 1 and df > 0, got p={p}, df={df}$"
    ):
        student_t_quantile(p, df)


def test_the_median_of_t_is_zero_exactly_and_small_quantiles_are_found() -> None:
    assert student_t_quantile(0.5, 7) == 0.0
    assert abs(student_t_quantile(0.6, 10) - 0.2602) < 1e-4  # from the tables
    assert abs(student_t_quantile(0.4, 10) + 0.2602) < 1e-4


def test_the_t_cdf_is_below_a_half_left_of_zero_and_above_right_of_it() -> None:
    assert student_t_cdf(0.0, 5) == 0.5
    assert student_t_cdf(0.5, 10) == pytest.approx(1 - student_t_cdf(-0.5, 10))
    assert 0.5 < student_t_cdf(0.5, 10) < 0.7
    assert 0.3 < student_t_cdf(-0.5, 10) < 0.5


def test_the_regularized_beta_of_large_shapes_is_converged_or_refused() -> None:
    # Symmetric shapes: I_0.5(a, a) is 1/2 exactly. The fraction for a = b = 1e7 needs
    # about 1,000 terms (a 500-term cap returned 0.500045); past the term limit the
    # function refuses rather than return an unconverged value.
    assert regularized_beta(0.5, 1e7, 1e7) == pytest.approx(0.5, abs=1e-7)
    assert regularized_beta(0.5, 1e6, 1e6) == pytest.approx(0.5, abs=1e-8)
    with pytest.raises(
        ValueError, match=r"did not converge in 100,000 terms \(x=0.5, a=1000000000000000.0"
    ):
        regularized_beta(0.5, 1e15, 1e15)


@pytest.mark.parametrize(("a", "b"), [(1, 1), (2, 5), (0.5, 0.5)])
def test_the_regularized_beta_is_zero_and_one_at_the_ends(a: float, b: float) -> None:
    assert regularized_beta(0, a, b) == 0.0
    assert regularized_beta(-0.5, a, b) == 0.0
    assert regularized_beta(1, a, b) == 1.0
    assert regularized_beta(1.5, a, b) == 1.0


@pytest.mark.parametrize("t", [-1e6, -1000, -30, -3, -0.5, 0.5, 3, 30, 1000, 1e6])
def test_the_t_cdf_matches_its_closed_forms_for_one_and_two_degrees_of_freedom(t: float) -> None:
    assert student_t_cdf(t, 1) == pytest.approx(0.5 + math.atan(t) / math.pi, abs=1e-13)
    assert student_t_cdf(t, 2) == pytest.approx(0.5 + t / (2 * math.sqrt(2 + t * t)), abs=1e-13)


@pytest.mark.parametrize("x", [1e-12, 1e-6, 0.01, 0.3, 0.7, 0.99])
@pytest.mark.parametrize("shape", [0.05, 0.5, 2, 30, 400])
def test_the_regularized_beta_matches_its_closed_forms_when_a_or_b_is_one(
    x: float, shape: float
) -> None:
    assert regularized_beta(x, shape, 1) == pytest.approx(x**shape, abs=1e-13)
    assert regularized_beta(x, 1, shape) == pytest.approx(1 - (1 - x) ** shape, abs=1e-13)


@pytest.mark.parametrize(("successes", "trials"), [(4, 3), (101, 100), (-1, 5), (0, -1)])
def test_a_pass_rate_outside_its_counts_is_refused_quoting_them(
    successes: int, trials: int
) -> None:
    message = rf"^need 0 <= successes <= trials, got {successes}/{trials}$"
    with pytest.raises(ValueError, match=message):
        wilson(successes, trials)
