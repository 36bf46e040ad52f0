"""Two ``keel serve`` processes on one PostgreSQL database: an event committed through
one replica reaches an SSE client of the other (LISTEN/NOTIFY wakes its hub)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from keel.client import Client
from keel.core.records import RunOptions
from keel.store.base import Store, iter_all_events
from keel.store.url import open_store

pytestmark = pytest.mark.postgres


@pytest.fixture
def pg_store(postgres_url: str) -> Iterator[Store]:
    store = open_store(postgres_url)
    try:
        yield store
    finally:
        store.close()


def test_an_event_committed_through_one_replica_reaches_a_stream_of_the_other(
    postgres_url: str,
    pg_store: Store,
    serve_process: Callable[..., Any],
    token_maker: Callable[[Store, str], str],
    tmp_path: Any,
) -> None:
    token = token_maker(pg_store, "replicas")
    first = serve_process(postgres_url, token=token)
    second = serve_process(postgres_url, token=token)
    run_id = pg_store.create_run(goal="g", workspace=str(tmp_path), options=RunOptions()).run_id

    received: list[dict[str, Any]] = []
    arrived: dict[str, float] = {}
    subscribed = threading.Event()

    def follow() -> None:
        with Client(second.url, token) as client:
            for event in client.stream(run_id):
                received.append(event)
                arrived[event["type"]] = time.monotonic()
                if event["seq"] == 1:
                    subscribed.set()

    reader = threading.Thread(target=follow)
    reader.start()
    # It subscribes before it reads the backlog: from here on nothing can slip between.
    assert subscribed.wait(20), "the stream of replica 2 sent no backlog"

    with Client(first.url, token) as client:
        sent = time.monotonic()
        client.message(run_id, "please also check the docs")
        client.cancel(run_id, "enough")
    reader.join(20)
    assert not reader.is_alive(), "the stream of replica 2 did not end at the cancel"

    stored = [(e.seq, e.event_id) for e in iter_all_events(pg_store, run_id)]
    assert [(e["seq"], e["event_id"]) for e in received] == stored
    types = [e["type"] for e in received]
    assert "message_received" in types
    assert received[-1]["data"]["to"] == "cancelled"
    assert arrived["message_received"] - sent < 2.0

    # and an event appended straight to the store (a worker elsewhere) reaches replica 1
    other = pg_store.create_run(goal="h", workspace=str(tmp_path), options=RunOptions()).run_id
    headers = {"Authorization": f"Bearer {token}"}
    with (
        httpx.Client(base_url=first.url, headers=headers) as http,
        http.stream("GET", f"/runs/{other}/events/stream") as response,
    ):
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("id:")) == "id: 1"
        with Client(second.url, token) as client:
            client.cancel(other, "from replica 2")
        ids = [line for line in lines if line.startswith("id:")]
    assert ids == ["id: 2"]
