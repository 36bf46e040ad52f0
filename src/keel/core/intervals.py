"""Confidence intervals for an evaluation's figures: pass rates, their differences, means.

- A pass rate k/n gets the **Wilson score interval** (Wilson 1927; method 3 of Newcombe,
  "Two-sided confidence intervals for the single proportion: comparison of seven
  methods", Statistics in Medicine 17:857-872, 1998): it stays inside [0, 1] and keeps
  close to its nominal coverage for the small n of an eval suite, where the textbook
  p ± z·sqrt(p(1-p)/n) collapses to a point at 0/n and n/n.
- A difference of two pass rates gets **Newcombe's hybrid score interval** (method 10
  of Newcombe, "Interval estimation for the difference between independent
  proportions: comparison of eleven methods", Statistics in Medicine 17:873-890, 1998),
  built from the two Wilson intervals.
- A difference of two means (steps, tokens, cost) gets **Welch's t interval**, which
  does not assume equal variances; the t quantile is computed here (no SciPy).

A difference is *significant* at 95 % when its interval excludes 0. Pure; no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist, fmean

Z95 = NormalDist().inv_cdf(0.975)  # 1.959963984540054: two-sided 95 %


@dataclass(frozen=True, slots=True, kw_only=True)
class Interval:
    """A two-sided 95 % confidence interval ``[low, high]``."""

    low: float
    high: float

    @property
    def excludes_zero(self) -> bool:
        """True when 0 lies outside the interval: the difference it bounds is significant."""
        return self.low > 0 or self.high < 0

    def to_dict(self) -> dict[str, float]:
        return {"low": self.low, "high": self.high}


def wilson(successes: int, trials: int, z: float = Z95) -> Interval:
    """The Wilson score interval of ``successes / trials`` (no continuity correction);
    [0, 1] for no trials at all (nothing is known)."""
    _check_counts(successes, trials)
    if trials == 0:
        return Interval(low=0.0, high=1.0)
    p = successes / trials
    z2 = z * z
    denominator = 1 + z2 / trials
    centre = (p + z2 / (2 * trials)) / denominator
    half = z * math.sqrt(p * (1 - p) / trials + z2 / (4 * trials * trials)) / denominator
    return Interval(low=max(0.0, centre - half), high=min(1.0, centre + half))


def newcombe(x1: int, n1: int, x2: int, n2: int, z: float = Z95) -> Interval:
    """Newcombe's hybrid score interval for ``x1/n1 - x2/n2`` (his method 10); both sides
    need at least one trial."""
    if n1 < 1 or n2 < 1:
        raise ValueError(f"newcombe needs trials on both sides, got {x1}/{n1} and {x2}/{n2}")
    p1, p2 = x1 / n1, x2 / n2
    w1, w2 = wilson(x1, n1, z), wilson(x2, n2, z)
    difference = p1 - p2
    below = math.sqrt((p1 - w1.low) ** 2 + (w2.high - p2) ** 2)
    above = math.sqrt((w1.high - p1) ** 2 + (p2 - w2.low) ** 2)
    return Interval(low=max(-1.0, difference - below), high=min(1.0, difference + above))


def welch(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> Interval | None:
    """Welch's interval for ``mean(a) - mean(b)``; None when a side has fewer than two
    values (its spread is unknown). Two samples without any spread (a scripted model
    spends the same every time) give the exact difference as a zero-width interval."""
    if len(a) < 2 or len(b) < 2:
        return None
    difference = fmean(a) - fmean(b)
    va, vb = _variance(a) / len(a), _variance(b) / len(b)
    se2 = va + vb
    if se2 == 0:
        return Interval(low=difference, high=difference)
    df = se2 * se2 / (va * va / (len(a) - 1) + vb * vb / (len(b) - 1))
    half = student_t_quantile(0.5 + level / 2, df) * math.sqrt(se2)
    return Interval(low=difference - half, high=difference + half)


def student_t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with ``df`` (> 0, not necessarily whole) degrees of
    freedom, to about 1e-10: the CDF (a regularized incomplete beta) inverted by
    bisection."""
    if not 0 < p < 1 or not df > 0:
        raise ValueError(f"student_t_quantile needs 0 < p < 1 and df > 0, got p={p}, df={df}")
    if p == 0.5:
        return 0.0
    if p < 0.5:
        return -student_t_quantile(1 - p, df)
    low, high = 0.0, 1.0
    while student_t_cdf(high, df) < p:
        high *= 2
    for _ in range(200):
        middle = (low + high) / 2
        if student_t_cdf(middle, df) < p:
            low = middle
        else:
            high = middle
        if high - low < 1e-12 * max(1.0, high):
            break
    return (low + high) / 2


def student_t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom."""
    tail = 0.5 * regularized_beta(df / (df + t * t), df / 2, 0.5)
    return 1 - tail if t > 0 else tail


def regularized_beta(x: float, a: float, b: float) -> float:
    """I_x(a, b), by its continued fraction (modified Lentz), on the side where it
    converges fast. The fraction runs until it has converged (the terms it needs grow
    with the cube root of min(a, b): a few dozen for Keel's t tests, where b is 1/2);
    ValueError past ``MAX_FRACTION_TERMS``, never an unconverged value. For very large
    a and b the front factor's rounding limits the accuracy (about 1e-8 at a = b = 1e7,
    1e-5 at 1e10)."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
    front = math.exp(log_front + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1) / (a + b + 2):
        return front * _beta_fraction(x, a, b) / a
    return 1 - front * _beta_fraction(1 - x, b, a) / b


MAX_FRACTION_TERMS = 100_000  # enough for min(a, b) up to about 1e13


def _beta_fraction(x: float, a: float, b: float) -> float:
    tiny = 1e-300
    c, d = 1.0, 1 - (a + b) * x / (a + 1)
    d = 1 / (d if abs(d) > tiny else tiny)
    fraction = d
    for m in range(1, MAX_FRACTION_TERMS + 1):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1 + numerator * d
            d = 1 / (d if abs(d) > tiny else tiny)
            c = 1 + numerator / c
            c = c if abs(c) > tiny else tiny
            fraction *= c * d
        if abs(c * d - 1) < 1e-15:
            return fraction
    raise ValueError(
        f"I_x(a, b) did not converge in {MAX_FRACTION_TERMS:,} terms "
        f"(x={x!r}, a={a!r}, b={b!r}): a and b are too large for this method"
    )


def _variance(values: Sequence[float]) -> float:
    """The sample variance (n - 1 in the denominator)."""
    centre = fmean(values)
    return sum((v - centre) ** 2 for v in values) / (len(values) - 1)


def _check_counts(successes: int, trials: int) -> None:
    if trials < 0 or not 0 <= successes <= trials:
        raise ValueError(f"need 0 <= successes <= trials, got {successes}/{trials}")


__all__ = [
    "Z95",
    "Interval",
    "newcombe",
    "regularized_beta",
    "student_t_cdf",
    "student_t_quantile",
    "welch",
    "wilson",
]
