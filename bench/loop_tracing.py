"""What tracing adds to a durable step: OTLP/HTTP export on against off (bench/loop.py).

On: ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set, so the harness traces as ``keel run`` does —
Keel's OTLP/HTTP exporter, batching in its own thread (keel.runtime.otlp_export), sending
to a receiver in another process on loopback (it keeps the bodies and decodes them only
when asked how many spans came: nothing is dropped). Off: no variable, so no provider
and no run tracer are made. Runs on and off alternate (ABAB...) so drift on a shared
machine hits both alike; each timed run includes sending what is still queued at its
end. The report gives each side's median and best ms per step by the wall clock, by the
process's CPU time (the export thread's included) and by the driving thread's CPU time
alone, the added microseconds per step (difference of medians, of bests, and the median
of each on run's difference from the off run before it), and the export thread's own CPU
time per step.

A whole step costs about 0.5 ms and varies run to run by ±50 us, as much as the target,
so the report also times the tracer alone (``tracer_only``): a real step's three stored
events (model_requested, model_responded, tool_finished) fed to a ``RunTracer`` 20,000
times with distinct step numbers — the step, chat and tool spans — no store or model:
``make_cpu_us_per_step`` is what the driver's thread spends making the spans,
``send_cpu_us_per_step`` the encoding and sending (flushed every 100 steps, in this
thread, so nothing else is counted and no span is dropped).

    .venv/bin/python bench/loop_tracing.py [--steps 1000] [--repeat 7]
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from loop import StepModel, bench_registry  # bench/loop.py, beside this script

from keel.core.budget import Budget
from keel.core.events import EventType
from keel.runtime import tracing as tracing_module
from keel.runtime.harness import Harness
from keel.runtime.tracing import Tracing, process_exporter

ENDPOINT_VARIABLE = "OTEL_EXPORTER_OTLP_ENDPOINT"
CHUNK = 100  # tracer-only steps between flushes (300 spans: the queue holds 2,048)

RECEIVER = r"""
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

bodies = []


class Receiver(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as a collector would

    def do_POST(self):
        bodies.append(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self):
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )

        spans = 0
        for body in bodies:
            request = ExportTraceServiceRequest()
            request.ParseFromString(body)
            spans += sum(len(s.spans) for r in request.resource_spans for s in r.scope_spans)
        text = str(spans).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(text)))
        self.end_headers()
        self.wfile.write(text)

    def log_message(self, *args):
        pass


server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
print(server.server_address[1], flush=True)
server.serve_forever()
"""


@contextmanager
def loopback_receiver() -> Iterator[str]:
    """An OTLP/HTTP receiver in its own process; its endpoint (``http://127.0.0.1:PORT``)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", RECEIVER], stdout=subprocess.PIPE, text=True, bufsize=1
    )
    try:
        assert proc.stdout is not None
        yield f"http://127.0.0.1:{int(proc.stdout.readline())}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def spans_received(endpoint: str) -> int:
    with urllib.request.urlopen(endpoint, timeout=30) as answer:
        return int(answer.read())


def tracing_on(endpoint: str | None) -> None:
    if endpoint is None:
        os.environ.pop(ENDPOINT_VARIABLE, None)
    else:
        os.environ[ENDPOINT_VARIABLE] = endpoint


@dataclasses.dataclass(frozen=True)
class Timing:
    """One run's ms per step: by the wall clock, the process's CPU time, the driving
    thread's CPU time and the export thread's (0 untraced)."""

    wall: float
    cpu: float
    driver_cpu: float
    export_cpu: float


def thread_cpu_s(thread: threading.Thread | None) -> float:
    """CPU seconds ``thread`` has used so far (0 when there is none)."""
    if thread is None or thread.ident is None:
        return 0.0
    return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))


def export_thread() -> threading.Thread | None:
    exporter = tracing_module._process_exporter
    return None if exporter is None else exporter._thread


def timed_run(steps: int, folder: Path, endpoint: str | None) -> Timing:
    """One N-step run on a fresh SQLite file, traced to ``endpoint`` (None: not traced),
    sending what is queued at its end included."""
    folder.mkdir(parents=True, exist_ok=True)
    tracing_on(endpoint)
    try:
        harness = Harness(
            store=f"sqlite:///{folder / 'keel.db'}", model=StepModel(steps), tools=bench_registry()
        )
    finally:
        tracing_on(None)
    assert (harness.tracing is not None) is (endpoint is not None)
    with harness:
        budget = Budget(max_steps=2 * steps + 10, max_tool_calls=2 * steps + 10)
        gc.collect()
        exporting = export_thread() if endpoint is not None else None
        export_cpu = thread_cpu_s(exporting)
        started, cpu, driver_cpu = time.perf_counter(), time.process_time(), time.thread_time()
        outcome = harness.run("benchmark", cwd=folder, budget=budget)
        if harness.tracing is not None:
            harness.tracing.flush()
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
        driver_cpu = time.thread_time() - driver_cpu
        if endpoint is not None:
            exporting = exporting or export_thread()  # made by the first traced run
            export_cpu = thread_cpu_s(exporting) - (export_cpu if exporting else 0.0)
        else:
            export_cpu = 0.0
        assert outcome.status.value == "completed", outcome.stop_reason
        assert outcome.state.usage.tool_calls == steps
    per_step = 1000 / steps
    return Timing(elapsed * per_step, cpu * per_step, driver_cpu * per_step, export_cpu * per_step)


def measure(steps: int = 1000, repeat: int = 7) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="keel-bench-trace-") as tmp, loopback_receiver() as url:
        root = Path(tmp)
        timed_run(50, root / "warm-off", None)  # the same warm-up for both sides
        timed_run(50, root / "warm-on", url)
        before = spans_received(url)
        off: list[Timing] = []
        on: list[Timing] = []
        for i in range(repeat):
            off.append(timed_run(steps, root / f"off-{i}", None))
            on.append(timed_run(steps, root / f"on-{i}", url))
        received = spans_received(url) - before
        only = tracer_only(root / "tracer-only", url)
    report: dict[str, Any] = {
        "workload": f"{steps} x (model turn -> noop read tool -> result), SQLite WAL/NORMAL",
        "exporter": "Keel's batching OTLP/HTTP exporter to a receiver process on loopback",
        "repetitions": repeat,
        # step, chat and tool spans per step, then the answer's step and chat, its
        # verification and the run span
        "spans_per_traced_run": {"expected": 3 * steps + 4, "received": received // repeat},
    }
    for clock in ("wall", "cpu", "driver_cpu"):
        untraced = [getattr(t, clock) for t in off]
        traced = [getattr(t, clock) for t in on]
        # Runs alternate off/on, so each on run is paired with the off run before it:
        # the median of those differences is less moved by drift than a difference of
        # medians (both are given).
        paired = [(b - a) * 1e3 for a, b in zip(untraced, traced, strict=True)]
        report[clock] = {
            "off_ms_per_step": {
                "median": _r(statistics.median(untraced)),
                "best": _r(min(untraced)),
            },
            "on_ms_per_step": {"median": _r(statistics.median(traced)), "best": _r(min(traced))},
            "added_us_per_step": {
                "median": round((statistics.median(traced) - statistics.median(untraced)) * 1e3, 1),
                "best": round((min(traced) - min(untraced)) * 1000, 1),
                "median_of_pairs": round(statistics.median(paired), 1),
            },
        }
    exports = [t.export_cpu * 1e3 for t in on]
    report["export_thread_cpu_us_per_step"] = {
        "median": round(statistics.median(exports), 1),
        "best": round(min(exports), 1),
    }
    report["tracer_only"] = only
    return report


def tracer_only(folder: Path, endpoint: str, steps: int = 20_000) -> dict[str, float]:
    """The run tracer's own cost per step: making the spans, and sending them."""
    folder.mkdir(parents=True, exist_ok=True)
    with Harness(
        store=f"sqlite:///{folder / 'keel.db'}", model=StepModel(3), tools=bench_registry()
    ) as harness:
        outcome = harness.run("benchmark", cwd=folder)
        events = list(harness.events(outcome.id))
    wanted = (EventType.MODEL_REQUESTED, EventType.MODEL_RESPONDED, EventType.TOOL_FINISHED)
    one_step = [next(e for e in events if e.type is kind) for kind in wanted]
    fed = [
        [dataclasses.replace(e, data={**e.data, "step": i}) for e in one_step]
        for i in range(1, steps + 1)
    ]
    state = dataclasses.replace(outcome.state, last_seq=1)  # a first drive: no log to read
    tracing = Tracing(environ={ENDPOINT_VARIABLE: endpoint})
    exporter = process_exporter({ENDPOINT_VARIABLE: endpoint})
    making: list[float] = []
    sending: list[float] = []
    for _ in range(3):
        tracer = tracing.for_run(harness.store, state)
        tracer.begin(state)
        sink = tracer.observing(None)  # what the driver calls for each stored event
        made = sent = 0.0
        for start in range(0, steps, CHUNK):
            cpu = time.process_time()
            for step_events in fed[start : start + CHUNK]:
                for event in step_events:
                    sink(event, state)
            made += time.process_time() - cpu
            cpu = time.process_time()
            exporter.flush()
            sent += time.process_time() - cpu
        tracer.end(state)
        exporter.flush()
        making.append(made / steps * 1e6)
        sending.append(sent / steps * 1e6)
    return {
        "make_cpu_us_per_step": round(statistics.median(making), 2),
        "send_cpu_us_per_step": round(statistics.median(sending), 2),
        "total_cpu_us_per_step": round(
            statistics.median(m + s for m, s in zip(making, sending, strict=True)), 2
        ),
    }


def _r(ms: float) -> float:
    return round(ms, 4)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    print(json.dumps(measure(args.steps, args.repeat), indent=2))


if __name__ == "__main__":
    main()
