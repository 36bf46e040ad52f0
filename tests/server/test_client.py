"""``keel.client.Client`` and ``AsyncClient`` against a live ``keel serve`` (real uvicorn,
real SQLite file, embedded worker executing scripted runs)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from keel.client import ApiError, AsyncClient, Client, ConnectionFailed
from keel.core.errors import KeelError
from keel.core.events import EventType, NewEvent
from keel.core.records import RunOptions
from keel.core.status import RunStatus
from keel.store.base import Store, iter_all_events


def turn(*calls: dict[str, Any]) -> dict[str, Any]:
    return {"tool_calls": list(calls)}


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "arguments": arguments}


READ = turn(call("read_file", path="notes.txt"))
APPEND = turn(call("run_command", argv=["sh", "-c", "echo ran >> log.txt"]))
DONE = turn(call("request_completion", summary="done"))


def script(workspace: Path, turns: list[dict[str, Any]], name: str = "script.json") -> str:
    (workspace / "notes.txt").write_text("hello\n")
    path = workspace / name
    path.write_text(json.dumps(turns))
    return f"scripted:{path}"


def log_seqs(store: Store, run_id: str) -> list[int]:
    return [event.seq for event in iter_all_events(store, run_id)]


@pytest.fixture
def live(start_server: Callable[..., Any]) -> Any:
    return start_server(workers=1)


def test_submit_then_stream_to_completion(live: Any) -> None:
    model = script(live.workspace, [READ, DONE])
    with Client(live.url, live.token) as client:
        run = client.submit("read", str(live.workspace), model=model, budget={"max_steps": 10})
        assert run["status"] == "queued" and run["creator"] == "token:tester"
        events = list(client.stream(run["id"]))
        assert [e["seq"] for e in events] == log_seqs(live.store, run["id"])
        assert events[-1]["data"]["to"] == "completed"
        assert client.get(run["id"])["status"] == "completed"
        page = client.events(run["id"], after=2, limit=2)
        assert [e["seq"] for e in page["events"]] == [3, 4]
        assert page["last_seq"] == events[-1]["seq"]


def test_approval_flow_and_settled_streams(live: Any) -> None:
    model = script(live.workspace, [APPEND, DONE])
    with Client(live.url, live.token) as client:
        run_id = client.submit("append", str(live.workspace), model=model)["id"]
        first = list(client.stream(run_id, until="settled"))
        assert first[-1]["data"]["to"] == "waiting"
        pending = client.get(run_id)["pending"]
        assert pending["kind"] == "approval"

        with pytest.raises(ApiError) as changed:
            client.approve(run_id, digest="0" * 64)
        assert changed.value.status == 409

        client.approve(run_id, digest=pending["digest"])
        rest = list(client.stream(run_id, after=first[-1]["seq"]))
        assert [e["seq"] for e in first + rest] == log_seqs(live.store, run_id)
        granted = next(e for e in rest if e["type"] == "approval_granted")
        assert granted["data"]["by"] == "token:tester"
        assert (live.workspace / "log.txt").read_text() == "ran\n"


def test_stream_reconnects_after_a_dropped_connection(live: Any) -> None:
    """A transport that breaks the first stream after two events: the client resumes
    with Last-Event-ID and yields every event exactly once."""
    run_id = live.store.create_run(
        goal="g", workspace=str(live.workspace), options=RunOptions()
    ).run_id
    for n in range(5):
        live.store.append_events(
            run_id, [NewEvent(type=EventType.NOTE_ADDED, data={"n": n})], expected_seq=n + 1
        )
    state = live.store.load_run(run_id)
    live.store.append_events(
        run_id,
        [
            NewEvent(
                type=EventType.STATUS_CHANGED,
                data={"from": "running", "to": "failed", "reason": "x"},
            )
        ],
        expected_seq=state.last_seq,
    )
    resumed_from: list[str | None] = []

    class Breaking(httpx.BaseTransport):
        def __init__(self) -> None:
            self.inner = httpx.HTTPTransport()
            self.broke = False

        def handle_request(self, request: httpx.Request) -> httpx.Response:
            response = self.inner.handle_request(request)
            if not request.url.path.endswith("/stream"):
                return response
            resumed_from.append(request.headers.get("last-event-id"))
            if self.broke:
                return response
            self.broke = True
            return httpx.Response(
                response.status_code, headers=response.headers, stream=_Cut(response, after=2)
            )

    with Client(live.url, live.token, transport=Breaking()) as client:
        events = list(client.stream(run_id))
    assert [e["seq"] for e in events] == [1, 2, 3, 4, 5, 6, 7]
    assert resumed_from == ["0", "2"]


class _Cut(httpx.SyncByteStream):
    """The first ``after`` events of a response, then a broken connection."""

    def __init__(self, response: httpx.Response, *, after: int) -> None:
        self.response = response
        self.after = after

    def __iter__(self) -> Any:
        buffer = b""
        for chunk in self.response.stream:  # type: ignore[union-attr]
            buffer += chunk
            frames = buffer.split(b"\n\n")
            if len(frames) > self.after:
                yield b"\n\n".join(frames[: self.after]) + b"\n\n"
                raise httpx.RemoteProtocolError("peer closed connection")
        yield buffer

    def close(self) -> None:
        self.response.close()


def test_errors_carry_the_problem_and_are_keel_errors(live: Any) -> None:
    with Client(live.url, live.token) as client:
        with pytest.raises(ApiError) as missing:
            client.get("run_nope")
        assert missing.value.status == 404 and "run_nope" in missing.value.detail
        assert isinstance(missing.value, KeelError)
        with pytest.raises(ApiError) as bad:
            client.submit("x", "relative/path")
        assert bad.value.status == 422 and "absolute" in bad.value.detail
        with pytest.raises(ApiError) as nothing:
            list(client.stream("run_nope"))
        assert nothing.value.status == 404
    with Client(live.url, "keel_" + "x" * 43) as wrong, pytest.raises(ApiError) as refused:
        wrong.get("run_nope")
    assert refused.value.status == 401
    with Client("http://127.0.0.1:9", live.token) as nowhere, pytest.raises(ConnectionFailed):
        nowhere.get("run_x")


def test_listing_pages_with_cursors_and_idempotent_submit(live: Any) -> None:
    model = script(live.workspace, [DONE])
    with Client(live.url, live.token) as client:
        made = [
            client.submit(f"goal {n}", str(live.workspace), model=model, idempotency_key=f"k{n}")
            for n in range(5)
        ]
        again = client.submit("goal 0", str(live.workspace), model=model, idempotency_key="k0")
        assert again["id"] == made[0]["id"]
        page = client.runs(limit=2)
        assert len(page["runs"]) == 2 and page["next_cursor"]
        listed = [run["id"] for run in client.iter_runs(limit=2)]
        assert sorted(listed) == sorted(run["id"] for run in made)
        assert len(listed) == 5
        mine = [run["id"] for run in client.iter_runs(creator="token:tester")]
        assert sorted(mine) == sorted(listed)


def test_tasks_graph_message_and_cancel(server: Any) -> None:
    live = server  # no worker: the queued run stays queued
    with Client(live.url, live.token) as client:
        first = client.create_task("design")
        second = client.create_task("build", blocked_by=[first["id"]])
        assert [t["id"] for t in client.tasks()] == [first["id"], second["id"]]
        assert [t["id"] for t in client.tasks(ready=True)] == [first["id"]]
        graph = client.task_graph()
        assert {"from": first["id"], "to": second["id"]} in [
            {"from": e["from"], "to": e["to"]} for e in graph["edges"]
        ]

        run_id = live.store.create_run(
            goal="g", workspace=str(live.workspace), options=RunOptions(), queued=True
        ).run_id
        client.message(run_id, "also update the changelog")
        assert any(e.type.value == "message_received" for e in iter_all_events(live.store, run_id))
        cancelled = client.cancel(run_id, "not needed")
        assert cancelled["status"] == "cancelled"
        assert live.store.load_run(run_id).status is RunStatus.CANCELLED


def test_artifact_bytes(server: Any) -> None:
    live = server
    run_id = live.store.create_run(
        goal="g", workspace=str(live.workspace), options=RunOptions()
    ).run_id
    artifact = live.store.put_artifact(run_id, "out.bin", b"\x00\x01binary")
    with Client(live.url, live.token) as client:
        assert client.artifact(run_id, artifact.id) == b"\x00\x01binary"
        with pytest.raises(ApiError) as missing:
            client.artifact(run_id, "art_nope")
        assert missing.value.status == 404


def test_async_client_streams_and_decides(live: Any) -> None:
    model = script(live.workspace, [APPEND, DONE])

    async def drive() -> tuple[str, list[int]]:
        async with AsyncClient(live.url, live.token) as client:
            run = await client.submit("append", str(live.workspace), model=model)
            seqs = [e["seq"] async for e in client.stream(run["id"], until="settled")]
            assert (await client.get(run["id"]))["status"] == "waiting"
            await client.approve(run["id"])
            seqs += [e["seq"] async for e in client.stream(run["id"], after=seqs[-1])]
            listed = [r["id"] async for r in client.iter_runs()]
            assert run["id"] in listed
            with pytest.raises(ApiError):
                await client.get("run_nope")
            return run["id"], seqs

    run_id, seqs = asyncio.run(drive())
    assert seqs == log_seqs(live.store, run_id)
    assert live.store.load_run(run_id).status is RunStatus.COMPLETED


def test_one_client_is_usable_from_threads(live: Any) -> None:
    model = script(live.workspace, [DONE])
    with Client(live.url, live.token) as client:
        ids: list[str] = []
        lock = threading.Lock()

        def submit(n: int) -> None:
            run = client.submit(f"g{n}", str(live.workspace), model=model)
            with lock:
                ids.append(run["id"])

        threads = [threading.Thread(target=submit, args=(n,)) for n in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(set(ids)) == 4
