"""OpenTelemetry traces of real runs (keel.runtime.run_spans, keel.runtime.tracing).

In process, the spans go to the SDK's in-memory exporter through ``Harness(tracer_provider=)``;
`keel run` in a subprocess exports them with Keel's own OTLP/HTTP exporter to a receiver
on loopback, which decodes what arrives with opentelemetry-proto. Only the model's turns
are scripted; the store is a SQLite file.
"""

from __future__ import annotations

import gzip
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk.trace", reason="the otel extra is not installed")

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
)
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)
from opentelemetry.trace import StatusCode, format_span_id, format_trace_id

from keel.core.errors import ConfigError
from keel.core.events import Event, EventType
from keel.core.status import RunStatus
from keel.runtime.harness import Harness
from keel.runtime.otlp_export import OtlpExporter, OtlpWriter
from keel.store.url import open_store
from keel.testing import ScriptedModel
from keel.testing.agents import write_agent

KEEL = str(Path(sys.executable).with_name("keel"))
TIMEOUT_S = 60


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "arguments": arguments}


def turn(*calls: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"tool_calls": list(calls), **extra}


# read (ok) -> write -> read a missing file (fails) -> final answer, verified.
SCRIPT = [
    turn(
        call("read_file", path="a.txt"),
        usage={"input_tokens": 120, "output_tokens": 30, "cached_input_tokens": 100},
        cost=0.0125,
    ),
    turn(call("write_file", path="b.txt", content="bye\n"), usage={"input_tokens": 200}),
    turn(call("read_file", path="missing.txt")),
    {"content": "b.txt says bye", "usage": {"input_tokens": 300, "output_tokens": 5}},
]
WRITE_SCRIPT = [
    turn(call("write_file", path="a.txt", content="bye\n")),
    turn(call("request_completion", summary="a.txt says bye")),
]


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    (root / "a.txt").write_text("hello\n")
    return root


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/keel.db"


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> Iterator[TracerProvider]:
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider
    provider.shutdown()


def by_name(spans: Any, name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]


def one(spans: Any, name: str) -> ReadableSpan:
    (span,) = by_name(spans, name)
    return span


def parent_of(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def trace_records(events: list[Event]) -> list[dict[str, Any]]:
    return [e.data for e in events if e.type is EventType.TRACE_STARTED]


# --- in process: the in-memory exporter ----------------------------------------------------


def test_a_run_is_a_tree_of_step_model_and_tool_spans_with_genai_attributes(
    workspace: Path, store_url: str, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    with Harness(store=store_url, model=ScriptedModel(SCRIPT), tracer_provider=provider) as h:
        outcome = h.run("say bye in b.txt", cwd=workspace, verify=["grep -q bye b.txt"])
        events = list(h.events(outcome.id))
    assert outcome.status is RunStatus.COMPLETED
    spans = exporter.get_finished_spans()

    run = one(spans, "invoke_agent keel")
    assert run.parent is None
    assert run.attributes is not None
    assert run.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert run.attributes["keel.run_id"] == outcome.id
    assert run.attributes["gen_ai.conversation.id"] == outcome.id
    assert run.attributes["keel.status"] == "completed"
    assert run.attributes["keel.stop_reason"] == "verified"
    assert run.attributes["keel.steps"] == 4
    assert run.attributes["keel.cost_usd"] == pytest.approx(0.0125)
    assert run.attributes["gen_ai.usage.input_tokens"] == 620
    assert run.status.status_code is StatusCode.UNSET
    # The ids on the log are the run span's.
    (record,) = trace_records(events)
    assert record == {
        "trace_id": format_trace_id(run.context.trace_id),
        "span_id": format_span_id(run.context.span_id),
    }
    assert {s.context.trace_id for s in spans} == {run.context.trace_id}

    steps = sorted(by_name(spans, "keel.step"), key=lambda s: s.start_time or 0)
    assert [s.attributes["keel.step"] for s in steps if s.attributes] == [1, 2, 3, 4]
    assert all(parent_of(s) == run.context.span_id for s in steps)
    chats = by_name(spans, "chat inline")
    assert [parent_of(c) for c in chats] == [s.context.span_id for s in steps]
    first = chats[0].attributes
    assert first is not None
    assert first["gen_ai.operation.name"] == "chat"
    assert first["gen_ai.provider.name"] == "scripted"
    assert first["gen_ai.request.model"] == "inline"
    assert first["gen_ai.usage.input_tokens"] == 120
    assert first["gen_ai.usage.output_tokens"] == 30
    assert first["gen_ai.usage.cache_read.input_tokens"] == 100
    assert first["keel.cost_usd"] == pytest.approx(0.0125)

    reads = by_name(spans, "execute_tool read_file")
    (write,) = by_name(spans, "execute_tool write_file")
    assert [parent_of(r) for r in reads] == [steps[0].context.span_id, steps[2].context.span_id]
    assert parent_of(write) == steps[1].context.span_id
    assert write.attributes is not None
    assert write.attributes["gen_ai.operation.name"] == "execute_tool"
    assert write.attributes["gen_ai.tool.name"] == "write_file"
    assert write.attributes["gen_ai.tool.call.id"] == "call_1_0"
    assert write.attributes["keel.tool.effect"] == "write"
    assert write.status.status_code is StatusCode.UNSET
    ok, failed = reads
    assert ok.status.status_code is StatusCode.UNSET
    assert failed.status.status_code is StatusCode.ERROR
    assert failed.attributes is not None and failed.attributes["error.type"]
    assert "missing.txt" in (failed.status.description or "")

    verify = one(spans, "keel.verify")
    assert parent_of(verify) == steps[3].context.span_id  # the step whose answer asked
    assert verify.attributes is not None and verify.attributes["keel.verify.passed"] is True
    # Children lie within their parents, steps one after another.
    for child in [*chats, *reads, write, verify]:
        parent = next(s for s in spans if s.context.span_id == parent_of(child))
        assert parent.start_time is not None and child.start_time is not None
        assert parent.start_time <= child.start_time
        assert child.end_time is not None and parent.end_time is not None
        assert child.end_time <= parent.end_time
    for earlier, later in itertools.pairwise(steps):
        assert earlier.end_time is not None and later.start_time is not None
        assert earlier.end_time <= later.start_time


def test_a_failed_verification_is_an_error_span_and_the_next_step_follows(
    workspace: Path, store_url: str, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    script = [
        {"content": "done already"},
        turn(call("write_file", path="b.txt", content="bye\n")),
        {"content": "now b.txt exists"},
    ]
    with Harness(store=store_url, model=ScriptedModel(script), tracer_provider=provider) as h:
        outcome = h.run("write b.txt", cwd=workspace, verify=["test -f b.txt"])
    assert outcome.status is RunStatus.COMPLETED
    spans = exporter.get_finished_spans()
    failed, passed = sorted(by_name(spans, "keel.verify"), key=lambda s: s.start_time or 0)
    assert failed.status.status_code is StatusCode.ERROR
    assert failed.attributes is not None and failed.attributes["keel.verify.passed"] is False
    assert passed.attributes is not None and passed.attributes["keel.verify.passed"] is True
    steps = {s.context.span_id: s for s in by_name(spans, "keel.step")}
    assert steps[parent_of(failed) or 0].attributes == {"keel.step": 1}
    assert steps[parent_of(passed) or 0].attributes == {"keel.step": 3}


def test_a_wait_for_approval_is_a_span_of_the_resumed_trace_linked_to_the_one_that_asked(
    workspace: Path, store_url: str, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    with Harness(store=store_url, model=ScriptedModel(WRITE_SCRIPT), tracer_provider=provider) as h:
        waiting = h.run("say bye", cwd=workspace, mode="ask")
        assert waiting.status is RunStatus.WAITING
        h.approve(waiting.id, by="ada")
        done = h.resume(waiting.id)
        events = list(h.events(waiting.id))
    assert done.status is RunStatus.COMPLETED
    spans = exporter.get_finished_spans()
    asked, resumed = sorted(by_name(spans, "invoke_agent keel"), key=lambda s: s.start_time or 0)
    assert asked.attributes is not None and asked.attributes["keel.status"] == "waiting"
    assert resumed.context.trace_id != asked.context.trace_id
    assert [link.context.span_id for link in resumed.links] == [asked.context.span_id]
    assert resumed.attributes is not None and resumed.attributes["keel.resumed"] is True
    assert [r["trace_id"] for r in trace_records(events)] == [
        format_trace_id(asked.context.trace_id),
        format_trace_id(resumed.context.trace_id),
    ]

    wait = one(spans, "keel.wait")
    assert wait.context.trace_id == resumed.context.trace_id
    assert parent_of(wait) == resumed.context.span_id
    assert [link.context.span_id for link in wait.links] == [asked.context.span_id]
    assert wait.attributes is not None
    assert wait.attributes["keel.wait.kind"] == "approval"
    assert wait.attributes["keel.wait.answer"] == "approval_granted"
    assert wait.attributes["keel.wait.by"] == "ada"
    assert wait.attributes["gen_ai.tool.name"] == "write_file"
    requested = next(e for e in events if e.type is EventType.APPROVAL_REQUESTED)
    granted = next(e for e in events if e.type is EventType.APPROVAL_GRANTED)
    assert wait.start_time == pytest.approx(requested.recorded_at.timestamp() * 1e9, abs=1e3)
    assert wait.end_time == pytest.approx(granted.recorded_at.timestamp() * 1e9, abs=1e3)
    # The approved call runs in the resumed drive, under a step of its own trace.
    (write,) = by_name(spans, "execute_tool write_file")
    assert write.context.trace_id == resumed.context.trace_id


def test_a_child_driven_in_the_same_process_is_inside_its_parents_trace(
    workspace: Path, store_url: str, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    helper = [turn(call("request_completion", summary="hi"))]
    write_agent(workspace, "helper", script=helper, tools=["read_file"])
    script = [
        turn(call("agent_spawn", agent="helper", task="say hi")),
        turn(call("request_completion", summary="the helper said hi")),
    ]
    with Harness(store=store_url, model=ScriptedModel(script), tracer_provider=provider) as h:
        outcome = h.run("get a hi", cwd=workspace)
    assert outcome.status is RunStatus.COMPLETED, outcome.stop_reason
    spans = exporter.get_finished_spans()
    parent = one(spans, "invoke_agent keel")
    child = one(spans, "invoke_agent helper")
    assert child.context.trace_id == parent.context.trace_id
    assert parent_of(child) == parent.context.span_id
    assert child.attributes is not None
    assert child.attributes["keel.parent_run_id"] == outcome.id
    assert child.attributes["gen_ai.agent.name"] == "helper"


def test_a_resumed_run_links_to_the_trace_of_the_process_that_was_killed(
    tmp_path: Path, workspace: Path, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    with OtlpReceiver() as receiver:
        store_url, run_id = killed_run(tmp_path, workspace, receiver.endpoint)
    with open_store(store_url) as store:
        (record,) = trace_records(store.read_events(run_id))
        wait_lease_expired(store, run_id)

    with Harness(store=store_url, tracer_provider=provider) as h:
        done = h.resume(run_id)
    assert done.status is RunStatus.COMPLETED
    spans = exporter.get_finished_spans()
    run = one(spans, "invoke_agent keel")
    assert [(format_trace_id(link.context.trace_id), format_span_id(link.context.span_id))
            for link in run.links] == [(record["trace_id"], record["span_id"])]  # fmt: skip
    assert run.attributes is not None and run.attributes["keel.resumed"] is True
    # The interrupted write is reconciled and run again here, in a step of this trace.
    (write,) = by_name(spans, "execute_tool write_file")
    assert write.attributes is not None and write.attributes["gen_ai.tool.call.id"] == "call_0_0"
    step = next(s for s in spans if s.context.span_id == parent_of(write))
    assert step.name == "keel.step" and parent_of(step) == run.context.span_id


# --- keel run in a subprocess: OTLP/HTTP to a loopback receiver ----------------------------


class OtlpReceiver:
    """A collector's OTLP/HTTP trace endpoint on 127.0.0.1: decodes every POST /v1/traces."""

    def __init__(self, *, unavailable: int = 0) -> None:
        """``unavailable``: how many requests are answered 503 before the first 200."""
        self.requests: list[ExportTraceServiceRequest] = []
        self.paths: list[str] = []
        self.headers: list[dict[str, str]] = []
        self.unavailable = unavailable
        received = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                received.headers.append(dict(self.headers))
                if received.unavailable:
                    received.unavailable -= 1
                    self.send_response(503)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                received.paths.append(self.path)
                received.requests.append(request)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> OtlpReceiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def spans(self) -> list[tuple[dict[str, Any], Any]]:
        """Every span received, with its resource's attributes."""
        found = []
        for request in self.requests:
            for resource_spans in request.resource_spans:
                resource = {a.key: value_of(a.value) for a in resource_spans.resource.attributes}
                for scope in resource_spans.scope_spans:
                    found += [(resource, span) for span in scope.spans]
        return found


def value_of(value: Any) -> Any:
    return getattr(value, value.WhichOneof("value"))


def attributes_of(span: Any) -> dict[str, Any]:
    return {a.key: value_of(a.value) for a in span.attributes}


def keel(
    root: Path, store_url: str, *args: str, endpoint: str | None, fault: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KEEL_LEASE_TTL": "1"}
    if endpoint is not None:
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = endpoint
    if fault is not None:
        env["KEEL_FAULT"] = fault
    return subprocess.run(
        [KEEL, *args, "--store", store_url],
        cwd=root,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )


def killed_run(tmp_path: Path, workspace: Path, endpoint: str) -> tuple[str, str]:
    """`keel run` (traced) SIGKILLed after its write's tool_started; (store URL, run id)."""
    script = tmp_path / "write.json"
    script.write_text(json.dumps(WRITE_SCRIPT))
    store_url = f"sqlite:///{tmp_path / 'killed.db'}"
    proc = keel(
        workspace,
        store_url,
        "run",
        "say bye",
        "--model",
        f"scripted:{script}",
        "--json",
        endpoint=endpoint,
        fault="after_tool_started:1",
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    return store_url, str(json.loads(proc.stdout.splitlines()[0])["run_id"])


def wait_lease_expired(store: Any, run_id: str) -> None:
    deadline = time.monotonic() + 10
    while store.current_run_lease(run_id) is not None:
        assert time.monotonic() < deadline, "the dead process's lease never expired"
        time.sleep(0.05)


def test_keel_run_exports_its_spans_over_otlp_http_to_the_endpoint(
    tmp_path: Path, workspace: Path
) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    store_url = f"sqlite:///{tmp_path / 'keel.db'}"
    with OtlpReceiver() as receiver:
        proc = keel(
            workspace,
            store_url,
            "run",
            "say bye in b.txt",
            "--model",
            f"scripted:{script}",
            "--verify",
            "grep -q bye b.txt",
            "--json",
            endpoint=receiver.endpoint,
        )
    assert proc.returncode == 0, proc.stderr
    run_id = str(json.loads(proc.stdout.splitlines()[0])["run_id"])
    assert receiver.paths and set(receiver.paths) == {"/v1/traces"}
    received = receiver.spans()
    names = sorted(span.name for _, span in received)
    assert names == sorted(
        ["invoke_agent keel", "keel.verify"]
        + ["keel.step"] * 4
        + ["chat script.json"] * 4
        + ["execute_tool read_file"] * 2
        + ["execute_tool write_file"]
    )
    resource = received[0][0]
    assert resource["service.name"] == "keel"
    spans = {span.span_id: span for _, span in received}
    run = next(s for s in spans.values() if s.name == "invoke_agent keel")
    assert run.parent_span_id == b""
    assert attributes_of(run)["keel.run_id"] == run_id
    with open_store(store_url) as store:
        (record,) = trace_records(store.read_events(run_id))
    assert record == {"trace_id": run.trace_id.hex(), "span_id": run.span_id.hex()}
    for span in spans.values():
        assert span.trace_id == run.trace_id
        if span.name.startswith(("chat", "execute_tool")):
            assert spans[span.parent_span_id].name == "keel.step"
    write = next(s for s in spans.values() if s.name == "execute_tool write_file")
    assert attributes_of(write)["gen_ai.tool.call.id"] == "call_1_0"
    chat = next(s for s in spans.values() if s.name == "chat script.json")
    assert attributes_of(chat)["gen_ai.usage.input_tokens"] in (120, 200, 0, 300)


def test_the_resumed_process_exports_a_trace_linked_to_the_killed_ones(
    tmp_path: Path, workspace: Path
) -> None:
    with OtlpReceiver() as receiver:
        store_url, run_id = killed_run(tmp_path, workspace, receiver.endpoint)
        with open_store(store_url) as store:
            (killed,) = trace_records(store.read_events(run_id))
            wait_lease_expired(store, run_id)
        proc = keel(workspace, store_url, "resume", run_id, endpoint=receiver.endpoint)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    received = [span for _, span in receiver.spans()]
    (run,) = [s for s in received if s.name == "invoke_agent keel"]  # the killed one never ended
    assert [(link.trace_id.hex(), link.span_id.hex()) for link in run.links] == [
        (killed["trace_id"], killed["span_id"])
    ]
    assert run.trace_id.hex() != killed["trace_id"]
    assert any(s.name == "execute_tool write_file" for s in received)


# --- off: nothing made ---------------------------------------------------------------------


def test_with_no_otlp_endpoint_no_tracer_is_made_and_the_log_has_no_trace_record(
    workspace: Path, store_url: str
) -> None:
    with Harness(store=store_url, model=ScriptedModel(WRITE_SCRIPT)) as h:
        assert h.tracing is None
        outcome = h.run("say bye", cwd=workspace)
        events = list(h.events(outcome.id))
    assert outcome.status is RunStatus.COMPLETED
    assert not trace_records(events)


CHECK_NOTHING_TRACED = """
import sys, threading
from keel.runtime.harness import Harness
from keel.testing import ScriptedModel
turns = [{"tool_calls": [{"name": "read_file", "arguments": {"path": "a.txt"}}]},
         {"content": "read"}]
with Harness(store="sqlite:///keel.db", model=ScriptedModel(turns)) as h:
    outcome = h.run("read a.txt", cwd=".")
assert outcome.status.value == "completed", outcome.stop_reason
loaded = [m for m in sys.modules if m.startswith("opentelemetry")]
threads = [t.name for t in threading.enumerate() if t.name.startswith("keel-otlp")]
print(",".join(sorted(loaded + threads)) or "none")
"""


def test_a_whole_run_without_an_endpoint_makes_no_exporter_and_loads_no_opentelemetry(
    workspace: Path,
) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", CHECK_NOTHING_TRACED],
        cwd=workspace,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "none"


WITHOUT_OPENTELEMETRY = """
import sys
class NoOpenTelemetry:
    def find_spec(self, name, path=None, target=None):
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            raise ImportError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, NoOpenTelemetry())
from keel.runtime.harness import Harness
from keel.testing import ScriptedModel
turns = [{"content": "nothing to do"}]
with Harness(store="sqlite:///keel.db", model=ScriptedModel(turns)) as h:
    outcome = h.run("nothing", cwd=".")
    traced = [e for e in h.events(outcome.id) if e.type.value == "trace_started"]
print(outcome.status.value, len(traced))
"""


@pytest.mark.parametrize("disabled", [False, True])
def test_without_opentelemetry_installed_keel_still_exports_its_spans(
    workspace: Path, disabled: bool
) -> None:
    with OtlpReceiver() as receiver:
        environment = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint}
        if disabled:
            environment["OTEL_SDK_DISABLED"] = "true"
        proc = subprocess.run(
            [sys.executable, "-c", WITHOUT_OPENTELEMETRY],
            cwd=workspace,
            env={**os.environ, **environment},
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            check=False,
        )
    assert proc.returncode == 0, proc.stderr
    names = sorted(span.name for _, span in receiver.spans())
    if disabled:
        assert proc.stdout.split() == ["completed", "0"]
        assert names == []
    else:
        assert proc.stdout.split() == ["completed", "1"]
        assert names == ["chat inline", "invoke_agent keel", "keel.step", "keel.verify"]


def test_a_grpc_protocol_is_refused_before_the_run_is_driven(
    workspace: Path, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    with Harness(store=store_url, model=ScriptedModel(WRITE_SCRIPT)) as h:
        state = h.create("say bye", cwd=workspace)
        with pytest.raises(ConfigError, match="OTLP/HTTP only"):
            h.execute(state.run_id)
        after = h.get(state.run_id)
    assert after.last_seq == state.last_seq  # nothing was written
    assert (workspace / "a.txt").read_text() == "hello\n"


def test_the_exporter_sends_headers_gzip_and_retries_an_unavailable_collector() -> None:
    environ = {
        "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer%20t0ken,x-tenant=keel",
        "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION": "gzip",
        "OTEL_SERVICE_NAME": "agents",
    }
    with OtlpReceiver(unavailable=1) as receiver:
        exporter = OtlpExporter(f"{receiver.endpoint}/v1/traces", environ=environ)
        writer = OtlpWriter(exporter)
        run = writer.open("invoke_agent keel", None, kind="internal", attributes={}, start=1)
        step = writer.open("keel.step", run, kind="internal", attributes={"keel.step": 1}, start=2)
        writer.close(step, 3)
        writer.close(run, 4, attributes={"keel.status": "completed"})
        exporter.flush()
    assert len(receiver.headers) == 2  # a 503, then the same spans again
    sent = receiver.headers[-1]
    assert sent["authorization"] == "Bearer t0ken" and sent["x-tenant"] == "keel"
    assert sent["Content-Encoding"] == "gzip"
    assert sent["Content-Type"] == "application/x-protobuf"
    spans = receiver.spans()
    assert sorted(span.name for _, span in spans) == ["invoke_agent keel", "keel.step"]
    assert spans[0][0]["service.name"] == "agents"
    by_name = {span.name: span for _, span in spans}
    assert by_name["keel.step"].parent_span_id == by_name["invoke_agent keel"].span_id
    assert exporter.sent == 2
