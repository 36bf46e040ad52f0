"""Budgets: limits, usage, which dimension ran out, and the 80 % warning line.

Limits and timeouts are checked before a run is created (``check_budget``,
``check_seconds``): a count is a whole number from 1 to ``MAX_COUNT``, an amount
of money or seconds a finite number above 0 (seconds at most ``MAX_SECONDS``, so
a deadline computed from them is a real date). ``None`` means unlimited.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from keel.core.errors import ConfigError

WARNING_FRACTION = 0.8
MAX_COUNT = 10**12  # steps, tool calls, tokens: far beyond any real run
MAX_SECONDS = 10**9  # about 31 years: now + this stays a valid date


class Dimension(StrEnum):
    STEPS = "steps"  # model turns
    TOOL_CALLS = "tool_calls"  # tool calls, failed ones included
    TOKENS = "tokens"  # prompt + completion tokens
    COST = "cost"  # US dollars
    WALL_TIME = "wall_time"  # seconds spent working (model, tools, verifiers)


_USAGE_FIELD = {
    Dimension.STEPS: "steps",
    Dimension.TOOL_CALLS: "tool_calls",
    Dimension.TOKENS: "tokens",
    Dimension.COST: "cost",
    Dimension.WALL_TIME: "wall_seconds",
}
_LIMIT_FIELD = {
    Dimension.STEPS: "max_steps",
    Dimension.TOOL_CALLS: "max_tool_calls",
    Dimension.TOKENS: "max_tokens",
    Dimension.COST: "max_cost",
    Dimension.WALL_TIME: "max_wall_seconds",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Usage:
    """What a run has consumed so far; persisted in the run state, never reset.

    ``tokens`` is the budget's dimension: prompt + completion tokens. The four kinds
    say what they were: ``input_tokens`` (every prompt token, cached ones included),
    ``cached_input_tokens`` (the part served from the provider's prompt cache),
    ``output_tokens`` (every completion token) and ``reasoning_tokens`` (the part spent
    thinking). A run recorded before the kinds were kept has them at 0.
    """

    steps: int = 0
    tool_calls: int = 0
    tokens: int = 0
    cost: float = 0.0
    wall_seconds: float = 0.0
    input_tokens: int = 0
    cached_input_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0

    def used(self, dim: Dimension) -> float:
        value: float = getattr(self, _USAGE_FIELD[dim])
        return value

    def add(
        self,
        *,
        steps: int = 0,
        tool_calls: int = 0,
        tokens: int = 0,
        cost: float = 0.0,
        wall_seconds: float = 0.0,
    ) -> Usage:
        return Usage(
            steps=self.steps + steps,
            tool_calls=self.tool_calls + tool_calls,
            tokens=self.tokens + tokens,
            cost=round(self.cost + cost, 10) if cost else self.cost,
            wall_seconds=self.wall_seconds + wall_seconds,
            input_tokens=self.input_tokens,
            cached_input_tokens=self.cached_input_tokens,
            output_tokens=self.output_tokens,
            reasoning_tokens=self.reasoning_tokens,
        )

    def add_turn(self, usage: Mapping[str, Any], cost: float) -> Usage:
        """The usage after one model turn: a step, its tokens by kind (as a
        ``model_responded`` event records them: ``TokenUsage.to_dict()``) and its cost.
        The budget's ``tokens`` grows by input + output, as it always has."""
        input_tokens = _count(usage.get("input_tokens"))
        output_tokens = _count(usage.get("output_tokens"))
        return Usage(
            steps=self.steps + 1,
            tool_calls=self.tool_calls,
            tokens=self.tokens + input_tokens + output_tokens,
            cost=round(self.cost + cost, 10) if cost else self.cost,
            wall_seconds=self.wall_seconds,
            input_tokens=self.input_tokens + input_tokens,
            cached_input_tokens=self.cached_input_tokens + _count(usage.get("cached_input_tokens")),
            output_tokens=self.output_tokens + output_tokens,
            reasoning_tokens=self.reasoning_tokens + _count(usage.get("reasoning_tokens")),
        )

    def absorb(self, child: Mapping[str, Any]) -> Usage:
        """This usage with a child run's tokens (every kind) and cost added (a
        ``Usage.to_dict()``): the tree shares one token and cost budget. Steps, tool
        calls and wall time are each run's own and stay as they are."""
        return Usage(
            steps=self.steps,
            tool_calls=self.tool_calls,
            tokens=self.tokens + _count(child.get("tokens")),
            cost=round(self.cost + _money(child.get("cost")), 10),
            wall_seconds=self.wall_seconds,
            input_tokens=self.input_tokens + _count(child.get("input_tokens")),
            cached_input_tokens=self.cached_input_tokens + _count(child.get("cached_input_tokens")),
            output_tokens=self.output_tokens + _count(child.get("output_tokens")),
            reasoning_tokens=self.reasoning_tokens + _count(child.get("reasoning_tokens")),
        )

    @property
    def cache_hit_ratio(self) -> float | None:
        """Cached input tokens over input tokens; None before any input was counted."""
        if not self.input_tokens:
            return None
        return self.cached_input_tokens / self.input_tokens

    def to_dict(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "tool_calls": self.tool_calls,
            "tokens": self.tokens,
            "cost": self.cost,
            "wall_seconds": self.wall_seconds,
            "input_tokens": self.input_tokens,
            "cached_input_tokens": self.cached_input_tokens,
            "output_tokens": self.output_tokens,
            "reasoning_tokens": self.reasoning_tokens,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Usage:
        return cls(
            steps=int(d.get("steps", 0)),
            tool_calls=int(d.get("tool_calls", 0)),
            tokens=int(d.get("tokens", 0)),
            cost=float(d.get("cost", 0.0)),
            wall_seconds=float(d.get("wall_seconds", 0.0)),
            input_tokens=int(d.get("input_tokens", 0)),
            cached_input_tokens=int(d.get("cached_input_tokens", 0)),
            output_tokens=int(d.get("output_tokens", 0)),
            reasoning_tokens=int(d.get("reasoning_tokens", 0)),
        )


def _count(value: Any) -> int:
    """A recorded token count; anything that is not a whole number counts 0."""
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return max(0, value)
    if isinstance(value, float) and math.isfinite(value):
        return max(0, int(value))
    return 0


def _money(value: Any) -> float:
    """A recorded cost; anything that is not a finite, non-negative number counts 0."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0.0
    number = float(value)
    return number if math.isfinite(number) and number > 0 else 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Budget:
    """Limits per dimension; ``None`` means unlimited."""

    max_steps: int | None = 50
    max_tool_calls: int | None = 200
    max_tokens: int | None = None
    max_cost: float | None = None
    max_wall_seconds: float | None = None

    def limit(self, dim: Dimension) -> float | None:
        value: float | None = getattr(self, _LIMIT_FIELD[dim])
        return value

    def exhausted(
        self, usage: Usage, dimensions: Iterable[Dimension] = tuple(Dimension)
    ) -> Dimension | None:
        """The first of ``dimensions`` whose usage reached its limit (used >= limit: a
        limit of N allows exactly N), or None. The loop's one definition of running out."""
        for dim in dimensions:
            limit = self.limit(dim)
            if limit is not None and usage.used(dim) >= limit:
                return dim
        return None

    def warnings(self, usage: Usage) -> list[Dimension]:
        """Dimensions at or past the warning line (80 %) of their limit."""
        return [
            dim
            for dim in Dimension
            if (limit := self.limit(dim)) is not None
            and usage.used(dim) >= WARNING_FRACTION * limit
        ]

    def remaining(self, usage: Usage) -> dict[str, float | None]:
        out: dict[str, float | None] = {}
        for dim in Dimension:
            limit = self.limit(dim)
            out[dim.value] = None if limit is None else max(0.0, limit - usage.used(dim))
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "max_steps": self.max_steps,
            "max_tool_calls": self.max_tool_calls,
            "max_tokens": self.max_tokens,
            "max_cost": self.max_cost,
            "max_wall_seconds": self.max_wall_seconds,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Budget:
        """Stored limits as they were written (checked when the run was created)."""
        return cls(
            max_steps=d.get("max_steps"),
            max_tool_calls=d.get("max_tool_calls"),
            max_tokens=d.get("max_tokens"),
            max_cost=d.get("max_cost"),
            max_wall_seconds=d.get("max_wall_seconds"),
        )


# --- checks before a run is created --------------------------------------------------------

# How the Python API names each limit; the CLI passes its option names instead.
BUDGET_FIELDS: Mapping[str, str] = {
    "max_steps": "max_steps",
    "max_tool_calls": "max_tool_calls",
    "max_tokens": "max_tokens",
    "max_cost": "max_cost",
    "max_wall_seconds": "max_wall_seconds",
}


def check_count(label: str, value: object) -> None:
    """ConfigError naming ``label`` unless ``value`` is None or a whole number in 1..MAX_COUNT."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_COUNT:
        raise ConfigError(
            f"{label} must be a whole number from 1 to {MAX_COUNT}, got {_shown(value)}"
        )


def check_amount(label: str, value: object, *, unit: str) -> None:
    """ConfigError naming ``label`` unless ``value`` is None or a finite number above 0."""
    if value is None:
        return
    number = _as_float(value)
    if number is None or not 0 < number < math.inf:
        raise ConfigError(f"{label} must be a finite number above 0 ({unit}), got {_shown(value)}")


def check_seconds(label: str, value: object) -> None:
    """ConfigError naming ``label`` unless ``value`` is None or seconds in (0, MAX_SECONDS]."""
    if value is None:
        return
    number = _as_float(value)
    if number is None or not 0 < number <= MAX_SECONDS:
        raise ConfigError(
            f"{label} must be a number of seconds above 0 and at most {MAX_SECONDS}, "
            f"got {_shown(value)}"
        )


def check_budget(budget: Budget, labels: Mapping[str, str] = BUDGET_FIELDS) -> None:
    """ConfigError naming the first limit (as ``labels`` call it) that is out of range."""
    check_count(labels["max_steps"], budget.max_steps)
    check_count(labels["max_tool_calls"], budget.max_tool_calls)
    check_count(labels["max_tokens"], budget.max_tokens)
    check_amount(labels["max_cost"], budget.max_cost, unit="USD")
    check_seconds(labels["max_wall_seconds"], budget.max_wall_seconds)


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:39] + "…"


def _as_float(value: object) -> float | None:
    """``value`` as a float (NaN and infinities included); None for non-numbers and bools.

    An integer too large for a float becomes infinity, so it fails the range checks.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        return float(value)
    except OverflowError:
        return math.inf
