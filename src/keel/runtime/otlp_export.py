"""Keel's own OTLP/HTTP span exporter: spans as protobuf, sent in batches by one thread.

Why not the OpenTelemetry SDK here: a durable step costs about 0.5 ms and makes three
spans; the SDK's span objects and its OTLP encoder cost tens of microseconds per span
in CPython, several times the step budget for tracing (50 us). A span here is a small
record made once its end is known (Keel's spans are made from stored events, all at
once), and the encoder writes the protobuf wire format directly, keeping the encoded
bytes of attribute values that repeat (model, tool, operation names). The wire format
is the one ``opentelemetry-proto`` defines (``ExportTraceServiceRequest``); the tests
decode what a loopback receiver gets with it.

The exporter reads the standard variables: the endpoint (``keel.runtime.tracing``),
``OTEL_EXPORTER_OTLP_[TRACES_]HEADERS`` (``k=v,k2=v2``, values URL-encoded),
``…_TIMEOUT`` (seconds, as the Python SDK reads it; default 10), ``…_COMPRESSION``
(``gzip``), ``…_CERTIFICATE``, ``…_CLIENT_CERTIFICATE``/``…_CLIENT_KEY``, and the
resource from ``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES``. Spans are sent
when 512 are queued, every second, at ``flush`` and at interpreter exit; a failed send
is retried (connection errors, 429, 502, 503, 504) with backoff within the timeout,
then dropped with a warning. Sending never blocks the driver: past ``MAX_QUEUE``
queued spans, new ones are dropped and counted.
"""

from __future__ import annotations

import atexit
import gzip
import logging
import os
import random
import struct
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any
from urllib.parse import unquote

import httpx

LOG = logging.getLogger("keel.tracing")
BATCH = 512  # spans per request
MAX_QUEUE = 8192  # spans waiting to be sent; more are dropped (and counted)
SCHEDULE_S = 1.0  # how often the thread sends what is queued
DEFAULT_TIMEOUT_S = 10.0
RETRY_STATUS = frozenset({429, 502, 503, 504})
KIND_INTERNAL, KIND_CLIENT = 1, 3  # opentelemetry.proto.trace.v1.Span.SpanKind
STATUS_ERROR = 2  # opentelemetry.proto.trace.v1.Status.StatusCode
_CACHE_LIMIT = 8192  # encoded attributes kept
NO_ATTRIBUTES: Mapping[str, Any] = MappingProxyType({})


@dataclass(slots=True, kw_only=True)
class SpanRecord:
    """One span as it is sent: ids, times (ns since the epoch), attributes, outcome."""

    trace_id: int
    span_id: int
    parent_id: int = 0  # 0: a root span
    name: str
    kind: int = KIND_INTERNAL
    start: int = 0
    end: int = 0
    attributes: dict[str, Any] = field(default_factory=dict)
    fixed: Mapping[str, Any] = field(default_factory=lambda: NO_ATTRIBUTES)  # repeating ones
    events: list[tuple[int, str, dict[str, Any]]] = field(default_factory=list)
    links: Sequence[tuple[int, int]] = ()
    error: str | None = None  # the status message of a span that ended in error
    ids: bytes = b""  # its trace and parent fields, encoded (its parent's ``child_ids``)
    child_ids: bytes = b""  # its children's: its trace id and its span id as their parent


_getrandbits = random.getrandbits


def new_span_id() -> int:
    return _getrandbits(64) or 1


def new_trace_id() -> int:
    return random.getrandbits(128) or 1


# --- the wire format -----------------------------------------------------------------------


def _varint(n: int) -> bytes:
    if n < 0x80:
        return _SMALL[n]
    if n < 0x4000:
        return bytes(((n & 0x7F) | 0x80, n >> 7))
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_SMALL = [bytes((n,)) for n in range(128)]
_TAGS = [bytes((number << 3 | 2,)) for number in range(16)]  # length-delimited field tags
_MASK64 = 0xFFFF_FFFF_FFFF_FFFF  # an int64 is sent as its two's complement


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (strings, bytes, messages)."""
    size = len(payload)
    return _TAGS[number] + (_SMALL[size] if size < 128 else _varint(size)) + payload


_DOUBLE = struct.Struct("<d").pack
# kind (field 6, a varint), start and end (fields 7 and 8, fixed64): one pack per span
_KIND_AND_TIMES = struct.Struct("<BBBQBQ").pack
# a KeyValue's value (field 2) holding an AnyValue int (field 3, varint): by the
# varint's length; and holding an AnyValue double (field 4, fixed64)
_INT_VALUE = [b"\x12" + bytes((n + 1,)) + b"\x18" for n in range(11)]
_DOUBLE_VALUE = b"\x12\x09\x21"


def _any_value(value: Any) -> bytes:
    if isinstance(value, str):
        return _field(1, value.encode("utf-8", "replace"))
    if isinstance(value, bool):
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, int):
        return b"\x18" + _varint(value & _MASK64)
    if isinstance(value, float):
        return b"\x21" + _DOUBLE(value)
    if isinstance(value, list | tuple):
        return _field(5, b"".join(_field(1, _any_value(v)) for v in value))
    return _field(1, str(value).encode("utf-8", "replace"))


# Encoded attributes kept for reuse: whole KeyValue fields for the values that repeat
# (operation, provider, model and tool names, the run id, finish reasons, flags), and
# every key's own bytes. Numbers and values that rarely repeat (call ids) are encoded
# each time: keeping them would only fill the cache. Cached by (field, key, type, value):
# True and 1 are equal keys of a dict, not the same attribute.
_encoded: dict[tuple[int, str, type, Any], bytes] = {}
_keys: dict[str, bytes] = {}
UNIQUE_VALUES = frozenset({"gen_ai.tool.call.id"})


def _key_field(key: str) -> bytes:
    """A KeyValue's key (field 1), kept."""
    found = _keys.get(key)
    if found is None:
        found = _field(1, key.encode("utf-8", "replace"))
        if len(_keys) < _CACHE_LIMIT:
            _keys[key] = found
    return found


def _key_value(number: int, key: str, value: Any) -> bytes:
    """Field ``number`` holding the KeyValue ``key``: ``value``."""
    kind = type(value)
    if kind is int:  # the common numbers (tokens, counts) in one go, never kept
        key_field = _keys.get(key) or _key_field(key)
        number_bytes = _varint(value & _MASK64)
        size = len(key_field) + 3 + len(number_bytes)
        return (
            _TAGS[number]
            + (_SMALL[size] if size < 128 else _varint(size))
            + key_field
            + _INT_VALUE[len(number_bytes)]
            + number_bytes
        )
    if kind is float:
        key_field = _keys.get(key) or _key_field(key)
        size = len(key_field) + 11
        return (
            _TAGS[number]
            + (_SMALL[size] if size < 128 else _varint(size))
            + key_field
            + _DOUBLE_VALUE
            + _DOUBLE(value)
        )
    if (kind is str or kind is bool or kind is tuple) and key not in UNIQUE_VALUES:
        cached = (number, key, kind, value)
        try:
            encoded, keep = _encoded.get(cached), True
        except TypeError:  # a tuple holding a list: encoded, not kept
            encoded, keep = None, False
        if encoded is not None:
            return encoded  # an equal tuple of strings is one of strings: same bytes
        encoded = _field(number, _key_field(key) + _field(2, _any_value(value)))
        if keep and (kind is not tuple or all(type(v) is str for v in value)):
            if len(_encoded) >= _CACHE_LIMIT:
                _encoded.clear()
            _encoded[cached] = encoded
        return encoded
    return _field(number, _key_field(key) + _field(2, _any_value(value)))


def _attributes(number: int, attributes: Mapping[str, Any]) -> bytes:
    return b"".join(
        [_key_value(number, key, value) for key, value in attributes.items() if value is not None]
    )


# The encoding of attribute sets that repeat span to span (``fixed``: the same mapping
# object each time, never changed), by the mapping's id; the mapping is kept with its
# bytes so its id cannot be reused by another while it is here.
_fixed: dict[int, tuple[Mapping[str, Any], bytes]] = {}


def _fixed_attributes(attributes: Mapping[str, Any]) -> bytes:
    if not attributes:
        return b""
    found = _fixed.get(id(attributes))
    if found is not None and found[0] is attributes:
        return found[1]
    encoded = _attributes(9, attributes)
    if len(_fixed) >= _CACHE_LIMIT:
        _fixed.clear()
    _fixed[id(attributes)] = (attributes, encoded)
    return encoded


_names: dict[str, bytes] = {}


def _name_field(name: str) -> bytes:
    encoded = _names.get(name)
    if encoded is None:
        encoded = _field(5, name.encode("utf-8", "replace"))
        if len(_names) >= _CACHE_LIMIT:
            _names.clear()
        _names[name] = encoded
    return encoded


def trace_field(trace_id: int) -> bytes:
    """A span's ``trace_id`` (field 1)."""
    return b"\x0a\x10" + trace_id.to_bytes(16, "big")


def parent_field(span_id: int) -> bytes:
    """A span's ``parent_span_id`` (field 4): ``span_id`` is its parent's."""
    return b"\x22\x08" + span_id.to_bytes(8, "big")


def _child_ids(span: SpanRecord) -> bytes:
    """``span.child_ids``, made once."""
    span.child_ids = trace_field(span.trace_id) + parent_field(span.span_id)
    return span.child_ids


def encode_span(span: SpanRecord) -> bytes:
    """One ``opentelemetry.proto.trace.v1.Span`` message."""
    ids = span.ids
    if not ids:
        ids = trace_field(span.trace_id) + (parent_field(span.parent_id) if span.parent_id else b"")
    return encode_span_of(
        ids,
        span.span_id,
        span.name,
        span.kind,
        span.start,
        span.end,
        span.fixed,
        span.attributes,
        span.events,
        span.links,
        span.error,
    )


def encode_span_of(
    ids: bytes,
    span_id: int,
    name: str,
    kind: int,
    start: int,
    end: int,
    fixed: Mapping[str, Any],
    attributes: Mapping[str, Any],
    events: Sequence[tuple[int, str, dict[str, Any]]] = (),
    links: Sequence[tuple[int, int]] = (),
    error: str | None = None,
) -> bytes:
    """One ``Span`` message from its parts. ``ids``: its trace id and parent span id as
    encoded fields (``trace_field`` + ``parent_field``; a parent's children share them,
    and protobuf reads fields in any order); ``fixed``: attributes kept encoded, see
    ``_fixed_attributes`` (an attribute in both is sent once, as ``attributes`` has it)."""
    if fixed and attributes and not fixed.keys().isdisjoint(attributes):
        fixed, attributes = NO_ATTRIBUTES, {**fixed, **attributes}
    found = _fixed.get(id(fixed))
    parts = [
        ids,
        b"\x12\x08",
        span_id.to_bytes(8, "big"),
        _names.get(name) or _name_field(name),
        _KIND_AND_TIMES(0x30, kind, 0x39, start, 0x41, end),
        found[1] if found is not None and found[0] is fixed else _fixed_attributes(fixed),
    ]
    for key, value in attributes.items():  # _attributes(9, ...), one call fewer a span
        if value is not None:
            parts.append(_key_value(9, key, value))
    for at, event_name, event_attributes in events:
        event = (
            b"\x09"
            + struct.pack("<Q", at)
            + _field(2, event_name.encode())
            + _attributes(3, event_attributes)
        )
        parts.append(_field(11, event))
    for link_trace, link_span in links:
        link = _field(1, link_trace.to_bytes(16, "big")) + _field(2, link_span.to_bytes(8, "big"))
        parts.append(_field(13, link))
    if error is not None:
        status = _field(2, error.encode("utf-8", "replace")) + b"\x18" + _varint(STATUS_ERROR)
        parts.append(_field(15, status))
    return b"".join(parts)


def span_field(span: SpanRecord) -> bytes:
    """``span`` as one entry of a ``ScopeSpans.spans`` list."""
    return _field(2, encode_span(span))


def request_body(resource: bytes, scope: bytes, span_fields: Sequence[bytes]) -> bytes:
    """An ``ExportTraceServiceRequest`` of spans (each from ``span_field``), all of one
    resource and scope (``encode_resource``, ``encode_scope``)."""
    scope_spans = _field(1, scope) + b"".join(span_fields)
    return _field(1, _field(1, resource) + _field(2, scope_spans))


def encode_request(resource: bytes, scope: bytes, spans: Sequence[SpanRecord]) -> bytes:
    return request_body(resource, scope, [span_field(s) for s in spans])


def encode_resource(attributes: Mapping[str, Any]) -> bytes:
    return _attributes(1, attributes)


def encode_scope(name: str, version: str) -> bytes:
    return _field(1, name.encode()) + _field(2, version.encode())


# --- configuration -------------------------------------------------------------------------


def _setting(environ: Mapping[str, str], name: str) -> str:
    """``OTEL_EXPORTER_OTLP_TRACES_<name>``, else ``OTEL_EXPORTER_OTLP_<name>``, else ""."""
    for variable in (f"OTEL_EXPORTER_OTLP_TRACES_{name}", f"OTEL_EXPORTER_OTLP_{name}"):
        value = environ.get(variable, "").strip()
        if value:
            return value
    return ""


def parse_pairs(text: str) -> dict[str, str]:
    """``k=v,k2=v2`` (values URL-encoded), as OTLP headers and resource attributes are
    written; a piece without ``=`` is left out."""
    pairs = {}
    for piece in text.split(","):
        key, equals, value = piece.partition("=")
        if equals and key.strip():
            pairs[unquote(key.strip())] = unquote(value.strip())
    return pairs


def resource_attributes(environ: Mapping[str, str], version: str) -> dict[str, Any]:
    """The resource of Keel's spans: ``OTEL_RESOURCE_ATTRIBUTES``, the service name
    (``OTEL_SERVICE_NAME``, else ``keel``) and version."""
    attributes: dict[str, Any] = {
        "telemetry.sdk.name": "keel",
        "telemetry.sdk.language": "python",
        "service.name": "keel",
        "service.version": version,
    }
    attributes.update(parse_pairs(environ.get("OTEL_RESOURCE_ATTRIBUTES", "")))
    name = environ.get("OTEL_SERVICE_NAME", "").strip()
    if name:
        attributes["service.name"] = name
    return attributes


def _timeout(environ: Mapping[str, str]) -> float:
    text = _setting(environ, "TIMEOUT")
    try:
        seconds = float(text) if text else DEFAULT_TIMEOUT_S
    except ValueError:
        return DEFAULT_TIMEOUT_S
    return seconds if seconds > 0 else DEFAULT_TIMEOUT_S


# --- sending -------------------------------------------------------------------------------


class OtlpExporter:
    """Queues finished spans and sends them in batches to an OTLP/HTTP endpoint."""

    def __init__(
        self, endpoint: str, *, environ: Mapping[str, str] = os.environ, version: str = "0"
    ) -> None:
        self.endpoint = endpoint
        self._resource = encode_resource(resource_attributes(environ, version))
        self._scope = encode_scope("keel", version)
        self._timeout = _timeout(environ)
        self._gzip = _setting(environ, "COMPRESSION").lower() == "gzip"
        headers = {"Content-Type": "application/x-protobuf", **_headers(environ)}
        if self._gzip:
            headers["Content-Encoding"] = "gzip"
        certificate = _setting(environ, "CERTIFICATE")
        client_cert, client_key = (
            _setting(environ, "CLIENT_CERTIFICATE"),
            _setting(environ, "CLIENT_KEY"),
        )
        self._client = httpx.Client(
            headers=headers,
            timeout=self._timeout,
            verify=certificate or True,
            cert=(client_cert, client_key or None) if client_cert else None,  # type: ignore[arg-type]
        )
        self._queue: deque[bytes] = deque()  # spans encoded (span_field), to be sent
        self._wake = threading.Event()
        self._sending = threading.Lock()
        self.dropped = 0
        self.sent = 0
        self._thread = threading.Thread(target=self._work, name="keel-otlp", daemon=True)
        self._thread.start()
        atexit.register(self.flush)

    def export(self, span: SpanRecord) -> None:
        """Encode a finished span and queue it (dropped when ``MAX_QUEUE`` are waiting).

        It is encoded here, in the caller's thread: the sending thread then holds the
        interpreter only to join the bytes and post them, so it does not keep the
        driver waiting for the GIL after every store commit."""
        self.export_encoded(encode_span(span))

    def export_encoded(self, span: bytes) -> None:
        """Queue a span ``encode_span`` encoded (dropped when ``MAX_QUEUE`` are waiting)."""
        queued = self._queue
        if len(queued) >= MAX_QUEUE:
            self.dropped += 1
            return
        queued.append(_field(2, span))
        if len(queued) >= BATCH:
            self._wake.set()

    def flush(self) -> None:
        """Send everything queued now, in this thread (a failure is logged, not raised:
        it runs in ``Harness.close`` and at exit)."""
        try:
            self._send_queued()
        except Exception:
            LOG.warning("sending spans failed", exc_info=True)

    def _work(self) -> None:
        while True:
            woken = self._wake.wait(SCHEDULE_S)
            self._wake.clear()
            try:
                # Woken by a full batch: send full batches only, so a busy driver is not
                # chased by a stream of small requests; on the schedule, everything.
                self._send_queued(full_only=woken)
            except Exception:  # the thread outlives any one failure
                LOG.warning("sending spans failed", exc_info=True)

    def _send_queued(self, *, full_only: bool = False) -> None:
        with self._sending:
            queued = self._queue
            while len(queued) >= (BATCH if full_only else 1):
                batch = [queued.popleft() for _ in range(min(BATCH, len(queued)))]
                self._send(request_body(self._resource, self._scope, batch), len(batch))
            if self.dropped:
                LOG.warning(
                    "%d spans were dropped: more than %d were waiting", *(self.dropped, MAX_QUEUE)
                )
                self.dropped = 0

    def _send(self, body: bytes, count: int) -> None:
        content = gzip.compress(body, compresslevel=5) if self._gzip else body
        deadline = time.monotonic() + self._timeout
        wait = 1.0
        while True:
            problem: str
            try:
                answer = self._client.post(self.endpoint, content=content)
            except httpx.TransportError as exc:
                problem = f"{type(exc).__name__}: {exc}"
            else:
                if answer.status_code < 400:
                    self.sent += count
                    return
                problem = f"HTTP {answer.status_code}"
                if answer.status_code not in RETRY_STATUS:
                    break
            if time.monotonic() + wait > deadline:
                break
            time.sleep(wait)
            wait *= 2
        LOG.warning("%d spans were not sent to %s (%s)", count, self.endpoint, problem)


def _headers(environ: Mapping[str, str]) -> dict[str, str]:
    return parse_pairs(_setting(environ, "HEADERS"))


class OtlpWriter:
    """A ``SpanWriter`` (``keel.runtime.run_spans``) whose finished spans go to an
    ``OtlpExporter``."""

    def __init__(self, exporter: OtlpExporter) -> None:
        self.exporter = exporter

    def open(
        self,
        name: str,
        parent: Any,
        *,
        kind: str,
        attributes: dict[str, Any],
        start: int | None,
        links: Sequence[tuple[int, int]] = (),
        fixed: Mapping[str, Any] = NO_ATTRIBUTES,
    ) -> SpanRecord:
        ids = b""
        if parent is None:
            trace_id, parent_id = new_trace_id(), 0
        elif isinstance(parent, tuple):
            trace_id, parent_id = parent
        else:
            trace_id, parent_id = parent.trace_id, parent.span_id
            ids = parent.child_ids or _child_ids(parent)
        return SpanRecord(
            trace_id=trace_id,
            span_id=new_span_id(),
            parent_id=parent_id,
            ids=ids,
            name=name,
            kind=KIND_CLIENT if kind == "client" else KIND_INTERNAL,
            start=time.time_ns() if start is None else start,
            attributes=attributes,
            fixed=fixed,
            links=links,
        )

    def record(
        self,
        name: str,
        parent: SpanRecord,
        *,
        kind: str,
        fixed: Mapping[str, Any],
        attributes: dict[str, Any],
        start: int,
        end: int,
        error: str | None = None,
    ) -> None:
        """A span under ``parent`` (one this writer opened) that started and ended at
        the times given: encoded and queued at once, with no record made."""
        self.exporter.export_encoded(
            encode_span_of(
                parent.child_ids or _child_ids(parent),
                _getrandbits(64) or 1,
                name,
                KIND_CLIENT if kind == "client" else KIND_INTERNAL,
                start,
                end,
                fixed,
                attributes,
                error=error,
            )
        )

    def close(
        self,
        span: SpanRecord,
        end: int | None,
        *,
        attributes: dict[str, Any] | None = None,
        error: str | None = None,
    ) -> None:
        span.end = time.time_ns() if end is None else end
        if attributes:
            span.attributes.update(attributes)
        span.error = error
        self.exporter.export(span)

    def event(self, span: SpanRecord, name: str, attributes: dict[str, Any], at: int) -> None:
        span.events.append((at, name, attributes))

    def ids(self, span: SpanRecord) -> tuple[int, int]:
        return span.trace_id, span.span_id
