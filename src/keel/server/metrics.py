"""``GET /metrics``: what one ``keel serve`` process exposes to Prometheus.

Two sources, read differently:

- the store, read at every scrape: runs by status (``keel_runs``) and the work waiting
  for a worker (``keel_queue_depth``). Every replica sharing a store reports the same
  figures (aggregate them with ``max``, not ``sum``);
- the events this process's embedded worker slots commit (``EventMetrics`` of
  ``keel.server.event_metrics``, fed by the workers' ``on_event``): steps, claims,
  model and tool calls, and their latencies.
  Counters and histograms start at zero when the process starts, as Prometheus
  counters do (``rate()`` handles the reset); a server with ``--workers 0`` keeps them
  at zero — its ``keel worker`` processes do the work.

The text is the Prometheus exposition format 0.0.4, written by ``prometheus_client``
(HELP and TYPE lines, label values escaped, histogram buckets cumulative with ``+Inf``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from fastapi import APIRouter, Depends, Request, Response
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry

from keel.core.status import RunStatus
from keel.server.auth import Caller, require_token
from keel.server.context import context_of
from keel.server.event_metrics import EventMetrics, MetricsSnapshot
from keel.store.base import Store

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class _Scrape(Collector):
    """The metric families of one scrape: the store's gauges, then the counters."""

    def __init__(self, events: MetricsSnapshot, store: Store) -> None:
        self.events = events
        self.store = store

    def collect(self) -> Iterator[Metric]:
        yield from store_gauges(self.store)
        yield from event_families(self.events)


def store_gauges(store: Store) -> Iterator[Metric]:
    """``keel_runs{status}`` (every status, zeros included) and ``keel_queue_depth``.
    A store that cannot answer raises its ``StoreError`` (the route answers 503)."""
    by_status = store.count_runs_by_status()
    runs = GaugeMetricFamily(
        "keel_runs", "Runs in the store, by status (read at each scrape).", labels=["status"]
    )
    for status in RunStatus:
        runs.add_metric([status.value], float(by_status.get(status, 0)))
    yield runs
    yield GaugeMetricFamily(
        "keel_queue_depth",
        "Work waiting for a worker: queued runs without a task, and pending tasks whose "
        "blockers are done.",
        value=float(store.queue_depth()),
    )


def event_families(events: MetricsSnapshot) -> Iterable[Metric]:
    """The counters and histograms of what this process's workers committed."""
    steps = CounterMetricFamily(
        "keel_steps_total", "Model turns committed by this process's workers.", value=events.steps
    )
    claims = CounterMetricFamily(
        "keel_claims_total",
        "Executions of runs this process's workers started (a queued run taken up, "
        "or a run resumed).",
        value=events.claims,
    )
    model_calls = CounterMetricFamily(
        "keel_model_calls_total",
        "Model calls answered, by model, committed by this process's workers.",
        labels=["model"],
    )
    for model, count in sorted(events.model_calls.items()):
        model_calls.add_metric([model], count)
    tool_calls = CounterMetricFamily(
        "keel_tool_calls_total",
        "Tool calls ended, by tool and outcome (ok, or the call's error kind), committed "
        "by this process's workers.",
        labels=["tool", "outcome"],
    )
    for (tool, outcome), count in sorted(events.tool_calls.items()):
        tool_calls.add_metric([tool, outcome], count)
    model_latency = HistogramMetricFamily(
        "keel_model_latency_seconds",
        "Seconds a model took to answer a turn, by model.",
        labels=["model"],
    )
    for model, histogram in sorted(events.model_latency.items()):
        model_latency.add_metric([model], histogram.cumulative(), histogram.total)
    tool_latency = HistogramMetricFamily(
        "keel_tool_latency_seconds",
        "Seconds a tool call ran, by tool (calls refused before running are not timed).",
        labels=["tool"],
    )
    for tool, histogram in sorted(events.tool_latency.items()):
        tool_latency.add_metric([tool], histogram.cumulative(), histogram.total)
    return (steps, claims, model_calls, tool_calls, model_latency, tool_latency)


def exposition(events: EventMetrics, store: Store) -> bytes:
    """The scrape's text in the Prometheus exposition format 0.0.4 (UTF-8)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Scrape(events.snapshot(), store))
    return generate_latest(registry)


router = APIRouter(tags=["service"])


@router.get(
    "/metrics",
    response_class=Response,
    responses={
        200: {"content": {CONTENT_TYPE: {}}, "description": "Prometheus text format 0.0.4"},
        503: {"description": "the store is unreachable"},
    },
)
def metrics(request: Request, _caller: Caller = Depends(require_token)) -> Response:
    """Runs by status, queue depth, steps, claims, model and tool calls and latencies."""
    context = context_of(request)
    return Response(exposition(context.metrics, context.store), media_type=CONTENT_TYPE)
