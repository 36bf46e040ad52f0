"""When tracing is on, and how stored events become spans (keel.runtime.tracing, run_spans).

No store and no loop: events are made here as a driver would store them, and fed to a
``RunTracer`` writing to the SDK's in-memory exporter.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keel.core.events import Event, EventType
from keel.core.state import RunState
from keel.runtime.tracing import Tracing, traces_endpoint, tracing_requested

ENDPOINT = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}


@pytest.mark.parametrize(
    ("environ", "on"),
    [
        ({}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "  "}, False),
        (ENDPOINT, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, True),
        ({**ENDPOINT, "OTEL_SDK_DISABLED": "TRUE"}, False),
        ({**ENDPOINT, "OTEL_SDK_DISABLED": "false"}, True),
        ({**ENDPOINT, "OTEL_TRACES_EXPORTER": "none"}, False),
        ({"OTEL_SERVICE_NAME": "keel", "OTEL_TRACES_EXPORTER": "otlp"}, False),  # no endpoint
    ],
)
def test_tracing_is_on_only_with_an_otlp_endpoint_and_the_sdk_not_disabled(
    environ: dict[str, str], on: bool
) -> None:
    assert tracing_requested(environ) is on
    assert (Tracing.from_environment(environ) is not None) is on


@pytest.mark.parametrize(
    ("environ", "endpoint"),
    [
        (ENDPOINT, "http://127.0.0.1:4318/v1/traces"),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "https://otel.example/base/"},
            "https://otel.example/base/v1/traces",
        ),
        (
            {**ENDPOINT, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/custom"},
            "http://collector:4318/custom",
        ),
    ],
)
def test_spans_go_to_the_traces_endpoint_or_the_base_endpoints_v1_traces(
    environ: dict[str, str], endpoint: str
) -> None:
    assert traces_endpoint(environ) == endpoint


pytest.importorskip("opentelemetry.sdk.trace", reason="the otel extra is not installed")

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (  # noqa: E402
    ExportTraceServiceRequest,
)
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)
from opentelemetry.trace import StatusCode  # noqa: E402

from keel.runtime.api_spans import ApiWriter  # noqa: E402
from keel.runtime.otlp_export import (  # noqa: E402
    KIND_CLIENT,
    SpanRecord,
    encode_request,
    encode_resource,
    encode_scope,
    parse_pairs,
    resource_attributes,
)
from keel.runtime.run_spans import RunTracer, model_names  # noqa: E402

T0 = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
RUN = "run_0123456789ab"


@pytest.mark.parametrize(
    ("spec", "names"),
    [
        ("deepseek:deepseek-chat", ("deepseek", "deepseek-chat")),
        ("openai:gpt-4o-mini", ("openai", "gpt-4o-mini")),
        ("scripted:/tmp/x/turns.json", ("scripted", "turns.json")),
        ("replay:cassettes/a.jsonl", ("replay", "a.jsonl")),
        ("bare-model", ("", "bare-model")),
    ],
)
def test_model_specs_name_the_provider_and_the_model(spec: str, names: tuple[str, str]) -> None:
    assert model_names(spec) == names


class Feed:
    """Events numbered as a store would, fed to a tracer as the driver does."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        provider = TracerProvider(shutdown_on_exit=False)
        provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.state = RunState(run_id=RUN, last_seq=1)
        writer = ApiWriter(provider.get_tracer("test"))
        self.tracer = RunTracer(writer, store=None, state=self.state)  # type: ignore[arg-type]
        self.seq = 1
        self.records = self.tracer.begin(self.state)

    def event(self, kind: EventType, at_s: float, **data: Any) -> None:
        self.seq += 1
        event = Event(
            run_id=RUN,
            seq=self.seq,
            event_id=f"e{self.seq}",
            type=kind,
            recorded_at=T0 + timedelta(seconds=at_s),
            data=data,
        )
        self.tracer.observe(event, self.state)

    def spans(self) -> dict[str, Any]:
        return {s.name: s for s in self.exporter.get_finished_spans()}


def ns(at_s: float) -> int:
    return int((T0 + timedelta(seconds=at_s)).timestamp() * 1e9)


def test_a_read_stored_with_the_next_step_keeps_its_own_time() -> None:
    feed = Feed()
    # Step 1's turn and read were deferred: both are stored at t=10 with the next commit.
    feed.event(EventType.MODEL_REQUESTED, 10.0, step=1, model="openai:gpt-4o")
    feed.event(EventType.MODEL_RESPONDED, 10.0, step=1, elapsed_s=4.0, usage={}, cost=0.0)
    feed.event(EventType.TOOL_FINISHED, 10.0, call_id="c1", tool="read_file", elapsed_s=0.5)
    feed.tracer.end(feed.state)
    spans = feed.spans()
    chat, read = spans["chat gpt-4o"], spans["execute_tool read_file"]
    assert (chat.start_time, chat.end_time) == (ns(6.0), ns(10.0))
    assert (read.start_time, read.end_time) == (ns(9.5), ns(10.0))
    assert spans["keel.step"].start_time == ns(6.0)


def test_a_step_ends_where_the_next_one_starts() -> None:
    feed = Feed()
    for step, at in ((1, 2.0), (2, 5.0)):
        feed.event(EventType.MODEL_REQUESTED, at, step=step, model="openai:gpt-4o")
        feed.event(EventType.MODEL_RESPONDED, at, step=step, elapsed_s=1.0, usage={})
    feed.tracer.end(feed.state)
    first, second = sorted(
        (s for s in feed.exporter.get_finished_spans() if s.name == "keel.step"),
        key=lambda s: s.start_time or 0,
    )
    assert (first.start_time, first.end_time) == (ns(1.0), ns(4.0))
    assert second.start_time == ns(4.0)


def test_a_call_finished_on_resume_gets_a_step_and_a_call_with_no_time_is_an_instant() -> None:
    feed = Feed()
    feed.state = RunState(run_id=RUN, last_seq=1, usage=feed.state.usage.add(steps=3))
    feed.event(EventType.TOOL_FINISHED, 7.0, call_id="c9", tool="write_file")  # reconciled
    feed.tracer.end(feed.state)
    spans = feed.spans()
    write = spans["execute_tool write_file"]
    assert write.start_time == write.end_time == ns(7.0)
    assert spans["keel.step"].attributes == {"keel.step": 3}
    assert write.parent is not None and write.parent.span_id == spans["keel.step"].context.span_id


def test_a_failed_call_is_an_error_with_its_kind_and_message() -> None:
    feed = Feed()
    feed.event(EventType.TOOL_STARTED, 1.0, call_id="c1", tool="run_command", effect="execute")
    feed.event(
        EventType.TOOL_FAILED,
        3.0,
        call_id="c1",
        tool="run_command",
        error_kind="timeout",
        message="x" * 500,
    )
    feed.tracer.end(feed.state)
    span = feed.spans()["execute_tool run_command"]
    assert span.start_time == ns(1.0)  # no elapsed_s: from its tool_started
    assert span.status.status_code is StatusCode.ERROR
    assert len(span.status.description or "") == 200
    assert span.attributes is not None
    assert span.attributes["error.type"] == "timeout"
    assert span.attributes["keel.tool.effect"] == "execute"


def test_an_event_tracing_cannot_read_stops_tracing_the_run_not_the_run() -> None:
    feed = Feed()
    feed.event(EventType.MODEL_RESPONDED, 1.0, step="one", elapsed_s=0.1, usage=["bad"])
    feed.event(EventType.TOOL_FINISHED, 2.0, call_id="c1", tool="read_file", elapsed_s=0.1)
    feed.tracer.end(feed.state)
    names = sorted(s.name for s in feed.exporter.get_finished_spans())
    assert "invoke_agent keel" in names
    assert "execute_tool read_file" not in names  # tracing of this run stopped


def test_the_trace_record_names_the_run_span() -> None:
    feed = Feed()
    (record,) = feed.records
    feed.tracer.end(feed.state)
    run = feed.spans()["invoke_agent keel"]
    assert record.type is EventType.TRACE_STARTED
    assert record.data == {
        "trace_id": f"{run.context.trace_id:032x}",
        "span_id": f"{run.context.span_id:016x}",
    }


# --- Keel's OTLP encoder, read back with opentelemetry-proto --------------------------------


def test_the_otlp_encoding_reads_back_as_the_same_span() -> None:
    span = SpanRecord(
        trace_id=0x0123456789ABCDEF0123456789ABCDEF,
        span_id=0x1122334455667788,
        parent_id=0x0102030405060708,
        name="chat deepseek-chat",
        kind=KIND_CLIENT,
        start=1_700_000_000_000_000_001,
        end=1_700_000_000_500_000_002,
        attributes={
            "gen_ai.request.model": "deepseek-chat",
            "gen_ai.usage.input_tokens": 120,
            "keel.delta": -3,
            "keel.cost_usd": 0.0125,
            "keel.resumed": True,
            "gen_ai.response.finish_reasons": ("stop", "length"),
            "keel.text": "naïve ✓",
        },
        events=[(1_700_000_000_100_000_000, "keel.retry", {"keel.retry.attempt": 2})],
        links=[(0xABC, 0xDEF)],
        error="the provider declined",
    )
    body = encode_request(
        encode_resource({"service.name": "keel"}), encode_scope("keel", "1.2"), [span, span]
    )
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    (resource_spans,) = request.resource_spans
    assert [(a.key, a.value.string_value) for a in resource_spans.resource.attributes] == [
        ("service.name", "keel")
    ]
    (scope_spans,) = resource_spans.scope_spans
    assert (scope_spans.scope.name, scope_spans.scope.version) == ("keel", "1.2")
    assert len(scope_spans.spans) == 2
    got = scope_spans.spans[0]
    assert got.trace_id == span.trace_id.to_bytes(16, "big")
    assert got.span_id == span.span_id.to_bytes(8, "big")
    assert got.parent_span_id == span.parent_id.to_bytes(8, "big")
    assert got.name == "chat deepseek-chat"
    assert got.kind == 3  # SPAN_KIND_CLIENT
    assert (got.start_time_unix_nano, got.end_time_unix_nano) == (span.start, span.end)
    values = {a.key: a.value for a in got.attributes}
    assert values["gen_ai.request.model"].string_value == "deepseek-chat"
    assert values["gen_ai.usage.input_tokens"].int_value == 120
    assert values["keel.delta"].int_value == -3
    assert values["keel.cost_usd"].double_value == 0.0125
    assert values["keel.resumed"].bool_value is True
    finish = values["gen_ai.response.finish_reasons"].array_value.values
    assert [v.string_value for v in finish] == ["stop", "length"]
    assert values["keel.text"].string_value == "naïve ✓"
    (event,) = got.events
    assert (event.time_unix_nano, event.name) == (1_700_000_000_100_000_000, "keel.retry")
    assert event.attributes[0].value.int_value == 2
    (link,) = got.links
    assert (int.from_bytes(link.trace_id, "big"), int.from_bytes(link.span_id, "big")) == (
        0xABC,
        0xDEF,
    )
    assert got.status.code == 2 and got.status.message == "the provider declined"
    assert scope_spans.spans[1] == got


def _decoded(value: Any) -> Any:
    """An ``AnyValue`` as the Python value it was made from (arrays as tuples)."""
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return tuple(_decoded(v) for v in value.array_value.values)
    return getattr(value, kind)


def _typed(value: Any) -> Any:
    """``value`` with the type of each part beside it: True and 1 compare unequal."""
    if isinstance(value, tuple):
        return tuple(_typed(v) for v in value)
    return (type(value), value)


ATTRIBUTE_VALUES = (
    st.text()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False)
    | st.tuples(st.text())
    | st.lists(st.text() | st.integers(0, 2**40) | st.booleans(), max_size=3).map(tuple)
)


@settings(max_examples=300, deadline=None)
@given(
    attributes=st.dictionaries(st.text(min_size=1, max_size=140), ATTRIBUTE_VALUES, max_size=6),
    again=st.dictionaries(st.sampled_from(["a", "b", "gen_ai.tool.call.id"]), ATTRIBUTE_VALUES),
    start=st.integers(0, 2**64 - 1),
    name=st.text(max_size=200),
)
def test_any_attributes_encode_and_read_back_as_themselves(
    attributes: dict[str, Any], again: dict[str, Any], start: int, name: str
) -> None:
    # Numbers of every size and sign, long keys (a length of two bytes), text, flags,
    # arrays; and values met again after they were kept encoded (``again`` repeats a
    # few keys): True is not 1, (1,) is not ("1",), a kept value is not another's.
    spans = [
        SpanRecord(trace_id=7, span_id=i + 1, name=name, start=start, end=start, attributes=values)
        for i, values in enumerate([attributes, again, again, {**again, **attributes}])
    ]
    request = ExportTraceServiceRequest()
    request.ParseFromString(encode_request(b"", b"", spans))
    got = request.resource_spans[0].scope_spans[0].spans
    assert [s.name for s in got] == [name] * 4
    assert got[0].start_time_unix_nano == start
    for span, sent in zip(got, spans, strict=True):
        decoded = {a.key: _typed(_decoded(a.value)) for a in span.attributes}
        assert decoded == {k: _typed(v) for k, v in sent.attributes.items()}


def test_text_no_utf8_can_hold_and_a_huge_value_encode_without_failing_the_span() -> None:
    # A model names tools and models: a lone surrogate (no UTF-8 form) is sent replaced,
    # and a megabyte value whole (a length of three bytes); the span still decodes.
    huge = "x" * 1_000_000
    span = SpanRecord(
        trace_id=1,
        span_id=2,
        name="execute_tool bad\udc80name",
        attributes={"gen_ai.tool.name": "bad\udc80name", "keel.text": huge},
    )
    request = ExportTraceServiceRequest()
    request.ParseFromString(encode_request(b"", b"", [span]))
    (got,) = request.resource_spans[0].scope_spans[0].spans
    assert got.name == "execute_tool bad?name"
    values = {a.key: a.value.string_value for a in got.attributes}
    assert values == {"gen_ai.tool.name": "bad?name", "keel.text": huge}


def test_headers_and_resource_attributes_are_read_as_otlp_writes_them() -> None:
    assert parse_pairs("api-key=a%20b, x-tenant=t1,broken,=nokey") == {
        "api-key": "a b",
        "x-tenant": "t1",
    }
    environ = {"OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=ci,service.name=a"}
    assert resource_attributes(environ, "1")["service.name"] == "a"
    assert resource_attributes(environ, "1")["deployment.environment"] == "ci"
    assert resource_attributes({**environ, "OTEL_SERVICE_NAME": "b"}, "1")["service.name"] == "b"
    assert resource_attributes({}, "1")["service.name"] == "keel"


def test_a_tracer_that_cannot_read_the_log_leaves_the_drive_untraced() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    state = RunState(run_id=RUN, last_seq=5)  # a resume: the log is read, and fails here
    tracer = RunTracer(ApiWriter(provider.get_tracer("test")), store=None, state=state)  # type: ignore[arg-type]
    assert tracer.begin(state) == []
    event = Event(
        run_id=RUN,
        seq=6,
        event_id="e6",
        type=EventType.TOOL_FINISHED,
        recorded_at=T0,
        data={"call_id": "c1", "tool": "read_file"},
    )
    tracer.observe(event, state)
    tracer.end(state)
    assert exporter.get_finished_spans() == ()
