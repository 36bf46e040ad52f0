"""Cancelling a run tree: every live descendant ends ``cancelled`` (``parent_cancelled``),
nothing new starts on a cancelled run even when the cancel lands mid-step, and what the
tree already did is reported (real SQLite files, real driver, real worker processes)."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from keel.core.errors import InvalidTransition
from keel.core.events import EventType, NewEvent
from keel.core.records import RunOptions
from keel.core.state import RunState
from keel.core.status import RunStatus
from keel.core.tasks import TaskStatus
from keel.models.base import ModelRequest, ModelTurn
from keel.runtime.cancel_tree import PARENT_CANCELLED, cancel_tree
from keel.runtime.harness import Harness
from keel.store.base import Store, iter_all_events
from keel.store.sqlite.store import SQLiteStore
from keel.store.step import STARTS_ACTION
from keel.testing import FakeProvider, ScriptedModel
from keel.testing.stores import append, make_run, move, scratch_database, tool_step
from keel.tools.base import Effect, Recovery, ToolContext, ToolResult, tool
from keel.tools.builtin import default_registry

KEEL = [sys.executable, "-m", "keel.cli.app"]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SQLiteStore]:
    s = SQLiteStore(tmp_path / "keel.db")
    yield s
    s.close()


def started_after(store: Store, run_id: str, seq: int) -> list[str]:
    """Events of ``run_id`` after ``seq`` that start something."""
    return [
        f"{e.seq}:{e.type.value}"
        for e in iter_all_events(store, run_id)
        if e.seq > seq and e.type in STARTS_ACTION
    ]


def cancel_seq(store: Store, run_id: str) -> int:
    (seq,) = [
        e.seq
        for e in iter_all_events(store, run_id)
        if e.type is EventType.STATUS_CHANGED and e.data["to"] == "cancelled"
    ]
    return seq


# --- a cancel from another writer, mid-step -----------------------------------------------


def marker_tool(cancel: Any) -> Any:
    """``stamp(path)``: writes ``path``. Its intent (computed just before ``tool_started``
    is committed) first lets ``cancel`` cancel the run from another store instance."""

    def intent(ctx: ToolContext, path: str) -> dict[str, str]:
        cancel(ctx.run_id)
        return {path: hashlib.sha256(b"stamped\n").hexdigest()}

    @tool(effect=Effect.WRITE, recovery=Recovery.VERIFY_THEN_CONTINUE, intent=intent)
    def stamp(ctx: ToolContext, path: str) -> ToolResult:
        """Write a marker file."""
        (ctx.workspace / path).write_text("stamped\n")
        return ToolResult(output="stamped", changed_files={path: "x"})

    return stamp


def test_a_cancel_committed_just_before_tool_started_means_the_tool_never_runs(
    tmp_path: Path,
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    db = tmp_path / "keel.db"
    other = SQLiteStore(db)  # another writer: `keel cancel` in another process
    registry = default_registry()
    registry.register(marker_tool(lambda run_id: cancel_tree(other, run_id, "stop now")))
    model = ScriptedModel(
        [
            {"tool_calls": [{"name": "stamp", "arguments": {"path": "marker.txt"}}]},
            {"content": "never asked"},
        ]
    )
    harness = Harness(store=SQLiteStore(db), model=model, tools=registry)
    try:
        outcome = harness.run("stamp the marker", cwd=ws, mode="auto", sandbox="off")
        assert outcome.status is RunStatus.CANCELLED and outcome.stop_reason == "stop now"
        assert not (ws / "marker.txt").exists(), "the tool ran on a cancelled run"
        events = list(harness.events(outcome.id))
        assert not [e for e in events if e.type is EventType.TOOL_STARTED]
        assert started_after(harness.store, outcome.id, cancel_seq(harness.store, outcome.id)) == []
        assert len(model.requests) == 1  # and the model is not asked again
    finally:
        harness.close()
        other.close()


class CancellingModel:
    """A scripted model that, while answering turn ``at``, has the run cancelled by
    another writer: the cancel lands between the model's answer and its dispatch."""

    def __init__(self, inner: ScriptedModel, cancel: Any, *, at: int = 0) -> None:
        self.inner = inner
        self.spec = inner.spec
        self.cancel = cancel
        self.at = at
        self.run_id = ""

    def complete(self, request: ModelRequest) -> ModelTurn:
        turn = self.inner.complete(request)
        if request.step == self.at:
            self.cancel(self.run_id)
        return turn


def test_a_cancel_landing_while_the_model_answers_stops_the_run_before_its_calls(
    tmp_path: Path,
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    db = tmp_path / "keel.db"
    other = SQLiteStore(db)
    scripted = ScriptedModel(
        [
            {
                "tool_calls": [
                    {"name": "write_file", "arguments": {"path": "a.txt", "content": "a"}}
                ]
            },
            {"content": "never asked"},
        ]
    )
    model = CancellingModel(scripted, lambda run_id: cancel_tree(other, run_id, "stop now"))
    harness = Harness(store=SQLiteStore(db), model=model)
    try:
        state = harness.create("write a", cwd=ws, mode="auto", sandbox="off")
        model.run_id = state.run_id
        outcome = harness.execute(state.run_id)
        assert outcome.status is RunStatus.CANCELLED
        assert not (ws / "a.txt").exists()
        types = [e.type for e in harness.events(state.run_id)]
        assert EventType.MODEL_REQUESTED not in types and EventType.TOOL_STARTED not in types
        assert len(scripted.requests) == 1
    finally:
        harness.close()
        other.close()


# --- cancel_tree on a tree in one store ------------------------------------------------


def live_run(store: Store, **overrides: Any) -> RunState:
    return make_run(store, **overrides)


def with_events(store: Store, state: RunState, *events: NewEvent) -> RunState:
    return append(store, state, list(events))[0]


def started(call_id: str, tool_name: str, effect: str, arguments: dict[str, Any]) -> NewEvent:
    return NewEvent(
        type=EventType.TOOL_STARTED,
        data={"call_id": call_id, "tool": tool_name, "arguments": arguments, "effect": effect},
    )


def test_cancel_tree_cancels_every_live_descendant_and_reports_what_was_done(
    store: SQLiteStore,
) -> None:
    parent = live_run(store)
    worker_task = store.create_task("explore", actor="lead")
    child = live_run(store, parent_id=parent.run_id, task_id=worker_task.id)
    long_path = "src/" + "deep/" * 40 + "file.py"
    write = tool_step("c1", arguments={"path": long_path, "content": "x"})
    child = with_events(
        store,
        child,
        started("c1", "write_file", "write", write[0].data["arguments"]),
        write[1],
        started("c2", "run_command", "execute", {"argv": ["make", "test"]}),
    )
    ended = live_run(store, parent_id=parent.run_id)
    ended = with_events(
        store,
        ended,
        started("c3", "edit_file", "write", {"path": "b.py"}),
        NewEvent(type=EventType.TOOL_FAILED, data={"call_id": "c3", "message": "no match"}),
        move(ended, RunStatus.FAILED, "budget"),
    )
    queued_task = store.create_task("review", actor="lead")
    grandchild = live_run(store, parent_id=child.run_id, queued=True, task_id=queued_task.id)
    under_ended = live_run(store, parent_id=ended.run_id)  # a live run below an ended one
    # The child's own task is executed by a worker holding its lease: only it may cancel.
    assert store.claim_task(owner="worker-1", lease_seconds=600, task_id=worker_task.id)
    claimed = store.create_task("a task the child's model claimed", actor="lead")
    held = store.claim_task(owner=f"run:{child.run_id}", lease_seconds=600, task_id=claimed.id)
    assert held is not None

    report = cancel_tree(store, parent.run_id, "wrong goal")

    assert report.state.status is RunStatus.CANCELLED and report.state.reason == "wrong goal"
    assert report.cancelled == [child.run_id, grandchild.run_id, under_ended.run_id]
    for run_id in report.cancelled:
        state = store.load_run(run_id)
        assert (state.status, state.reason) == (RunStatus.CANCELLED, PARENT_CANCELLED)
    after = store.load_run(ended.run_id)
    assert (after.status, after.reason, after.last_seq) == (
        RunStatus.FAILED,
        "budget",
        ended.last_seq,
    )
    assert store.get_task(held.id).status is TaskStatus.PENDING  # the claim went back
    assert store.get_task(queued_task.id).status is TaskStatus.CANCELLED
    assert report.tasks_cancelled == [queued_task.id]
    assert list(report.tasks_left) == [worker_task.id]
    assert "worker-1" in report.tasks_left[worker_task.id]
    assert store.get_task(worker_task.id).status is TaskStatus.IN_PROGRESS  # its holder settles

    effects = [(e.run_id, e.call_id, e.tool, e.effect, e.outcome) for e in report.side_effects]
    assert effects == [
        (child.run_id, "c1", "write_file", "write", "finished"),
        (child.run_id, "c2", "run_command", "execute", "started, outcome unknown"),
        (ended.run_id, "c3", "edit_file", "write", "failed"),
    ]
    summaries = [e.summary for e in report.side_effects]
    assert len(summaries[0]) == 120 and summaries[0].startswith("src/deep/")
    assert summaries[0].endswith("…")
    assert summaries[1:] == ["make test", "b.py"]
    as_json = report.to_dict()
    assert as_json["cancelled"] == report.cancelled
    assert as_json["side_effects"][1]["outcome"] == "started, outcome unknown"


def test_cancel_tree_refuses_a_run_that_already_ended_and_writes_nothing(
    store: SQLiteStore,
) -> None:
    parent = live_run(store)
    child = live_run(store, parent_id=parent.run_id)
    parent = with_events(store, parent, move(parent, RunStatus.FAILED, "crashed"))
    with pytest.raises(InvalidTransition, match="failed is terminal"):
        cancel_tree(store, parent.run_id, "late")
    assert store.load_run(child.run_id).status is RunStatus.RUNNING
    assert store.load_run(parent.run_id).last_seq == parent.last_seq


def test_cancel_tree_wins_against_a_busy_writer(store: SQLiteStore) -> None:
    """A descendant whose executor keeps appending: the cancel reads again and lands."""
    parent = live_run(store)
    child = live_run(store, parent_id=parent.run_id)
    stop = threading.Event()
    outcome: list[str] = []

    def busy(path: Path) -> None:
        own = SQLiteStore(path)
        try:
            state = own.load_run(child.run_id)
            while not stop.is_set():
                note = NewEvent(type=EventType.NOTE_ADDED, data={"text": "busy"})
                try:
                    state, _ = append(own, state, [note])
                except InvalidTransition:
                    outcome.append("refused")
                    return
                except Exception:
                    state = own.load_run(child.run_id)
        finally:
            own.close()

    writer = threading.Thread(target=busy, args=(store.path,))
    writer.start()
    time.sleep(0.1)
    try:
        report = cancel_tree(store, parent.run_id, "stop")
    finally:
        writer.join(timeout=10)
        stop.set()
    assert report.cancelled == [child.run_id]
    assert outcome == ["refused"]  # the writer's next note after the cancel was refused
    assert started_after(store, child.run_id, cancel_seq(store, child.run_id)) == []


def test_harness_cancel_cascades_and_returns_the_run_state(store: SQLiteStore) -> None:
    parent = live_run(store)
    child = live_run(store, parent_id=parent.run_id, queued=True)
    harness = Harness(store=store, model=ScriptedModel([]))
    state = harness.cancel(parent.run_id, "not needed")
    assert isinstance(state, RunState) and state.status is RunStatus.CANCELLED
    assert store.load_run(child.run_id).reason == PARENT_CANCELLED
    again = make_run(store)
    report = harness.cancel_tree(again.run_id, "also not")
    assert report.cancelled == [] and report.side_effects == []


# --- children executing in `keel worker` processes --------------------------------------


@contextmanager
def backend(kind: str, tmp_path: Path) -> Iterator[str]:
    if kind == "sqlite":
        yield f"sqlite:///{tmp_path / 'keel.db'}"
        return
    from keel.testing.stores import postgres_unavailable  # noqa: PLC0415

    if reason := postgres_unavailable():
        pytest.skip(f"PostgreSQL store not tested: {reason}")
    with scratch_database() as url:
        yield url


def slow_writer(provider: FakeProvider, delay: float) -> None:
    """Every request: after ``delay`` seconds, a ``write_file`` of a new file."""
    count = iter(range(10_000))

    def respond(body: dict[str, Any]) -> None:
        n = next(count)
        provider.reply(
            tool_calls=[("write_file", {"path": f"note_{n}.txt", "content": f"{n}\n"})],
            usage=(10, 5),
            delay=delay,
        )

    provider.respond_with(respond)


def start_worker(url: str, cwd: Path, provider: FakeProvider) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "OPENAI_API_KEY": "sk-test",
        "OPENAI_BASE_URL": provider.base_url,
        "KEEL_LEASE_TTL": "5",
    }
    return subprocess.Popen(
        [*KEEL, "worker", "--store", url, "--poll", "0.1"],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def finished_calls(store: Store, run_id: str) -> int:
    return sum(1 for e in iter_all_events(store, run_id) if e.type is EventType.TOOL_FINISHED)


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_cancelling_a_tree_stops_children_running_in_worker_processes(
    kind: str, tmp_path: Path
) -> None:
    from keel.store.url import open_store  # noqa: PLC0415

    with backend(kind, tmp_path) as url, FakeProvider() as provider:
        slow_writer(provider, delay=0.3)
        store = open_store(url)
        workers: list[subprocess.Popen[str]] = []
        try:
            options = RunOptions(model="openai:fake-model", mode="auto")
            parent = store.create_run(goal="lead", workspace=str(tmp_path), options=options)
            children = []
            for i in range(2):
                ws = tmp_path / f"child{i}"
                ws.mkdir()
                children.append(
                    store.create_run(
                        goal=f"write notes {i}",
                        workspace=str(ws),
                        options=options,
                        parent_id=parent.run_id,
                        queued=True,
                    )
                )
            workers = [start_worker(url, tmp_path, provider) for _ in range(2)]
            wait_for(
                lambda: all(finished_calls(store, c.run_id) >= 2 for c in children),
                60,
                "both children to be mid-run in the workers",
            )
            holders = {store.current_run_lease(c.run_id) is not None for c in children}
            assert holders == {True}  # each is being driven right now

            report = cancel_tree(store, parent.run_id, "stop the tree")

            assert report.cancelled == [c.run_id for c in children]
            # The workers stop driving them: leases given back, logs and traffic still.
            wait_for(
                lambda: all(store.current_run_lease(c.run_id) is None for c in children),
                30,
                "the workers to let go of the cancelled children",
            )
            seen = (provider.served, [store.load_run(c.run_id).last_seq for c in children])
            time.sleep(1.0)
            assert (provider.served, [store.load_run(c.run_id).last_seq for c in children]) == seen
            for child in children:
                state = store.load_run(child.run_id)
                assert (state.status, state.reason) == (RunStatus.CANCELLED, PARENT_CANCELLED)
                assert started_after(store, child.run_id, cancel_seq(store, child.run_id)) == []
                # Every file a child wrote was a call on record before the cancel.
                written = {p.name for p in Path(state.workspace).iterdir()}
                recorded = {
                    e.data["arguments"]["path"]
                    for e in iter_all_events(store, child.run_id)
                    if e.type is EventType.TOOL_STARTED
                }
                assert written <= recorded, written - recorded
            done = [e for e in report.side_effects if e.outcome == "finished"]
            assert len(done) >= 4 and {e.tool for e in done} == {"write_file"}
        finally:
            for proc in workers:
                proc.send_signal(signal.SIGTERM)
            for proc in workers:
                try:
                    _, err = proc.communicate(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    _, err = proc.communicate()
                assert "Traceback" not in err, err
            store.close()
