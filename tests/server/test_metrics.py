"""GET /metrics: Prometheus text whose figures are what the store and the events say.

The exposition is read back with ``prometheus_client``'s own parser, so a malformed
line, a bad escape or an inconsistent histogram fails here as it would in Prometheus.
"""

from __future__ import annotations

import math
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI
from prometheus_client.parser import text_string_to_metric_families

from keel.core.events import Event, EventType
from keel.core.status import RunStatus
from keel.runtime.api_tokens import hash_token, make_token
from keel.runtime.harness import Harness
from keel.server.app import create_app
from keel.server.config import ServeConfig
from keel.server.event_metrics import MODEL_LATENCY_BUCKETS, TOOL_LATENCY_BUCKETS, EventMetrics
from keel.server.metrics import CONTENT_TYPE, exposition
from keel.store.base import Store
from keel.store.sqlite.store import SQLiteStore
from keel.testing.agents import write_script

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]
FAMILIES = (
    "keel_runs",
    "keel_queue_depth",
    "keel_steps_total",
    "keel_claims_total",
    "keel_model_calls_total",
    "keel_tool_calls_total",
    "keel_model_latency_seconds",
    "keel_tool_latency_seconds",
)


def _event(seq: int, type_: EventType, run_id: str = "run-1", **data: Any) -> Event:
    return Event(
        run_id=run_id,
        seq=seq,
        event_id=uuid.uuid4().hex,
        type=type_,
        recorded_at=datetime.now(UTC),
        data=data,
    )


def _parse(text: str) -> Samples:
    """Every sample of the exposition by (name, labels); parsing fails on bad syntax."""
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = (sample.name, frozenset(sample.labels.items()))
            assert key not in samples, f"duplicate series {key}"
            samples[key] = sample.value
    return samples


def _value(samples: Samples, name: str, **labels: str) -> float:
    return samples[name, frozenset(labels.items())]


def _series(samples: Samples, name: str) -> dict[frozenset[tuple[str, str]], float]:
    return {labels: value for (n, labels), value in samples.items() if n == name}


def _check_histogram(samples: Samples, name: str, label: str, values: dict[str, list[float]]):
    """The histogram ``name`` holds exactly ``values`` (label value -> observed seconds):
    cumulative buckets at each bound and +Inf, sum and count."""
    bounds = MODEL_LATENCY_BUCKETS if "model" in name else TOOL_LATENCY_BUCKETS
    counts = _series(samples, f"{name}_count")
    assert counts == {frozenset({(label, k)}): float(len(v)) for k, v in values.items()}
    for key, observed in values.items():
        assert _value(samples, f"{name}_sum", **{label: key}) == pytest.approx(sum(observed))
        for bound in bounds:
            expected = sum(1 for v in observed if v <= bound)
            got = _value(samples, f"{name}_bucket", **{label: key, "le": repr(bound)})
            assert got == expected, (key, bound)
        inf = _value(samples, f"{name}_bucket", **{label: key, "le": "+Inf"})
        assert inf == len(observed)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    opened = SQLiteStore(tmp_path / "keel.db")
    yield opened
    opened.close()


# --- the collector and the text, from known events -----------------------------------------


def test_the_text_says_what_the_fed_events_imply(store: Store) -> None:
    """Steps, claims, calls by label and both histograms, exactly; a value on a bucket
    bound is inside that bucket (``le``); every family has its HELP and TYPE lines."""
    metrics = EventMetrics()
    fed = [
        _event(2, EventType.STATUS_CHANGED, **{"from": "queued", "to": "running"}),  # claim
        _event(3, EventType.MODEL_REQUESTED, step=1, model="m-a"),
        _event(4, EventType.MODEL_RESPONDED, model="m-a", elapsed_s=0.1),  # on a bound
        _event(5, EventType.TOOL_FINISHED, tool="read_file", elapsed_s=0.002),
        _event(6, EventType.TOOL_FINISHED, tool="read_file", elapsed_s=0.0005),
        _event(7, EventType.TOOL_FAILED, tool="run_command", error_kind="timed_out", elapsed_s=31),
        _event(8, EventType.MODEL_RESPONDED, model="m-a", elapsed_s=7.5),
        _event(9, EventType.MODEL_RESPONDED, model="m-b", elapsed_s=400.0),  # above all
        _event(10, EventType.STATUS_CHANGED, **{"from": "running", "to": "completed"}),
        _event(7, EventType.RUN_RESUMED, run_id="run-2", owner="w"),  # claim
        _event(8, EventType.STATUS_CHANGED, run_id="run-2", **{"from": "paused", "to": "running"}),
    ]
    for event in fed:
        metrics.observe(event)

    text = exposition(metrics, store).decode("utf-8")
    samples = _parse(text)

    assert _value(samples, "keel_steps_total") == 3
    assert _value(samples, "keel_claims_total") == 2
    assert _series(samples, "keel_model_calls_total") == {
        frozenset({("model", "m-a")}): 2.0,
        frozenset({("model", "m-b")}): 1.0,
    }
    assert _series(samples, "keel_tool_calls_total") == {
        frozenset({("tool", "read_file"), ("outcome", "ok")}): 2.0,
        frozenset({("tool", "run_command"), ("outcome", "timed_out")}): 1.0,
    }
    _check_histogram(
        samples, "keel_model_latency_seconds", "model", {"m-a": [0.1, 7.5], "m-b": [400.0]}
    )
    _check_histogram(
        samples,
        "keel_tool_latency_seconds",
        "tool",
        {"read_file": [0.002, 0.0005], "run_command": [31.0]},
    )
    assert _value(samples, "keel_model_latency_seconds_bucket", model="m-a", le="0.1") == 1
    lines = text.splitlines()
    for name in FAMILIES:
        kind = (
            "gauge"
            if name in ("keel_runs", "keel_queue_depth")
            else "counter"
            if name.endswith("_total")
            else "histogram"
        )
        assert any(line.startswith(f"# HELP {name} ") for line in lines), name
        assert f"# TYPE {name} {kind}" in lines
    assert not any("_created" in line for line in lines)  # no OpenMetrics-only series


def test_an_empty_collector_still_exposes_every_family_at_zero(store: Store) -> None:
    samples = _parse(exposition(EventMetrics(), store).decode())
    assert _value(samples, "keel_steps_total") == 0
    assert _value(samples, "keel_claims_total") == 0
    assert _series(samples, "keel_model_calls_total") == {}
    assert _value(samples, "keel_queue_depth") == 0
    assert _series(samples, "keel_runs") == {
        frozenset({("status", s.value)}): 0.0 for s in RunStatus
    }


def test_label_values_are_escaped_and_read_back_unchanged(store: Store) -> None:
    metrics = EventMetrics()
    odd = 'local "q\\4"\nnext line'
    metrics.observe(_event(3, EventType.MODEL_RESPONDED, model=odd, elapsed_s=1.0))
    text = exposition(metrics, store).decode()
    assert 'model="local \\"q\\\\4\\"\\nnext line"' in text  # \" \\ \n in the text
    samples = _parse(text)
    assert _value(samples, "keel_model_calls_total", model=odd) == 1
    assert _value(samples, "keel_model_latency_seconds_count", model=odd) == 1


def test_odd_event_data_counts_the_call_but_no_latency(store: Store) -> None:
    """A call refused before it ran has no elapsed_s; a value that is no finite,
    non-negative number is not a latency. A tool the model made up is one label."""
    metrics = EventMetrics()
    for seq, elapsed in enumerate([None, "3", -1.0, math.nan, math.inf, True], start=3):
        data: dict[str, Any] = {"tool": "write_file", "error_kind": "policy_denied"}
        if elapsed is not None:
            data["elapsed_s"] = elapsed
        metrics.observe(_event(seq, EventType.TOOL_FAILED, **data))
    for seq, name in enumerate(["frobnicate", "x" * 500], start=20):
        metrics.observe(_event(seq, EventType.TOOL_FAILED, tool=name, error_kind="unknown_tool"))
    metrics.observe(_event(30, EventType.MODEL_RESPONDED))  # no model, no elapsed_s

    samples = _parse(exposition(metrics, store).decode())
    assert _series(samples, "keel_tool_calls_total") == {
        frozenset({("tool", "write_file"), ("outcome", "policy_denied")}): 6.0,
        frozenset({("tool", "(unknown)"), ("outcome", "unknown_tool")}): 2.0,
    }
    assert _series(samples, "keel_tool_latency_seconds_count") == {}
    assert _value(samples, "keel_model_calls_total", model="unknown") == 1
    assert _series(samples, "keel_model_latency_seconds_count") == {}


def test_observe_from_many_threads_loses_nothing_and_snapshots_agree() -> None:
    """Worker threads feed while a scraper reads: every snapshot is one moment (its
    step count, model calls and latency count agree), and nothing is lost."""
    metrics = EventMetrics()
    threads, per_thread = 6, 2_000
    feeding = threading.Event()
    disagreements: list[tuple[int, int, int]] = []

    def feed(n: int) -> None:
        feeding.wait()
        for i in range(per_thread):
            metrics.observe(_event(i + 3, EventType.MODEL_RESPONDED, model="m", elapsed_s=i % 9))
            metrics.observe(
                _event(i + 3, EventType.TOOL_FINISHED, run_id=f"r{n}", tool="t", elapsed_s=0.01)
            )

    def scrape() -> None:
        feeding.wait()
        while any(f.is_alive() for f in feeders):
            seen = metrics.snapshot()
            latency = seen.model_latency.get("m")
            counts = (seen.steps, seen.model_calls.get("m", 0), latency.count if latency else 0)
            if len(set(counts)) != 1:
                disagreements.append(counts)

    feeders = [threading.Thread(target=feed, args=(n,)) for n in range(threads)]
    scraper = threading.Thread(target=scrape)
    for thread in (*feeders, scraper):
        thread.start()
    feeding.set()
    for thread in (*feeders, scraper):
        thread.join()
    assert disagreements == []
    seen = metrics.snapshot()
    total = threads * per_thread
    assert seen.steps == total
    assert seen.tool_calls == {("t", "ok"): total}
    assert seen.tool_latency["t"].count == sum(seen.tool_latency["t"].counts) == total
    assert seen.model_latency["m"].count == sum(seen.model_latency["m"].counts) == total


def test_runs_and_queue_depth_are_read_from_the_store(tmp_path: Path, store: Store) -> None:
    """Two queued runs, one completed; a ready task and one blocked behind it: the
    queue holds the two runs and the ready task."""
    harness = Harness(store=store, child_slots=0)
    done = write_script(tmp_path / "done.json", [{"content": "done"}])
    for goal in ("first", "second"):
        harness.create(goal, cwd=tmp_path, model=done, queued=True)
    ran = harness.create("third", cwd=tmp_path, model=done)
    assert harness.execute(ran.run_id).status is RunStatus.COMPLETED
    ready = store.create_task("ready", actor="test")
    store.create_task("blocked", actor="test", blocked_by=[ready.id])

    samples = _parse(exposition(EventMetrics(), store).decode())
    expected = {s: 0 for s in RunStatus} | {RunStatus.QUEUED: 2, RunStatus.COMPLETED: 1}
    assert _series(samples, "keel_runs") == {
        frozenset({("status", s.value)}): float(n) for s, n in expected.items()
    }
    assert _value(samples, "keel_queue_depth") == 3


# --- a live server ----------------------------------------------------------------------------


@contextmanager
def _serving(config: ServeConfig, app: FastAPI | None = None) -> Iterator[str]:
    """``app`` (default ``create_app(config)``) on a real uvicorn bound to a free
    loopback port."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(
            app or create_app(config), log_level="warning", lifespan="on", access_log=False
        )
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


def _wait_settled(store: Store, run_ids: list[str], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not all(store.load_run(r).status.terminal for r in run_ids):
        assert time.monotonic() < deadline, [store.load_run(r).status for r in run_ids]
        time.sleep(0.05)


def test_a_live_server_reports_what_its_workers_committed(tmp_path: Path, store: Store) -> None:
    """Three queued runs executed by the server's embedded worker: the figures equal
    the store's counts and what the runs' stored events say, and the route needs a
    token like every other."""
    (tmp_path / "notes.txt").write_text("hello\n")
    read = {"name": "read_file", "arguments": {"path": "notes.txt"}}
    missing = {"name": "read_file", "arguments": {"path": "no-such-file.txt"}}
    scripts = {
        "reads": [{"tool_calls": [read]}, {"tool_calls": [read, missing]}, {"content": "read"}],
        "answers": [{"content": "answered"}],
        "misses": [{"tool_calls": [missing]}, {"content": "gave up"}],
    }
    harness = Harness(store=store, child_slots=0)
    run_ids = [
        harness.create(
            goal, cwd=tmp_path, model=write_script(tmp_path / f"{goal}.json", turns), queued=True
        ).run_id
        for goal, turns in scripts.items()
    ]
    token = make_token()
    store.create_token("scraper", hash_token(token))
    config = ServeConfig(
        store_url=f"sqlite:///{tmp_path / 'keel.db'}", workers=1, poll_interval=0.05
    )
    with _serving(config) as base:
        _wait_settled(store, run_ids)
        with httpx.Client(base_url=base, timeout=10) as client:
            refused = client.get("/metrics")
            wrong = client.get("/metrics", headers={"Authorization": "Bearer " + make_token()})
            response = client.get("/metrics", headers={"Authorization": f"Bearer {token}"})
    assert refused.status_code == wrong.status_code == 401
    assert refused.headers["www-authenticate"].startswith("Bearer")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == CONTENT_TYPE
    samples = _parse(response.text)

    counts = store.count_runs_by_status()
    assert _series(samples, "keel_runs") == {
        frozenset({("status", s.value)}): float(counts[s]) for s in RunStatus
    }
    assert counts[RunStatus.COMPLETED] >= 3
    assert _value(samples, "keel_queue_depth") == store.queue_depth() == 0

    events = [e for r in run_ids for e in store.read_events(r)]
    responded = [e for e in events if e.type is EventType.MODEL_RESPONDED]
    tools = [e for e in events if e.type in (EventType.TOOL_FINISHED, EventType.TOOL_FAILED)]
    assert len(responded) == 6 and len(tools) == 4  # what the scripts imply
    assert _value(samples, "keel_steps_total") == len(responded)
    assert _value(samples, "keel_claims_total") == len(run_ids)
    models: dict[str, list[float]] = {}
    for e in responded:
        models.setdefault(e.data["model"], []).append(e.data["elapsed_s"])
    assert _series(samples, "keel_model_calls_total") == {
        frozenset({("model", m)}): float(len(v)) for m, v in models.items()
    }
    _check_histogram(samples, "keel_model_latency_seconds", "model", models)
    outcomes: dict[tuple[str, str], int] = {}
    timings: dict[str, list[float]] = {}
    for e in tools:
        ok = e.type is EventType.TOOL_FINISHED
        key = (e.data["tool"], "ok" if ok else e.data["error_kind"])
        outcomes[key] = outcomes.get(key, 0) + 1
        timings.setdefault(e.data["tool"], []).append(e.data["elapsed_s"])
    assert len(outcomes) == 2  # the reads that worked and those that did not
    assert _series(samples, "keel_tool_calls_total") == {
        frozenset({("tool", t), ("outcome", o)}): float(n) for (t, o), n in outcomes.items()
    }
    _check_histogram(samples, "keel_tool_latency_seconds", "tool", timings)


def test_a_store_that_cannot_answer_makes_the_scrape_a_503_problem(tmp_path: Path) -> None:
    """Gauges are never made up: when the store fails, the scrape fails with its words."""
    config = ServeConfig(store_url=f"sqlite:///{tmp_path / 'keel.db'}")
    token = make_token()
    with SQLiteStore(tmp_path / "keel.db") as setup:
        setup.create_token("scraper", hash_token(token))
    app = create_app(config)
    with _serving(config, app) as base:
        auth = {"Authorization": f"Bearer {token}"}
        assert httpx.get(f"{base}/metrics", headers=auth).status_code == 200
        app.state.keel.store.close()
        failed = httpx.get(f"{base}/metrics", headers=auth)
    assert failed.status_code == 503
    assert failed.headers["content-type"] == "application/problem+json"
    assert "is closed" in failed.json()["detail"]
