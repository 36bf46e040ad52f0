"""What the events committed by one process's workers say happened: steps, claims,
model and tool calls and their latencies (``EventMetrics``).

Pure bookkeeping with no server import, so the server's context can hold one (fed by
its workers' ``on_event``) and ``keel.server.metrics`` can expose it at ``GET /metrics``.
"""

from __future__ import annotations

import bisect
import math
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from keel.core.events import Event, EventType
from keel.core.state import RunState

# Seconds. A model answers in a fraction of a second (a small local model) to minutes
# (a long reasoning turn); a tool call in a millisecond (a read) to the command timeout.
MODEL_LATENCY_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)
TOOL_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0)

OK_OUTCOME = "ok"  # the outcome label of a tool_finished call; a failed one has its error kind
UNKNOWN_TOOL = "unknown_tool"  # the error kind of a call naming no tool
UNKNOWN_TOOL_LABEL = "(unknown)"  # the tool label of such calls: the model's made-up name
# would give every invented name a series of its own


@dataclass(frozen=True, slots=True)
class HistogramCounts:
    """One labelled histogram: ``counts[i]`` values fell at or below ``bounds[i]`` and
    above the bound before it; the last count is above every bound (``+Inf``)."""

    bounds: tuple[float, ...]
    counts: tuple[int, ...]
    total: float  # the sum of the observed values
    count: int

    def cumulative(self) -> list[tuple[str, float]]:
        """``(le, values at or below le)`` for each bound and ``+Inf``, as exposed."""
        running, buckets = 0, []
        for bound, count in zip((*self.bounds, math.inf), self.counts, strict=True):
            running += count
            buckets.append((_le(bound), float(running)))
        return buckets


class _Histogram:
    """A histogram being filled; the caller holds the collector's lock."""

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1  # le: value <= bound
        self.total += value
        self.count += 1

    def frozen(self) -> HistogramCounts:
        return HistogramCounts(self.bounds, tuple(self.counts), self.total, self.count)


@dataclass(frozen=True, slots=True)
class MetricsSnapshot:
    """What ``EventMetrics`` counted up to one moment (a consistent copy)."""

    steps: int
    claims: int
    model_calls: Mapping[str, int]  # model -> calls answered
    tool_calls: Mapping[tuple[str, str], int]  # (tool, outcome) -> calls ended
    model_latency: Mapping[str, HistogramCounts]  # model -> seconds
    tool_latency: Mapping[str, HistogramCounts]  # tool -> seconds


class EventMetrics:
    """Counts what the events committed by this process's workers say happened.

    ``observe`` is safe to call from every worker thread at once; it never raises on
    odd event data (a missing or non-numeric ``elapsed_s`` counts the call without a
    latency). What each event type adds:

    - ``model_responded``: a step, a model call of its ``model``, and its ``elapsed_s``;
    - ``tool_finished``: a call of ``tool`` with outcome ``ok``, and its ``elapsed_s``;
    - ``tool_failed``: a call with its ``error_kind`` as outcome, and its ``elapsed_s``
      when it ran (a call refused before running has none);
    - a claim — an execution of a run started by this process: every execution commits
      ``run_resumed`` first, except that of a fresh run (only ``run_created`` stored),
      whose first commit is its sequence number 2 (``keel.runtime.resume``).
    """

    def __init__(
        self,
        *,
        model_buckets: tuple[float, ...] = MODEL_LATENCY_BUCKETS,
        tool_buckets: tuple[float, ...] = TOOL_LATENCY_BUCKETS,
    ) -> None:
        self._model_buckets = tuple(sorted(model_buckets))
        self._tool_buckets = tuple(sorted(tool_buckets))
        self._lock = threading.Lock()
        self._steps = 0
        self._claims = 0
        self._model_calls: dict[str, int] = {}
        self._tool_calls: dict[tuple[str, str], int] = {}
        self._model_latency: dict[str, _Histogram] = {}
        self._tool_latency: dict[str, _Histogram] = {}

    def observe(self, event: Event, state: RunState | None = None) -> None:
        """Count ``event``, just committed. ``state`` (the run after it) is not needed:
        it is accepted so that this method is a worker's ``on_event`` as it is."""
        data = event.data
        claim = event.type is EventType.RUN_RESUMED or event.seq == 2
        with self._lock:
            if claim:
                self._claims += 1
            if event.type is EventType.MODEL_RESPONDED:
                model = _label(data.get("model"))
                self._steps += 1
                self._model_calls[model] = self._model_calls.get(model, 0) + 1
                self._time(self._model_latency, model, self._model_buckets, data)
            elif event.type in (EventType.TOOL_FINISHED, EventType.TOOL_FAILED):
                finished = event.type is EventType.TOOL_FINISHED
                outcome = OK_OUTCOME if finished else _label(data.get("error_kind"))
                tool = UNKNOWN_TOOL_LABEL if outcome == UNKNOWN_TOOL else _label(data.get("tool"))
                self._tool_calls[tool, outcome] = self._tool_calls.get((tool, outcome), 0) + 1
                self._time(self._tool_latency, tool, self._tool_buckets, data)

    @staticmethod
    def _time(
        histograms: dict[str, _Histogram],
        label: str,
        bounds: tuple[float, ...],
        data: Mapping[str, Any],
    ) -> None:
        seconds = _seconds(data.get("elapsed_s"))
        if seconds is None:
            return
        histogram = histograms.get(label)
        if histogram is None:
            histogram = histograms[label] = _Histogram(bounds)
        histogram.observe(seconds)

    def snapshot(self) -> MetricsSnapshot:
        """A consistent copy of everything counted so far."""
        with self._lock:
            return MetricsSnapshot(
                steps=self._steps,
                claims=self._claims,
                model_calls=dict(self._model_calls),
                tool_calls=dict(self._tool_calls),
                model_latency={k: h.frozen() for k, h in self._model_latency.items()},
                tool_latency={k: h.frozen() for k, h in self._tool_latency.items()},
            )


def _le(bound: float) -> str:
    """A bucket bound as Prometheus writes it: ``0.5``, ``10.0``, ``+Inf``."""
    return "+Inf" if bound == math.inf else repr(float(bound))


def _label(value: object) -> str:
    return value if isinstance(value, str) and value else "unknown"


def _seconds(value: object) -> float | None:
    """A latency worth recording: a finite, non-negative number of seconds."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    seconds = float(value)
    return seconds if math.isfinite(seconds) and seconds >= 0 else None
