"""Usage figures of many runs (``keel stats``) or of one (``keel show``), as plain values.

Every figure is a sum over the runs' own events, never over snapshots: a parent's
usage absorbs its children's tokens and cost, so summing snapshots would count a
child twice. Steps are ``model_responded`` events (one per step, as the budget counts
them); tokens by kind and cost are those of every model turn plus a compaction's
summary call (``context_compacted``); model latency is each turn's ``elapsed_s``,
keyed by the run's model spec (what ``--model`` names); tool latency is each
``tool_finished``/``tool_failed`` ``elapsed_s`` by tool; a verifier's checks are the
records of ``verification_passed``/``verification_failed`` events, by name (else
command). A run's reason is grouped by its code: the text before its first colon
(``budget_exhausted:steps`` and ``model_error: 429 …`` are ``budget_exhausted`` and
``model_error``), so ids and messages in reasons do not make one row per run.

Percentiles are by nearest rank (``nearest_rank``): always a latency that was
measured, never an interpolation, and the same on every backend.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from typing import Any

from keel.core.errors import UsageError
from keel.core.status import RunStatus

PERCENTILES = (50, 95, 99)


def percentile_rank(n: int, pct: int) -> int:
    """The 1-based rank of the ``pct``-th percentile of ``n`` ordered values by nearest
    rank: ceil(pct/100 * n), in integer arithmetic (no float rounding at the edges)."""
    if n < 1:
        raise ValueError("no values: a percentile needs at least one")
    if not 0 < pct <= 100:
        raise ValueError(f"percentile {pct} is not in 1..100")
    return (pct * n + 99) // 100


def nearest_rank(ordered: Sequence[float], pct: int) -> float:
    """The ``pct``-th percentile of ``ordered`` (ascending, not empty) by nearest rank:
    the value at ``percentile_rank`` (PostgreSQL's ``percentile_disc`` is the same)."""
    return ordered[percentile_rank(len(ordered), pct) - 1]


def percentiles(values: Sequence[float]) -> tuple[float, ...]:
    """``values``' percentiles ``PERCENTILES`` by nearest rank (any order, not empty)."""
    ordered = sorted(values)
    return tuple(nearest_rank(ordered, pct) for pct in PERCENTILES)


def reason_code(reason: str) -> str:
    """The part of a stop or wait reason that names its kind: the text before the first
    colon, without surrounding spaces (``child_failed:run_1`` -> ``child_failed``)."""
    return reason.split(":", 1)[0].strip(" ")


_DATE_ONLY = re.compile(r"^\d{4}-\d{2}-\d{2}$")


def parse_since(text: str) -> datetime:
    """``--since``: an ISO date (midnight UTC) or datetime (UTC when it names no offset).

    Anything else is a ``UsageError`` that quotes the input and shows both forms.
    """
    value = text.strip()
    try:
        if _DATE_ONLY.match(value):
            day = date.fromisoformat(value)
            return datetime(day.year, day.month, day.day, tzinfo=UTC)
        moment = datetime.fromisoformat(value)
    except ValueError as exc:
        raise UsageError(
            f"--since {text!r} is not an ISO date or datetime ({exc}); "
            "use e.g. 2026-01-31 or 2026-01-31T09:30:00+00:00"
        ) from None
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


@dataclass(frozen=True, slots=True, kw_only=True)
class Latency:
    """Seconds of the calls that recorded how long they took (``elapsed_s``)."""

    timed: int  # calls with a recorded latency (> 0)
    total_s: float
    p50_s: float
    p95_s: float
    p99_s: float
    max_s: float

    @classmethod
    def of(cls, seconds: Sequence[float]) -> Latency | None:
        """The figures of ``seconds`` (any order); None when there are none."""
        if not seconds:
            return None
        p50, p95, p99 = percentiles(seconds)
        return cls(
            timed=len(seconds),
            total_s=sum(seconds),
            p50_s=p50,
            p95_s=p95,
            p99_s=p99,
            max_s=max(seconds),
        )

    @property
    def mean_s(self) -> float:
        return self.total_s / self.timed

    def to_dict(self) -> dict[str, Any]:
        return {
            "timed": self.timed,
            "total_s": round(self.total_s, 6),
            "mean_s": round(self.mean_s, 6),
            "p50_s": self.p50_s,
            "p95_s": self.p95_s,
            "p99_s": self.p99_s,
            "max_s": self.max_s,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class TokenCounts:
    """Tokens by kind (``keel.models.base.TokenUsage``): ``cached_input`` is part of
    ``input``, ``reasoning`` part of ``output``."""

    input: int = 0
    cached_input: int = 0
    output: int = 0
    reasoning: int = 0

    @property
    def total(self) -> int:
        return self.input + self.output

    def to_dict(self) -> dict[str, int]:
        return {
            "input": self.input,
            "cached_input": self.cached_input,
            "output": self.output,
            "reasoning": self.reasoning,
            "total": self.total,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelFigures:
    model: str  # the run's model spec; the turn's own model name when the run names none
    calls: int  # model turns (model_responded events)
    latency: Latency | None  # None: no turn recorded elapsed_s

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "calls": self.calls,
            "latency": None if self.latency is None else self.latency.to_dict(),
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolFigures:
    tool: str
    calls: int  # tool_finished + tool_failed events
    failed: int  # tool_failed events (a refusal before the call ran included)
    latency: Latency | None  # None: no call recorded elapsed_s

    def to_dict(self) -> dict[str, Any]:
        return {
            "tool": self.tool,
            "calls": self.calls,
            "failed": self.failed,
            "latency": None if self.latency is None else self.latency.to_dict(),
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class VerifierFigures:
    verifier: str  # the verifier's name, else its command
    checks: int  # times it ran
    passed: int

    @property
    def pass_rate(self) -> float:
        return self.passed / self.checks if self.checks else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "verifier": self.verifier,
            "checks": self.checks,
            "passed": self.passed,
            "failed": self.checks - self.passed,
            "pass_rate": round(self.pass_rate, 4),
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class ReasonCount:
    status: RunStatus
    reason: str  # the reason's code (``reason_code``)
    runs: int

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status.value, "reason": self.reason, "runs": self.runs}


@dataclass(frozen=True, slots=True, kw_only=True)
class RunStats:
    """What ``Store.run_stats`` aggregates. Rows are in a stable order: reasons by
    descending count, then status and reason; models, tools and verifiers by name."""

    runs: int = 0
    by_status: dict[RunStatus, int] = field(default_factory=dict)  # every status, zeros too
    reasons: tuple[ReasonCount, ...] = ()  # runs with a stop or wait reason
    steps: int = 0
    tokens: TokenCounts = field(default_factory=TokenCounts)
    cost: float = 0.0
    models: tuple[ModelFigures, ...] = ()
    tools: tuple[ToolFigures, ...] = ()
    verifiers: tuple[VerifierFigures, ...] = ()

    @property
    def tool_calls(self) -> int:
        return sum(t.calls for t in self.tools)

    def to_dict(self) -> dict[str, Any]:
        return {
            "runs": self.runs,
            "by_status": {s.value: self.by_status.get(s, 0) for s in RunStatus},
            "reasons": [r.to_dict() for r in self.reasons],
            "steps": self.steps,
            "tool_calls": self.tool_calls,
            "tokens": self.tokens.to_dict(),
            "cost": round(self.cost, 10),
            "models": [m.to_dict() for m in self.models],
            "tools": [t.to_dict() for t in self.tools],
            "verifiers": [v.to_dict() for v in self.verifiers],
        }
