"""The API steering a run that a separate ``keel worker`` process executes.

A real uvicorn with no embedded slots, a real ``keel worker`` subprocess on the same
SQLite file, and a ``FakeProvider`` on 127.0.0.1 standing in for the model (only its
answers are scripted). What crosses processes is the store alone: an approval posted
to the API must unblock the run in the worker, a message must reach the model's next
request there, and a client following the stream must see every event once.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from live_server import LiveServer, ServerFactory

from keel.client import Client
from keel.core.events import EventType
from keel.store.base import iter_all_events
from keel.testing import FakeProvider

Poll = Callable[..., Any]
KEEL = [sys.executable, "-m", "keel.cli.app"]


@contextmanager
def worker_process(server: LiveServer, provider: FakeProvider) -> Iterator[subprocess.Popen[str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KEEL_")}
    env.update(
        {
            "OPENAI_API_KEY": "sk-test",
            "OPENAI_BASE_URL": provider.base_url,
            "KEEL_LEASE_TTL": "5",
            "KEEL_AGENT_ID": "worker-host",
        }
    )
    proc = subprocess.Popen(
        [*KEEL, "worker", "--poll", "0.1", "--store", server.store_url],
        cwd=server.workspace.parent,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        assert "Traceback" not in err, err


def user_texts(body: dict[str, Any]) -> list[str]:
    return [str(m.get("content")) for m in body["messages"] if m["role"] == "user"]


def test_an_api_approval_and_message_steer_a_run_in_another_worker_process(
    start_server: ServerFactory, poll_until: Poll
) -> None:
    server = start_server(workers=0)
    with FakeProvider() as provider, worker_process(server, provider) as worker:
        provider.reply(tool_calls=[("write_file", {"path": "a.txt", "content": "a\n"})])
        provider.reply(tool_calls=[("read_file", {"path": "a.txt"})], delay=2.0)
        provider.reply(tool_calls=[("request_completion", {"summary": "wrote a.txt"})])
        submitted = server.client.post(
            "/runs",
            json={
                "goal": "write a.txt",
                "workspace": str(server.workspace),
                "model": "openai:fake-model",
                "mode": "ask",
            },
        )
        assert submitted.status_code == 201, submitted.text
        run_id = submitted.json()["id"]

        seen: list[dict[str, Any]] = []
        with Client(server.url, server.token) as api:
            follower = threading.Thread(target=lambda: seen.extend(api.stream(run_id)))
            follower.start()

            waiting = poll_until(
                lambda: (v := api.get(run_id))["status"] == "waiting" and v, timeout=30
            )
            assert waiting["pending"]["tool"] == "write_file"
            assert not (server.workspace / "a.txt").exists()  # nothing ran unapproved
            assert server.store.current_run_lease(run_id) is None  # the worker let it go

            api.approve(run_id, waiting["pending"]["digest"])
            poll_until(lambda: len(provider.requests) == 2, timeout=30)
            # The worker process is waiting for the model's second answer right now.
            told = api.message(run_id, "keep the file short")
            assert told["follow_up"] is None

            poll_until(lambda: api.get(run_id)["status"] == "completed", timeout=30)
            follower.join(timeout=30)
            assert not follower.is_alive()
        assert worker.poll() is None  # the worker did it all and is still serving

    assert (server.workspace / "a.txt").read_text() == "a\n"
    logged = list(iter_all_events(server.store, run_id))
    assert [e["seq"] for e in seen] == [e.seq for e in logged]  # every event, once, in order
    [granted] = [e.data for e in logged if e.type is EventType.APPROVAL_GRANTED]
    assert granted["by"] == "token:tester"
    resumed_by = {e.data.get("owner") for e in logged if e.type is EventType.RUN_RESUMED}
    assert resumed_by and all(str(o).startswith("worker-host") for o in resumed_by)
    first, second, third = provider.requests
    wanted = "[message from token:tester] keep the file short"
    assert wanted not in user_texts(first) + user_texts(second)
    assert wanted in user_texts(third)  # the model's next turn after the message
    assert provider.violations == []
