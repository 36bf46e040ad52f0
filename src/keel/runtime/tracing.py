"""Whether and where runs are traced: switched on by the standard OpenTelemetry variables.

Tracing is on when ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_ENDPOINT``
is set (and neither ``OTEL_SDK_DISABLED=true`` nor ``OTEL_TRACES_EXPORTER=none`` says
otherwise): spans go over OTLP/HTTP (``http/protobuf``) through Keel's own exporter
(``keel.runtime.otlp_export``: it needs no extra package and costs a few microseconds
per span). Or the caller hands the ``Harness`` a ``TracerProvider`` of its own
(``keel.runtime.api_spans``, the ``keel-harness[otel]`` extra): spans then go through
the OpenTelemetry API, its processors and exporters. With neither, nothing is made — no
exporter, no thread, no run tracer — and a run's driver has no observer more than it
had: tracing costs nothing.

The exporter is made once per process, when the first run is driven (a gRPC protocol is
a ConfigError then, before anything is written); it sends what is still queued at
``Harness.close`` and at interpreter exit.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING

from keel.core.errors import ConfigError
from keel.core.state import RunState
from keel.runtime.otlp_export import OtlpExporter, OtlpWriter
from keel.runtime.run_spans import RunTracer, SpanIds, SpanWriter
from keel.store.base import Store

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
PROTOCOL_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
SUPPORTED_PROTOCOL = "http/protobuf"
INSTRUMENTATION = "keel"
FLUSH_TIMEOUT_MS = 5_000  # what Harness.close waits for a given provider's spans

_process_exporter: OtlpExporter | None = None  # made from the environment, once
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
    """Traces the runs one harness drives: into the provider given, or to the process's
    OTLP exporter made from the ``OTEL_*`` variables on first use.

    It also knows the run spans open in this process, so a child run driven here while
    its parent is (a delegated agent) is a span inside the parent's trace.
    """

    def __init__(
        self, provider: TracerProvider | None = None, environ: Mapping[str, str] = os.environ
    ) -> None:
        """``environ``: the variables the process's exporter is made from, if this
        harness is the first to trace here (read when the harness was made)."""
        self._provider = provider
        self._environ = dict(environ)
        self._writer: SpanWriter | None = None
        self._open: dict[str, SpanIds] = {}  # run id -> its run span, while driven
        self._lock = threading.Lock()

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] = os.environ) -> Tracing | None:
        """A ``Tracing`` when the environment asks for traces, else None (nothing made)."""
        return cls(environ=environ) if tracing_requested(environ) else None

    def for_run(self, store: Store, state: RunState) -> RunTracer:
        """A tracer for one drive of ``state``'s run (``keel.runtime.run_spans``);
        ConfigError when the environment asks for a protocol other than http/protobuf."""
        parent = self._open.get(state.parent_id) if state.parent_id else None
        return RunTracer(self._get_writer(), store, state, parent=parent, tracing=self)

    def opened(self, run_id: str, span: SpanIds) -> None:
        with self._lock:
            self._open[run_id] = span

    def closed(self, run_id: str) -> None:
        with self._lock:
            self._open.pop(run_id, None)

    def flush(self) -> None:
        """Send the spans still queued; nothing if no run was traced."""
        writer = self._writer
        if isinstance(writer, OtlpWriter):
            writer.exporter.flush()
        elif writer is not None:
            flush = getattr(self._provider, "force_flush", None)  # the API's has none
            if flush is not None:
                flush(FLUSH_TIMEOUT_MS)

    def _get_writer(self) -> SpanWriter:
        if self._writer is None:
            if self._provider is not None:
                from keel.runtime.api_spans import ApiWriter  # noqa: PLC0415 - needs the API

                tracer = self._provider.get_tracer(INSTRUMENTATION, keel_version())
                self._writer = ApiWriter(tracer)
            else:
                self._writer = OtlpWriter(process_exporter(self._environ))
        return self._writer


def process_exporter(environ: Mapping[str, str] = os.environ) -> OtlpExporter:
    """The process's OTLP/HTTP exporter, made once (its thread and exit hook with it).

    ConfigError for a protocol other than http/protobuf (gRPC is not spoken here)."""
    global _process_exporter  # noqa: PLW0603 - one exporter per process, made on first use
    with _process_lock:
        if _process_exporter is None:
            for name in PROTOCOL_VARIABLES:
                protocol = environ.get(name, "").strip()
                if protocol and protocol != SUPPORTED_PROTOCOL:
                    raise ConfigError(
                        f"{name}={protocol}: Keel exports traces over OTLP/HTTP only; set "
                        f"it to {SUPPORTED_PROTOCOL} (and the endpoint to the collector's "
                        "HTTP port, usually 4318)"
                    )
            _process_exporter = OtlpExporter(
                traces_endpoint(environ), environ=environ, version=keel_version()
            )
        return _process_exporter


def traces_endpoint(environ: Mapping[str, str]) -> str:
    """Where spans are sent: ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` as it is, else
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` with ``/v1/traces`` after it (the OTLP rule)."""
    explicit = environ.get(ENDPOINT_VARIABLES[0], "").strip()
    if explicit:
        return explicit
    return environ.get(ENDPOINT_VARIABLES[1], "").strip().rstrip("/") + "/v1/traces"


def keel_version() -> str:
    from importlib.metadata import PackageNotFoundError, version  # noqa: PLC0415

    try:
        return version("keel-harness")
    except PackageNotFoundError:  # pragma: no cover - a source tree without metadata
        return "0"
