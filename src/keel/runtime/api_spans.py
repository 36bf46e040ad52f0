"""Run spans through an OpenTelemetry tracer: for a ``TracerProvider`` the caller owns.

``Harness(tracer_provider=...)`` traces its runs into that provider (an application's
own pipeline, or the SDK's in-memory exporter in tests), so its processors, sampler and
exporters apply. Needs the ``keel-harness[otel]`` extra (opentelemetry-api).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    Span,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    Tracer,
)

from keel.runtime.run_spans import SpanIds

_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_KINDS = {"internal": SpanKind.INTERNAL, "client": SpanKind.CLIENT}


class ApiWriter:
    """A ``SpanWriter`` (``keel.runtime.run_spans``) over an OpenTelemetry tracer."""

    def __init__(self, tracer: Tracer) -> None:
        self._tracer = tracer

    def open(
        self,
        name: str,
        parent: Any,
        *,
        kind: str,
        attributes: dict[str, Any],
        start: int | None,
        links: Sequence[SpanIds] = (),
        fixed: Mapping[str, Any] | None = None,
    ) -> Span:
        if parent is None:
            context = None  # the caller's current span, if it has one
        elif isinstance(parent, tuple):
            remote = SpanContext(parent[0], parent[1], is_remote=False, trace_flags=_SAMPLED)
            context = trace.set_span_in_context(NonRecordingSpan(remote))
        else:
            context = trace.set_span_in_context(parent)
        return self._tracer.start_span(
            name,
            context=context,
            kind=_KINDS[kind],
            attributes={**fixed, **attributes} if fixed else attributes,
            links=[_link(ids) for ids in links],
            start_time=start,
        )

    def record(
        self,
        name: str,
        parent: Span,
        *,
        kind: str,
        fixed: Mapping[str, Any],
        attributes: dict[str, Any],
        start: int,
        end: int,
        error: str | None = None,
    ) -> None:
        span = self.open(name, parent, kind=kind, attributes=attributes, start=start, fixed=fixed)
        self.close(span, end, error=error)

    def close(
        self,
        span: Span,
        end: int | None,
        *,
        attributes: dict[str, Any] | None = None,
        error: str | None = None,
    ) -> None:
        if attributes:
            span.set_attributes(attributes)
        if error is not None:
            span.set_status(Status(StatusCode.ERROR, error))
        span.end(end)

    def event(self, span: Span, name: str, attributes: dict[str, Any], at: int) -> None:
        span.add_event(name, attributes, timestamp=at)

    def ids(self, span: Span) -> SpanIds:
        ids = span.get_span_context()
        return ids.trace_id, ids.span_id


def _link(ids: SpanIds) -> Link:
    return Link(SpanContext(ids[0], ids[1], is_remote=True, trace_flags=_SAMPLED))
