"""``GET /runs/{id}/events/stream`` over a real uvicorn socket: every event exactly once,
resumable with ``Last-Event-ID``, keep-alives, the end of the stream, and the hub's
subscriptions freed when clients leave."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from keel.core.events import EventType, NewEvent
from keel.core.records import RunOptions
from keel.core.state import transition
from keel.core.status import RunStatus
from keel.server.event_hub import EventHub
from keel.store.base import Store, iter_all_events

STREAM = "/runs/{}/events/stream"


@dataclass(frozen=True, slots=True)
class Message:
    """One SSE message; ``comment`` is set for a ``:`` line (the rest None)."""

    id: str | None = None
    event: str | None = None
    data: str | None = None
    comment: str | None = None

    @property
    def body(self) -> dict[str, Any]:
        assert self.data is not None
        value: dict[str, Any] = json.loads(self.data)
        return value


def messages(response: httpx.Response) -> Iterator[Message]:
    """SSE messages (and comments) in the order they arrive on the socket."""
    fields: dict[str, str] = {}
    for line in response.iter_lines():
        if line.startswith(":"):
            yield Message(comment=line[1:].strip())
        elif not line:
            if fields:
                yield Message(fields.get("id"), fields.get("event"), fields.get("data"))
            fields = {}
        else:
            name, _, value = line.partition(":")
            fields[name] = value.removeprefix(" ")


def turn(*calls: dict[str, Any]) -> dict[str, Any]:
    return {"tool_calls": list(calls)}


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "arguments": arguments}


READ = turn(call("read_file", path="notes.txt"))
SLEEP = turn(call("run_command", argv=["sleep", "0.15"]))
DONE = turn(call("request_completion", summary="done"))
ALLOW_COMMANDS = '[[rule]]\naction = "allow"\ntool = "run_command"\nreason = "tests sleep"\n'


def script(workspace: Path, turns: list[dict[str, Any]], *, allow_commands: bool = False) -> str:
    (workspace / "notes.txt").write_text("hello\n")
    path = workspace / "script.json"
    path.write_text(json.dumps(turns))
    if allow_commands:
        (workspace / ".keel").mkdir(exist_ok=True)
        (workspace / ".keel" / "policy.toml").write_text(ALLOW_COMMANDS)
    return f"scripted:{path}"


def log_keys(store: Store, run_id: str) -> list[tuple[int, str]]:
    return [(e.seq, e.event_id) for e in iter_all_events(store, run_id)]


def keys(received: list[Message]) -> list[tuple[int, str]]:
    return [(m.body["seq"], m.body["event_id"]) for m in received]


def hub_of(live: Any) -> EventHub:
    """The server's hub (made by the first stream request; an idle one before that)."""
    state = live._server.config.app.state
    hub: EventHub | None = getattr(state, "event_hub", None)
    return hub if hub is not None else EventHub(live.store)


def make_run(store: Store, workspace: Path) -> str:
    return store.create_run(goal="g", workspace=str(workspace), options=RunOptions()).run_id


def note(store: Store, run_id: str, text: str) -> None:
    last = store.load_run(run_id).last_seq
    store.append_events(
        run_id, [NewEvent(type=EventType.NOTE_ADDED, data={"text": text})], expected_seq=last
    )


def status(store: Store, run_id: str, to: RunStatus, reason: str = "test") -> None:
    state = store.load_run(run_id)
    event = NewEvent(
        type=EventType.STATUS_CHANGED,
        data={"from": state.status.value, "to": to.value, "reason": reason},
    )
    store.append_events(run_id, [event], expected_seq=state.last_seq)


def test_a_submitted_run_is_streamed_to_its_end_exactly_as_logged(
    start_server: Callable[..., Any],
) -> None:
    live = start_server(workers=1)
    model = script(live.workspace, [READ, READ, DONE])
    run = live.client.post(
        "/runs", json={"goal": "read", "workspace": str(live.workspace), "model": model}
    )
    assert run.status_code == 201, run.text
    run_id = run.json()["id"]

    with live.client.stream("GET", STREAM.format(run_id)) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        received = [m for m in messages(response) if m.comment is None]

    assert keys(received) == log_keys(live.store, run_id)  # then the server closed it
    assert [m.id for m in received] == [str(m.body["seq"]) for m in received]
    assert [m.event for m in received] == [m.body["type"] for m in received]
    last = received[-1].body
    assert last["type"] == "status_changed" and last["data"]["to"] == "completed"
    assert set(last) == {"run_id", "seq", "event_id", "type", "recorded_at", "data"}


def test_a_client_that_drops_mid_run_and_resumes_gets_every_event_once(
    start_server: Callable[..., Any], poll_until: Callable[..., Any]
) -> None:
    """The run commits events all along (commands that sleep); the client drops after a
    few, reconnects with Last-Event-ID while the run goes on, and reads to the end."""
    live = start_server(workers=1)
    model = script(live.workspace, [READ, SLEEP, SLEEP, SLEEP, SLEEP, DONE], allow_commands=True)
    run_id = live.client.post(
        "/runs", json={"goal": "sleep", "workspace": str(live.workspace), "model": model}
    ).json()["id"]

    first: list[Message] = []
    with live.client.stream("GET", STREAM.format(run_id)) as response:
        for message in messages(response):
            if message.comment is None:
                first.append(message)
            if message.event == "tool_started" and message.body["data"].get("tool") == (
                "run_command"
            ):
                break  # the run is sleeping in its first command: drop the connection
    assert live.store.load_run(run_id).status is RunStatus.RUNNING
    poll_until(lambda: hub_of(live).subscriber_count(run_id) == 0)

    rest: list[Message] = []
    headers = {"Last-Event-ID": first[-1].id or ""}
    with live.client.stream("GET", STREAM.format(run_id), headers=headers) as response:
        rest = [m for m in messages(response) if m.comment is None]

    assert live.store.load_run(run_id).status is RunStatus.COMPLETED
    assert keys(first) + keys(rest) == log_keys(live.store, run_id)
    assert rest[-1].body["data"]["to"] == "completed"
    poll_until(lambda: hub_of(live).subscriber_count() == 0 and hub_of(live).watcher_count() == 0)


def test_after_query_resumes_too_and_the_header_wins(server: Any) -> None:
    run_id = make_run(server.store, server.workspace)
    for text in ("a", "b", "c"):
        note(server.store, run_id, text)
    status(server.store, run_id, RunStatus.CANCELLED, "stop")

    with server.client.stream("GET", STREAM.format(run_id) + "?after=2") as response:
        assert [m.body["seq"] for m in messages(response)] == [3, 4, 5]
    headers = {"Last-Event-ID": "4"}
    with server.client.stream("GET", STREAM.format(run_id) + "?after=1", headers=headers) as resp:
        assert [m.body["seq"] for m in messages(resp)] == [5]
    with server.client.stream("GET", STREAM.format(run_id) + "?after=5") as response:
        assert list(messages(response)) == []  # ended run, nothing after: closed at once


def test_live_events_committed_by_another_writer_reach_every_client(
    server: Any, poll_until: Callable[..., Any]
) -> None:
    """Three clients follow one run; events appended directly to the store (another
    process's commits, as far as the server knows) reach each once, in order."""
    run_id = make_run(server.store, server.workspace)  # running
    got: list[list[int]] = [[], [], []]

    def follow(index: int) -> None:
        with (
            httpx.Client(base_url=server.url, headers=server.headers, timeout=30) as client,
            client.stream("GET", STREAM.format(run_id)) as response,
        ):
            got[index] = [m.body["seq"] for m in messages(response) if m.comment is None]

    threads = [threading.Thread(target=follow, args=(i,)) for i in range(3)]
    for thread in threads:
        thread.start()
    poll_until(lambda: hub_of(server).subscriber_count(run_id) == 3)
    assert hub_of(server).watcher_count() == 1  # one reader of the store for the three
    for n in range(20):
        note(server.store, run_id, f"note {n}")
    status(server.store, run_id, RunStatus.FAILED, "done here")
    for thread in threads:
        thread.join(10)

    expected = [seq for seq, _ in log_keys(server.store, run_id)]
    assert got == [expected] * 3
    poll_until(lambda: hub_of(server).subscriber_count() == 0)


def test_keep_alive_comments_flow_while_the_run_is_quiet(
    start_server: Callable[..., Any], poll_until: Callable[..., Any]
) -> None:
    live = start_server(keepalive_seconds=0.1)
    run_id = make_run(live.store, live.workspace)
    comments = 0
    with live.client.stream("GET", STREAM.format(run_id)) as response:
        started = time.monotonic()
        for message in messages(response):
            if message.comment == "keep-alive":
                comments += 1
            if comments == 3:
                break
        assert time.monotonic() - started < 5
    poll_until(lambda: hub_of(live).subscriber_count() == 0)


def test_until_settled_ends_at_waiting_and_default_goes_on(
    server: Any, poll_until: Callable[..., Any]
) -> None:
    run_id = make_run(server.store, server.workspace)  # running
    status(server.store, run_id, RunStatus.PAUSED, "paused by test")
    url = STREAM.format(run_id)
    with server.client.stream("GET", url + "?until=settled") as response:
        seqs = [m.body["seq"] for m in messages(response)]
    assert seqs == [1, 2]  # ended: the run stays paused until someone acts

    with server.client.stream("GET", url + "?after=2&until=terminal") as response:
        stream = messages(response)
        poll_until(lambda: hub_of(server).subscriber_count(run_id) == 1)
        status(server.store, run_id, RunStatus.RUNNING)
        status(server.store, run_id, RunStatus.FAILED, "finished")
        assert [m.body["data"]["to"] for m in stream] == ["running", "failed"]


def test_a_client_that_disconnects_frees_its_subscription(
    server: Any, poll_until: Callable[..., Any]
) -> None:
    run_id = make_run(server.store, server.workspace)
    clients = [httpx.Client(base_url=server.url, headers=server.headers) for _ in range(5)]
    responses = [
        c.send(c.build_request("GET", STREAM.format(run_id)), stream=True) for c in clients
    ]
    poll_until(lambda: hub_of(server).subscriber_count(run_id) == 5)
    for response, client in zip(responses, clients, strict=True):
        response.close()
        client.close()
    poll_until(lambda: hub_of(server).subscriber_count() == 0)
    poll_until(lambda: hub_of(server).watcher_count() == 0)


def test_unknown_run_and_bad_resume_points_are_refused(server: Any) -> None:
    missing = server.client.get(STREAM.format("run_nope"))
    assert missing.status_code == 404
    assert missing.headers["content-type"] == "application/problem+json"
    assert "run_nope" in missing.json()["detail"]

    run_id = make_run(server.store, server.workspace)
    for query in ("?after=-1", "?after=x", "?until=forever"):
        bad = server.client.get(STREAM.format(run_id) + query)
        assert bad.status_code == 422, query
    for query in (f"?after={2**63}", f"?after={'9' * 5000}"):  # past any BIGINT
        bad = server.client.get(STREAM.format(run_id) + query)
        assert bad.status_code == 422, query
        page = server.client.get(f"/runs/{run_id}/events" + query)
        assert page.status_code == 422, query
    # Header bytes as a client sends them: non-ASCII digits arrive as UTF-8 (or Latin-1).
    for header in (
        b"abc",
        "²".encode(),
        "١٢".encode(),
        b"\xb2",
        b"-1",
        b"1.5",
        str(2**63).encode(),
        b"9" * 5000,
    ):
        bad_id = server.client.get(STREAM.format(run_id), headers={"Last-Event-ID": header})
        assert bad_id.status_code == 422, header
        assert "Last-Event-ID" in bad_id.json()["detail"]
    ended = make_run(server.store, server.workspace)
    state = server.store.load_run(ended)
    server.store.append_events(
        ended, [transition(state, RunStatus.CANCELLED, "done")], expected_seq=state.last_seq
    )
    top = server.client.get(STREAM.format(ended), headers={"Last-Event-ID": str(2**63 - 1)})
    assert top.status_code == 200 and top.text == ""  # the largest seq: nothing after it
    assert server.anon.get(STREAM.format(run_id)).status_code == 401
    assert hub_of(server).subscriber_count() == 0


@pytest.mark.parametrize("limit", [1, 4])
def test_hub_closes_a_subscriber_that_lags_instead_of_queueing_without_bound(
    server: Any, limit: int
) -> None:
    """A client too far behind is cut off (memory stays bounded), not waited for; its
    stream ends and the client resumes from the store with Last-Event-ID."""
    run_id = make_run(server.store, server.workspace)  # running
    hub = EventHub(server.store, queue_limit=limit)

    async def lagging() -> str | None:
        subscription = hub.subscribe(run_id, after=2)
        for n in range(limit + 3):
            note(server.store, run_id, f"n{n}")
        deadline = time.monotonic() + 5
        while subscription.closed is None and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        hub.unsubscribe(subscription)
        return subscription.closed

    closed = asyncio.run(lagging())
    assert closed is not None and "behind" in closed
    assert hub.overflows == 1 and hub.subscriber_count() == 0
    hub.close()
