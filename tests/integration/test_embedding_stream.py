"""``Harness.stream`` and ``AsyncHarness.stream``: a run's events as committed (real
SQLite file)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

from keel.core.errors import ConfigError
from keel.core.events import Event, EventType
from keel.core.status import RunStatus
from keel.models.base import ModelRequest, ModelTurn
from keel.models.scripted import ScriptedModel
from keel.runtime.async_harness import AsyncHarness
from keel.runtime.harness import Harness
from keel.runtime.streaming import follow_run
from keel.store.base import iter_all_events


def turn(*calls: dict[str, Any]) -> dict[str, Any]:
    return {"tool_calls": list(calls)}


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "arguments": arguments}


READ = turn(call("read_file", path="notes.txt"))
DONE = turn(call("request_completion", summary="done"))
APPEND = turn(call("run_command", argv=["sh", "-c", "echo ran >> log.txt"]))


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    (root / "notes.txt").write_text("hello\n")
    return root


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/keel.db"


def log_of(h: Harness, run_id: str) -> list[tuple[int, str]]:
    return [(e.seq, e.event_id) for e in iter_all_events(h.store, run_id)]


def keys(events: list[Event]) -> list[tuple[int, str]]:
    return [(e.seq, e.event_id) for e in events]


def status_to(event: Event) -> str | None:
    return event.data.get("to") if event.type is EventType.STATUS_CHANGED else None


def test_stream_yields_the_stored_log_in_order_and_ends_at_completed(
    workspace: Path, store_url: str
) -> None:
    with Harness(store=store_url, model=ScriptedModel([READ, READ, DONE])) as h:
        events = list(h.stream("read the notes", cwd=workspace))

        run_id = events[0].run_id
        assert events[0].type is EventType.RUN_CREATED
        assert keys(events) == log_of(h, run_id)
        assert status_to(events[-1]) == "completed"
        assert h.get(run_id).status is RunStatus.COMPLETED


def test_stream_yields_each_event_before_the_run_finishes(workspace: Path, store_url: str) -> None:
    """Events arrive while the run is still going: the model's second turn is only
    played after the consumer saw the first tool's result."""
    model = Gated([READ, DONE], hold_at=1)
    got: list[Event] = []
    with Harness(store=store_url, model=model) as h:
        for event in h.stream("read the notes", cwd=workspace):
            got.append(event)
            if event.type is EventType.TOOL_FINISHED:
                model.release.set()
        assert keys(got) == log_of(h, got[0].run_id)
        assert status_to(got[-1]) == "completed"


def test_stream_ends_at_the_waiting_event_of_an_approval(workspace: Path, store_url: str) -> None:
    with Harness(store=store_url, model=ScriptedModel([APPEND, DONE])) as h:
        events = list(h.stream("append", cwd=workspace))

        run_id = events[0].run_id
        assert status_to(events[-1]) == "waiting"
        assert any(e.type is EventType.APPROVAL_REQUESTED for e in events)
        assert keys(events) == log_of(h, run_id)
        assert h.get(run_id).status is RunStatus.WAITING
        assert h.store.current_run_lease(run_id) is None  # the executor let go


class Gated(ScriptedModel):
    """Plays its script, but its turn ``hold_at`` waits until ``release`` is set."""

    def __init__(self, script: list[dict[str, Any]], *, hold_at: int) -> None:
        super().__init__(script)
        self.hold_at = hold_at
        self.release = threading.Event()

    def complete(self, request: ModelRequest) -> ModelTurn:
        if request.step == self.hold_at:
            assert self.release.wait(10), "never released"
        return super().complete(request)


def test_breaking_out_leaves_the_run_resumable(workspace: Path, store_url: str) -> None:
    model = Gated([READ, READ, READ, DONE], hold_at=1)
    with Harness(store=store_url, model=model) as h:
        run_id = ""
        for event in h.stream("read the notes", cwd=workspace):
            run_id = event.run_id
            if event.type is EventType.TOOL_FINISHED:
                # the model's next turn is answered only after the stop was asked for
                threading.Timer(0.2, model.release.set).start()
                break  # the generator is collected here: it stops and joins the executor

        state = h.get(run_id)
        assert state.status is RunStatus.RUNNING  # stopped between steps, not ended
        assert h.store.current_run_lease(run_id) is None
        assert h.resume(run_id).status is RunStatus.COMPLETED


def test_bad_arguments_raise_at_the_call_and_store_nothing(workspace: Path, store_url: str) -> None:
    with Harness(store=store_url, model=ScriptedModel([DONE])) as h:
        with pytest.raises(ConfigError, match="the task is empty"):
            h.stream("  ", cwd=workspace)
        assert h.store.run_ids() == []


def test_a_dead_executor_is_raised_after_the_events_it_committed(
    workspace: Path, store_url: str, tmp_path: Path
) -> None:
    """The run's script vanishes between create and execute: the executor dies with a
    ConfigError; the stream yields what was stored, then raises it."""
    script = tmp_path / "script.json"
    script.write_text('[{"tool_calls": [{"name": "request_completion", "arguments": {}}]}]')
    with Harness(store=store_url) as h:
        state = h.create("read", cwd=workspace, model=f"scripted:{script}")
        script.unlink()

        got: list[Event] = []
        with pytest.raises(ConfigError, match="script"):
            for event in follow_run(
                h.store, state.run_id, lambda run_id, stop: h.execute(run_id, should_stop=stop)
            ):
                got.append(event)
        assert keys(got) == log_of(h, state.run_id) == [(1, got[0].event_id)]


def test_async_stream_yields_the_log_and_ends_at_completed(workspace: Path, store_url: str) -> None:
    async def follow() -> tuple[list[Event], int]:
        ticks = 0
        stop = asyncio.Event()

        async def ticker() -> None:  # the loop stays free while the run executes
            nonlocal ticks
            while not stop.is_set():
                ticks += 1
                await asyncio.sleep(0.001)

        task = asyncio.create_task(ticker())
        harness = AsyncHarness(store=store_url, model=ScriptedModel([READ, READ, DONE]))
        async with harness:
            events = [event async for event in harness.stream("read", cwd=workspace)]
            stop.set()
            await task
            assert keys(events) == log_of(harness.harness, events[0].run_id)
        return events, ticks

    events, ticks = asyncio.run(follow())
    assert status_to(events[-1]) == "completed"
    assert ticks > 5


def test_async_stream_ends_at_waiting_and_async_run_works(workspace: Path, store_url: str) -> None:
    async def follow() -> None:
        async with AsyncHarness(store=store_url, model=ScriptedModel([APPEND, DONE])) as h:
            events = [event async for event in h.stream("append", cwd=workspace)]
            assert status_to(events[-1]) == "waiting"
            run_id = events[0].run_id
            await h.approve(run_id)
            outcome = await h.resume(run_id)
            assert outcome.status is RunStatus.COMPLETED
            assert (workspace / "log.txt").read_text() == "ran\n"

            outcome = await h.run("append again", cwd=workspace)
            assert outcome.status is RunStatus.WAITING

    asyncio.run(follow())


def test_async_stream_left_early_leaves_the_run_resumable(workspace: Path, store_url: str) -> None:
    model = Gated([READ, READ, READ, DONE], hold_at=1)

    async def follow() -> str:
        async with AsyncHarness(store=store_url, model=model) as h:
            run_id = ""
            stream = h.stream("read", cwd=workspace)
            async for event in stream:
                run_id = event.run_id
                if event.type is EventType.TOOL_FINISHED:
                    threading.Timer(0.2, model.release.set).start()
                    break
            await stream.aclose()  # what `async for` leaves to the caller
            return run_id

    run_id = asyncio.run(follow())
    with Harness(store=store_url, model=ScriptedModel([READ, READ, READ, DONE])) as h:
        assert h.store.current_run_lease(run_id) is None
        assert h.get(run_id).status is RunStatus.RUNNING
        assert h.resume(run_id).status is RunStatus.COMPLETED
