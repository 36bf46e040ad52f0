"""Whether and where runs are traced: OpenTelemetry, switched on by the standard variables.

Tracing is on when ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_ENDPOINT``
is set (and neither ``OTEL_SDK_DISABLED=true`` nor ``OTEL_TRACES_EXPORTER=none`` says
otherwise), or when the caller hands the ``Harness`` a ``TracerProvider`` of its own.
With none of that, no provider is made, the SDK is never imported and a run's driver
has no observer more than it had: tracing costs nothing.

The process's provider is made once, on the first run driven here, and exports in
batches over OTLP/HTTP (``http/protobuf``: the exporter reads the endpoint, headers,
timeout and compression variables itself); its exit hook sends what is still queued.
A gRPC protocol, or tracing asked for without the ``keel-harness[otel]`` extra
installed, is a ConfigError when a run would be driven — not when the harness is
made, so ``keel runs`` and ``keel approve`` never need the extra.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from keel.core.errors import ConfigError
from keel.core.state import RunState
from keel.store.base import Store

if TYPE_CHECKING:
    from opentelemetry.trace import SpanContext, Tracer, TracerProvider

    from keel.runtime.run_spans import RunTracer

ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
PROTOCOL_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
SUPPORTED_PROTOCOL = "http/protobuf"
SERVICE_NAME = "keel"
INSTRUMENTATION = "keel"
FLUSH_TIMEOUT_MS = 5_000  # what Harness.close waits for queued spans to be sent

_process_provider: Any = None  # the TracerProvider made from the environment, once
_process_lock = threading.Lock()


def tracing_requested(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the environment asks for traces to be exported (an OTLP endpoint is set
    and the SDK is not disabled)."""
    if not any(environ.get(name, "").strip() for name in ENDPOINT_VARIABLES):
        return False
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    return exporters != "none"


class Tracing:
    """Traces the runs one harness drives, with one tracer provider: the one given, or
    the process's own made from the ``OTEL_*`` variables on first use.

    It also knows the run spans open in this process, so a child run driven here while
    its parent is (a delegated agent) is a span inside the parent's trace.
    """

    def __init__(
        self, provider: TracerProvider | None = None, environ: Mapping[str, str] = os.environ
    ) -> None:
        """``environ``: the variables the process's provider is made from, if this
        harness is the first to trace here (read when the harness was made)."""
        self._provider = provider
        self._environ = dict(environ)
        self._tracer: Tracer | None = None
        self._open: dict[str, SpanContext] = {}  # run id -> its run span, while driven
        self._lock = threading.Lock()

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] = os.environ) -> Tracing | None:
        """A ``Tracing`` when the environment asks for traces, else None (nothing made)."""
        return cls(environ=environ) if tracing_requested(environ) else None

    def for_run(self, store: Store, state: RunState) -> RunTracer:
        """A tracer for one drive of ``state``'s run (``keel.runtime.run_spans``).

        ConfigError when the environment asks for an unsupported protocol or the
        OpenTelemetry SDK is not installed."""
        tracer = self._get_tracer()  # first: without the SDK, the ConfigError is here
        from keel.runtime.run_spans import RunTracer  # noqa: PLC0415 - it needs the API

        parent = self._open.get(state.parent_id) if state.parent_id else None
        return RunTracer(tracer, store, state, parent=parent, tracing=self)

    def opened(self, run_id: str, span: SpanContext) -> None:
        with self._lock:
            self._open[run_id] = span

    def closed(self, run_id: str) -> None:
        with self._lock:
            self._open.pop(run_id, None)

    def flush(self) -> None:
        """Send what is queued (bounded by ``FLUSH_TIMEOUT_MS``); nothing if no run was
        traced."""
        provider = self._provider if self._provider is not None else _process_provider
        if self._tracer is not None and provider is not None:
            flush = getattr(provider, "force_flush", None)  # the API's provider has none
            if flush is not None:
                flush(FLUSH_TIMEOUT_MS)

    def _get_tracer(self) -> Tracer:
        if self._tracer is None:
            provider = self._provider
            if provider is None:
                provider = process_provider(self._environ)
            self._tracer = provider.get_tracer(INSTRUMENTATION, _keel_version())
        return self._tracer


def process_provider(environ: Mapping[str, str] = os.environ) -> TracerProvider:
    """The process's tracer provider: a batch exporter over OTLP/HTTP, made once.

    It is not installed as OpenTelemetry's global provider: Keel's spans go where the
    ``OTEL_*`` variables say, and an application's own tracing stays its own.
    """
    global _process_provider  # noqa: PLW0603 - one provider per process, made on first use
    with _process_lock:
        if _process_provider is None:
            _process_provider = _otlp_provider(environ)
        provider: TracerProvider = _process_provider
        return provider


def _otlp_provider(environ: Mapping[str, str]) -> TracerProvider:
    for name in PROTOCOL_VARIABLES:
        protocol = environ.get(name, "").strip()
        if protocol and protocol != SUPPORTED_PROTOCOL:
            raise ConfigError(
                f"{name}={protocol}: Keel exports traces over OTLP/HTTP only; set it to "
                f"{SUPPORTED_PROTOCOL} (and the endpoint to the collector's HTTP port, "
                "usually 4318)"
            )
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # noqa: PLC0415
            OTLPSpanExporter,
        )
        from opentelemetry.sdk.resources import Resource  # noqa: PLC0415
        from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider  # noqa: PLC0415
        from opentelemetry.sdk.trace.export import BatchSpanProcessor  # noqa: PLC0415
    except ImportError as exc:
        variable = next(n for n in ENDPOINT_VARIABLES if environ.get(n, "").strip())
        raise ConfigError(
            f"{variable} is set, so Keel would export traces, but the OpenTelemetry SDK is "
            f"not installed ({exc.name} is missing): pip install 'keel-harness[otel]', or "
            f"unset {variable} (or set OTEL_SDK_DISABLED=true)"
        ) from exc
    resource = Resource.create({"service.version": _keel_version()})
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": SERVICE_NAME}))
    provider = SdkTracerProvider(resource=resource)  # its exit hook flushes the queue
    # The endpoint as the variables said when the harness was made; the exporter reads
    # its other variables (headers, timeout, compression, certificates) itself.
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(traces_endpoint(environ))))
    return provider


def traces_endpoint(environ: Mapping[str, str]) -> str:
    """Where spans are sent: ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` as it is, else
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` with ``/v1/traces`` after it (the OTLP rule)."""
    explicit = environ.get(ENDPOINT_VARIABLES[0], "").strip()
    if explicit:
        return explicit
    return environ.get(ENDPOINT_VARIABLES[1], "").strip().rstrip("/") + "/v1/traces"


def _keel_version() -> str:
    from importlib.metadata import PackageNotFoundError, version  # noqa: PLC0415

    try:
        return version("keel-harness")
    except PackageNotFoundError:  # pragma: no cover - a source tree without metadata
        return "0"
